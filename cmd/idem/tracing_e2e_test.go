package main

import (
	"encoding/hex"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	collectortrace "go.opentelemetry.io/proto/slim/otlp/collector/trace/v1"
	commonpb "go.opentelemetry.io/proto/slim/otlp/common/v1"
	tracepb "go.opentelemetry.io/proto/slim/otlp/trace/v1"
	"google.golang.org/protobuf/proto"
)

// collector is a fake OTLP/HTTP collector: it keeps the spans posted to
// /v1/traces.
type collector struct {
	mu      sync.Mutex
	exports int
	spans   []*tracepb.Span
	service []string // service.name of each resource
	srv     *httptest.Server
}

func newCollector(t *testing.T) *collector {
	t.Helper()
	c := &collector{}
	c.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method != http.MethodPost || r.URL.Path != "/v1/traces" {
			http.Error(w, "want POST /v1/traces", http.StatusNotFound)
			return
		}
		body, err := io.ReadAll(r.Body)
		if err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		var req collectortrace.ExportTraceServiceRequest
		if err := proto.Unmarshal(body, &req); err != nil {
			t.Errorf("collector: decoding an export (Content-Type %q): %v", r.Header.Get("Content-Type"), err)
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		c.mu.Lock()
		c.exports++
		for _, rs := range req.ResourceSpans {
			for _, kv := range rs.GetResource().GetAttributes() {
				if kv.Key == "service.name" {
					c.service = append(c.service, kv.GetValue().GetStringValue())
				}
			}
			for _, ss := range rs.ScopeSpans {
				c.spans = append(c.spans, ss.Spans...)
			}
		}
		c.mu.Unlock()
		out, _ := proto.Marshal(&collectortrace.ExportTraceServiceResponse{})
		w.Header().Set("Content-Type", "application/x-protobuf")
		w.Write(out)
	}))
	t.Cleanup(c.srv.Close)
	return c
}

func (c *collector) received() ([]*tracepb.Span, []string, int) {
	c.mu.Lock()
	defer c.mu.Unlock()
	return append([]*tracepb.Span(nil), c.spans...), append([]string(nil), c.service...), c.exports
}

// spanAttr returns the value of a span's attribute, nil if it has none.
func spanAttr(s *tracepb.Span, key string) *commonpb.AnyValue {
	for _, kv := range s.Attributes {
		if kv.Key == key {
			return kv.GetValue()
		}
	}
	return nil
}

// TestTracing runs the proxy with --otel-endpoint against a fake collector:
// the proxy's server spans and the store's client spans reach it (flushed
// at exit), in the client's trace, and the upstream gets a traceparent.
func TestTracing(t *testing.T) {
	t.Parallel()
	coll := newCollector(t)
	parents := make(chan string, 10)
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		parents <- r.Header.Get("Traceparent")
		w.WriteHeader(http.StatusCreated)
		io.WriteString(w, "done")
	}))
	t.Cleanup(up.Close)

	p := startProxy(t, up.URL, []string{"--data", t.TempDir()},
		"--otel-endpoint", coll.srv.URL, "--otel-service-name", "idem-test")

	const traceID = "4bf92f3577b34da6a3ce929d0e0e4736"
	const clientSpan = "00f067aa0ba902b7"
	first := post(t, p.url("/payments"), "trace-key-1", "x", "Traceparent", "00-"+traceID+"-"+clientSpan+"-01")
	second := post(t, p.url("/payments"), "trace-key-1", "x")
	if first.status != 201 || second.status != 201 || !second.replayed() {
		t.Fatalf("got %d and %d replayed=%v, want 201 then 201 replayed", first.status, second.status, second.replayed())
	}
	if got := send(t, http.MethodGet, p.url("/status"), "", ""); got.status != 201 {
		t.Fatalf("GET: got %d, want 201", got.status)
	}

	// The upstream saw the proxy's span as the parent: the client's trace,
	// another span.
	var upstreamParents []string
	for range 2 {
		select {
		case tp := <-parents:
			upstreamParents = append(upstreamParents, tp)
		case <-time.After(5 * time.Second):
			t.Fatal("the upstream got fewer than 2 requests")
		}
	}
	for _, tp := range upstreamParents {
		if parts := strings.Split(tp, "-"); len(parts) != 4 || len(parts[1]) != 32 || len(parts[2]) != 16 {
			t.Errorf("upstream traceparent: got %q, want a W3C traceparent", tp)
		}
	}
	if tp := upstreamParents[0]; !strings.HasPrefix(tp, "00-"+traceID+"-") || strings.Contains(tp, clientSpan) {
		t.Errorf("upstream traceparent of the first request: got %q, want trace %s with the proxy's span as parent", tp, traceID)
	}

	// SIGTERM: the spans still buffered are flushed before the exit.
	p.terminate()
	if code := p.wait(); code != 0 {
		t.Fatalf("proxy exit code: got %d, want 0", code)
	}
	spans, services, exports := coll.received()
	if exports == 0 {
		t.Fatal("the collector got no export")
	}
	for _, s := range services {
		if s != "idem-test" {
			t.Errorf("service.name: got %q, want idem-test", s)
		}
	}
	byName := make(map[string][]*tracepb.Span)
	var names []string
	for _, s := range spans {
		byName[s.Name] = append(byName[s.Name], s)
		names = append(names, s.Name)
	}
	for _, want := range []string{"idem.proxy POST", "idem.proxy GET", "idem.acquire", "idem.complete"} {
		if len(byName[want]) == 0 {
			t.Errorf("no span %q among %q", want, names)
		}
	}
	if t.Failed() {
		return
	}

	// The first POST: its server span is in the client's trace, and the
	// store's spans are its children.
	var root *tracepb.Span
	outcomes := map[string]bool{}
	for _, s := range byName["idem.proxy POST"] {
		o := spanAttr(s, "idem.outcome").GetStringValue()
		outcomes[o] = true
		if got := hex.EncodeToString(s.TraceId); got == traceID {
			root = s
			if got := hex.EncodeToString(s.ParentSpanId); got != clientSpan {
				t.Errorf("proxy span parent: got %s, want the client's %s", got, clientSpan)
			}
			if s.Kind != tracepb.Span_SPAN_KIND_SERVER {
				t.Errorf("proxy span kind: got %v, want server", s.Kind)
			}
			if st := spanAttr(s, "http.response.status_code").GetIntValue(); st != 201 {
				t.Errorf("proxy span status code: got %d, want 201", st)
			}
		}
	}
	if !outcomes["executed"] || !outcomes["replayed"] {
		t.Errorf("proxy span outcomes: got %v, want executed and replayed", outcomes)
	}
	if o := spanAttr(byName["idem.proxy GET"][0], "idem.outcome").GetStringValue(); o != "passthrough" {
		t.Errorf("GET span outcome: got %q, want passthrough", o)
	}
	if root == nil {
		t.Fatalf("no proxy span in the client's trace %s", traceID)
	}
	if want := hex.EncodeToString(root.SpanId); !strings.Contains(upstreamParents[0], "-"+want+"-") {
		t.Errorf("upstream traceparent: got %q, want the proxy span %s as parent", upstreamParents[0], want)
	}
	var acquired bool
	for _, s := range byName["idem.acquire"] {
		digest := spanAttr(s, "idem.key_digest").GetStringValue()
		if digest == "" || strings.Contains(digest, "trace-key-1") {
			t.Errorf("acquire span key digest: got %q, want a digest, not the raw key", digest)
		}
		if s.Kind != tracepb.Span_SPAN_KIND_CLIENT {
			t.Errorf("acquire span kind: got %v, want client", s.Kind)
		}
		if spanAttr(s, "idem.outcome").GetStringValue() == "acquired" {
			acquired = true
			if string(s.TraceId) != string(root.TraceId) || string(s.ParentSpanId) != string(root.SpanId) {
				t.Errorf("acquire span: got trace %s parent %s, want the proxy span's child", hex.EncodeToString(s.TraceId), hex.EncodeToString(s.ParentSpanId))
			}
		}
	}
	if !acquired {
		t.Error("no idem.acquire span with outcome acquired")
	}
}
