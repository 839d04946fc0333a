package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"strconv"
	"sync"
	"time"

	"github.com/idemgo/idem/cmd/idem/internal/cli"
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
				srv := &http.Server{Handler: newDemoAPI(log), ReadHeaderTimeout: 10 * time.Second}
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

// demoExecution is one execution of the toy API.
type demoExecution struct {
	Execution int    `json:"execution"`
	Method    string `json:"method"`
	Path      string `json:"path"`
	Body      string `json:"body"`
	At        string `json:"at"`
}

func newDemoAPI(log *slog.Logger) http.Handler {
	var mu sync.Mutex
	var done []demoExecution
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		enc := json.NewEncoder(w)
		enc.SetIndent("", "  ")
		switch r.Method {
		case http.MethodGet, http.MethodHead:
			mu.Lock()
			list := append([]demoExecution{}, done...)
			mu.Unlock()
			enc.Encode(map[string]any{"executions": list})
			return
		case http.MethodPost, http.MethodPut, http.MethodPatch:
		default:
			w.WriteHeader(http.StatusMethodNotAllowed)
			enc.Encode(map[string]string{"error": "method not allowed"})
			return
		}
		body, _ := io.ReadAll(io.LimitReader(r.Body, 64<<10))
		if s := r.URL.Query().Get("sleep"); s != "" {
			if d, err := time.ParseDuration(s); err == nil && d > 0 && d <= time.Minute {
				log.Info("sleeping", "for", d.String(), "method", r.Method, "path", r.URL.Path)
				time.Sleep(d)
			}
		}
		mu.Lock()
		ex := demoExecution{Execution: len(done) + 1, Method: r.Method, Path: r.URL.Path, Body: string(body), At: time.Now().UTC().Format(time.RFC3339Nano)}
		done = append(done, ex)
		mu.Unlock()
		log.Info("executed", "execution", ex.Execution, "method", r.Method, "path", r.URL.Path)
		w.Header().Set("Location", r.URL.Path+"/"+strconv.Itoa(ex.Execution))
		w.WriteHeader(http.StatusCreated)
		enc.Encode(ex)
	})
}
