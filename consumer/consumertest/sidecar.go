package consumertest

import (
	"context"
	"io"
	"maps"
	"net/http"
	"net/http/httptest"
	"strconv"
	"testing"

	"github.com/idemgo/idem"
	"github.com/idemgo/idem/consumer"
	"github.com/idemgo/idem/consumer/sidecar"
)

// sidecarInapplicable are the cases that do not apply to the sidecar, with
// the reason. The other cases run against it unchanged.
var sidecarInapplicable = map[string]string{
	// The handler runs in another process: a panic there is that
	// process's failed answer (net/http closes the connection), a retry
	// that HandlerErrorRedeliveredThenDeadLettered checks; the consumer
	// never sees it as a panic (Stats.Panics).
	"PanicIsAnError": "a panic is in the handler's process, not the consumer's",
	// The consumer's handler is sidecar.Handler.Call, which returns once
	// its context is cancelled (the request's connection is closed) even
	// when the HTTP handler ignores the cancellation: the consumer never
	// abandons a call (Stats.Abandoned), and the late answer of the HTTP
	// handler reaches no one. ShutdownFinishesOrReleasesInFlight checks
	// that the message of the cancelled call is delivered again.
	"StuckHandlerAbandonedAtShutdown": "sidecar.Handler.Call honours its context, so no call is abandoned",
}

// RunSidecar runs the suite against the sidecar (package
// consumer/sidecar, the core of `idem consume`) on the adapter of
// newHarness: each Start of the adapter's harness gets sidecar.Handler.Call
// as its handler, which POSTs the message to an HTTP server on loopback
// whose handler is the suite's, with the key of the request's
// Idempotency-Key header, its body as the payload and its
// Idempotency-Fence header as the fence (fenceFrom). The cases of
// sidecarInapplicable do not run.
func RunSidecar(t *testing.T, newHarness func(t *testing.T) Harness) {
	run(t, func(t *testing.T) Harness { return &sidecarHarness{Harness: newHarness(t)} }, sidecarInapplicable)
}

// RunExternal runs the suite against a consumer whose handler is reached
// over HTTP, as the `idem consume` binary's: newHarness's Start must POST
// each message to the handler that SidecarServer serves, as
// sidecar.Handler does, and apply the suite's options (a consumer.Config)
// as the consumer's settings. Neither the cases of sidecarInapplicable
// nor those of inapplicable (by name; the value is the reason) run.
func RunExternal(t *testing.T, newHarness func(t *testing.T) Harness, inapplicable map[string]string) {
	skip := maps.Clone(sidecarInapplicable)
	maps.Copy(skip, inapplicable)
	run(t, newHarness, skip)
}

// sidecarHarness is an adapter's harness whose handler is the sidecar's.
type sidecarHarness struct{ Harness }

func (s *sidecarHarness) Start(t *testing.T, opts []consumer.Option, h Handler) (func() consumer.Stats, func()) {
	sh := &sidecar.Handler{URL: SidecarServer(t, h)}
	if err := sh.Check(); err != nil {
		t.Fatal(err)
	}
	return s.Harness.Start(t, opts, func(ctx context.Context, key string, payload []byte) error {
		return sh.Call(ctx, sidecar.Delivery{Key: key, Body: payload})
	})
}

// SidecarServer serves h over HTTP on loopback, as a handler of `idem
// consume` is, until the test ends, and returns its URL: h gets the
// request's context, its Idempotency-Key header as the key (with its
// Idempotency-Fence header as the fence of fenceFrom) and its body as the
// payload; its nil error answers 200, another 500.
func SidecarServer(t *testing.T, h Handler) string {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, err := io.ReadAll(r.Body)
		if err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		ctx := r.Context()
		if f, err := strconv.ParseInt(r.Header.Get(sidecar.HeaderFence), 10, 64); err == nil {
			ctx = context.WithValue(ctx, fenceKey{}, f)
		}
		if err := h(ctx, r.Header.Get(sidecar.HeaderKey), body); err != nil {
			http.Error(w, err.Error(), http.StatusInternalServerError)
			return
		}
		w.WriteHeader(http.StatusOK)
	}))
	t.Cleanup(srv.Close)
	return srv.URL
}

type fenceKey struct{}

// fenceFrom returns the fence of the handler's run: the key's fence in
// ctx (idem.FenceFrom) for a handler in the consumer's process, or the
// one of the request's Idempotency-Fence header (SidecarServer).
func fenceFrom(ctx context.Context) (int64, bool) {
	if f, ok := idem.FenceFrom(ctx); ok {
		return f, true
	}
	f, ok := ctx.Value(fenceKey{}).(int64)
	return f, ok
}
