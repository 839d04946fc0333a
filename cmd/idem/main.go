// Command idem puts idempotency in front of any HTTP API: a reverse proxy
// that runs each POST or PATCH request at most once per Idempotency-Key and
// replays the first response to retries, with admin commands to inspect
// and repair its records. See `idem help`.
//
//	idem upstream-demo --listen 127.0.0.1:9000 &
//	idem proxy --listen 127.0.0.1:8080 --upstream http://127.0.0.1:9000
//	curl -i -X POST localhost:8080/payments -H 'Idempotency-Key: k1' -d '{"amount":100}'
//
// Records live in an embedded store on local disk (--data, the default) or
// in Redis (--redis, --redis-cluster), which several proxies can share.
package main

import (
	"context"
	"os"
	"os/signal"
	"syscall"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, os.Interrupt)
	go func() {
		// After the first signal, restore the default handling: a second
		// one ends the process at once.
		<-ctx.Done()
		stop()
	}()
	stopProfile := startProfile(os.Getenv, os.Stderr)
	code := run(ctx, os.Args[1:], os.Stdout, os.Stderr, os.Getenv)
	stopProfile()
	stop()
	os.Exit(code)
}
