package otelidem_test

import (
	"context"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"testing"

	"github.com/idemgo/idem"
	"github.com/idemgo/idem/idemproxy"
	"github.com/idemgo/idem/memstore"
	"github.com/idemgo/idem/otelidem"
	"go.opentelemetry.io/otel/propagation"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"
)

// TestProxyTracer: a Proxy wired to a ProxyTracer gives each request a
// server span in the client's trace, with its outcome and status; the
// store's spans are its children and the upstream gets it as its parent.
func TestProxyTracer(t *testing.T) {
	parents := make(chan string, 4)
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		parents <- r.Header.Get("Traceparent")
		w.WriteHeader(http.StatusCreated)
	}))
	t.Cleanup(up.Close)
	rec := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec))
	t.Cleanup(func() { _ = tp.Shutdown(context.Background()) })
	ms, err := memstore.New()
	if err != nil {
		t.Fatal(err)
	}
	exec, err := idem.New(otelidem.Store(ms, otelidem.WithTracerProvider(tp)))
	if err != nil {
		t.Fatal(err)
	}
	target, _ := url.Parse(up.URL)
	tr := otelidem.NewProxyTracer(otelidem.WithTracerProvider(tp), otelidem.WithPropagator(propagation.TraceContext{}))
	p := &idemproxy.Proxy{Target: target, Executor: exec, Rewrite: tr.Rewrite, Observer: tr.Observe}
	srv := httptest.NewServer(tr.Handler(p))
	t.Cleanup(srv.Close)

	const traceID, clientSpan = "4bf92f3577b34da6a3ce929d0e0e4736", "00f067aa0ba902b7"
	for _, method := range []string{http.MethodPost, http.MethodGet} {
		req, _ := http.NewRequestWithContext(t.Context(), method, srv.URL+"/payments", strings.NewReader("x"))
		req.Header.Set("Idempotency-Key", "k")
		req.Header.Set("Traceparent", "00-"+traceID+"-"+clientSpan+"-01")
		res, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		res.Body.Close()
	}

	var servers []sdktrace.ReadOnlySpan
	var acquire sdktrace.ReadOnlySpan
	for _, s := range rec.Ended() {
		switch s.Name() {
		case otelidem.SpanProxy + " POST", otelidem.SpanProxy + " GET":
			servers = append(servers, s)
		case otelidem.SpanAcquire:
			acquire = s
		}
	}
	if len(servers) != 2 || acquire == nil {
		t.Fatalf("got server spans %d and acquire %v, want 2 and one", len(servers), acquire)
	}
	for i, want := range []string{"executed", "passthrough"} {
		s := servers[i]
		a := attrs(s)
		if s.SpanKind() != trace.SpanKindServer || a[otelidem.KeyOutcome].AsString() != want || a["http.response.status_code"].AsInt64() != 201 {
			t.Errorf("span %s: got kind %v attributes %v, want server, outcome %s, status 201", s.Name(), s.SpanKind(), a, want)
		}
		if s.Parent().SpanID().String() != clientSpan || s.SpanContext().TraceID().String() != traceID {
			t.Errorf("span %s: got parent %s in trace %s, want the client's", s.Name(), s.Parent().SpanID(), s.SpanContext().TraceID())
		}
		if tp := <-parents; !strings.Contains(tp, s.SpanContext().SpanID().String()) {
			t.Errorf("upstream traceparent: got %q, want the span %s as its parent", tp, s.SpanContext().SpanID())
		}
	}
	if acquire.Parent().SpanID() != servers[0].SpanContext().SpanID() {
		t.Errorf("acquire span: got parent %s, want the server span %s", acquire.Parent().SpanID(), servers[0].SpanContext().SpanID())
	}
}
