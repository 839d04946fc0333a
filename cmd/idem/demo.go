package main

import (
	"context"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"time"

	"github.com/idemgo/idem/cmd/idem/internal/cli"
	"github.com/idemgo/idem/cmd/idem/internal/demoapi"
)

func upstreamDemoCommand() *command {
	return &command{
		name:    "upstream-demo",
		args:    "[flags]",
		summary: "run a toy API to try the proxy with (it is not idempotent)",
		doc: `
Runs a small HTTP API that is not idempotent, to put the proxy in front of:
every POST, PUT or PATCH creates a new numbered "execution" and answers 201
with it as JSON, and logs it. GET / lists the executions. A request with
?sleep=2s takes that long to answer, to try concurrent retries (409) and
timeouts.

  idem upstream-demo --listen 127.0.0.1:9000 &
  idem proxy --upstream http://127.0.0.1:9000 &
  curl -si -X POST localhost:8080/payments -H 'Idempotency-Key: k1' -d '{"amount":100}'

Run the curl command twice: the second answer is the first one again, with
Idempotent-Replayed: true, and the demo logged one execution.`,
		flags: func(fs *cli.Set) func(context.Context, *env, []string) error {
			listen := "127.0.0.1:9000"
			fs.String(&listen, "listen", "ADDR", listen, "address the toy API serves on")
			return func(ctx context.Context, e *env, args []string) error {
				if len(args) > 0 {
					return cli.Usagef("upstream-demo: unexpected argument %q", args[0])
				}
				ln, err := net.Listen("tcp", listen)
				if err != nil {
					return fmt.Errorf("cannot listen on %s: %v", listen, cli.Cause(err))
				}
				log := slog.New(slog.NewTextHandler(e.stderr, nil))
				srv := &http.Server{Handler: demoapi.New(log), ReadHeaderTimeout: 10 * time.Second}
				log.Info("idem upstream-demo listening", "addr", ln.Addr().String())
				go func() {
					<-ctx.Done()
					sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
					defer cancel()
					srv.Shutdown(sctx)
				}()
				if err := srv.Serve(ln); err != http.ErrServerClosed {
					return err
				}
				return nil
			}
		},
	}
}
