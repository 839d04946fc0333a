package otlp

import (
	"compress/gzip"
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"sync/atomic"
	"testing"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"
	collectorpb "go.opentelemetry.io/proto/slim/otlp/collector/trace/v1"
	commonpb "go.opentelemetry.io/proto/slim/otlp/common/v1"
	tracepb "go.opentelemetry.io/proto/slim/otlp/trace/v1"
	"google.golang.org/protobuf/proto"
)

// TestOTLPExporter: the exporter takes its headers and compression from the
// environment, repeats an export the collector answered 503, and sends the
// spans with their parent, kind, status and attributes.
func TestOTLPExporter(t *testing.T) {
	var calls atomic.Int32
	got := make(chan *collectorpb.ExportTraceServiceRequest, 1)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if calls.Add(1) == 1 {
			w.Header().Set("Retry-After", "0")
			http.Error(w, "busy", http.StatusServiceUnavailable)
			return
		}
		if h := r.Header.Get("Authorization"); h != "Bearer a b" {
			t.Errorf("Authorization: got %q, want %q", h, "Bearer a b")
		}
		if ct := r.Header.Get("Content-Type"); ct != "application/x-protobuf" {
			t.Errorf("Content-Type: got %q, want application/x-protobuf", ct)
		}
		zr, err := gzip.NewReader(r.Body)
		if err != nil {
			t.Errorf("body not gzip: %v", err)
			return
		}
		body, _ := io.ReadAll(zr)
		var req collectorpb.ExportTraceServiceRequest
		if err := proto.Unmarshal(body, &req); err != nil {
			t.Errorf("decoding the export: %v", err)
		}
		got <- &req
	}))
	t.Cleanup(srv.Close)
	env := map[string]string{
		"OTEL_EXPORTER_OTLP_HEADERS":            "Authorization=Bearer%20a%20b",
		"OTEL_EXPORTER_OTLP_TRACES_COMPRESSION": "gzip",
	}
	exp, err := New(srv.URL+"/v1/traces", func(k string) string { return env[k] }, "idem/test")
	if err != nil {
		t.Fatal(err)
	}

	rec := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec))
	tr := tp.Tracer("test")
	ctx, parent := tr.Start(context.Background(), "parent", trace.WithSpanKind(trace.SpanKindServer))
	_, child := tr.Start(ctx, "child", trace.WithSpanKind(trace.SpanKindClient))
	child.SetAttributes(attribute.String("idem.outcome", "acquired"), attribute.Int("http.response.status_code", 201))
	child.SetStatus(codes.Error, "boom")
	child.End()
	parent.End()
	if err := exp.ExportSpans(t.Context(), rec.Ended()); err != nil {
		t.Fatalf("ExportSpans: %v", err)
	}
	if n := calls.Load(); n != 2 {
		t.Errorf("collector calls: got %d, want 2 (a 503, then the export again)", n)
	}
	req := <-got
	var spans []*tracepb.Span
	for _, rs := range req.ResourceSpans {
		for _, ss := range rs.ScopeSpans {
			if ss.Scope.GetName() != "test" {
				t.Errorf("scope: got %q, want test", ss.Scope.GetName())
			}
			spans = append(spans, ss.Spans...)
		}
	}
	if len(spans) != 2 {
		t.Fatalf("got %d spans, want 2", len(spans))
	}
	c, p := spans[0], spans[1]
	if c.Name != "child" || p.Name != "parent" {
		t.Fatalf("got spans %q and %q, want child and parent", c.Name, p.Name)
	}
	if string(c.ParentSpanId) != string(p.SpanId) || string(c.TraceId) != string(p.TraceId) || len(p.ParentSpanId) != 0 {
		t.Error("child's parent or trace is not the parent span's")
	}
	if c.Kind != tracepb.Span_SPAN_KIND_CLIENT || p.Kind != tracepb.Span_SPAN_KIND_SERVER {
		t.Errorf("kinds: got %v and %v, want client and server", c.Kind, p.Kind)
	}
	if c.Status.GetCode() != tracepb.Status_STATUS_CODE_ERROR || c.Status.GetMessage() != "boom" {
		t.Errorf("child status: got %v, want error boom", c.Status)
	}
	if v := spanAttr(c, "idem.outcome").GetStringValue(); v != "acquired" {
		t.Errorf("idem.outcome: got %q, want acquired", v)
	}
	if v := spanAttr(c, "http.response.status_code").GetIntValue(); v != 201 {
		t.Errorf("status code attribute: got %d, want 201", v)
	}
	if c.StartTimeUnixNano == 0 || c.EndTimeUnixNano < c.StartTimeUnixNano {
		t.Errorf("child times: got %d to %d", c.StartTimeUnixNano, c.EndTimeUnixNano)
	}
}

// TestOTLPExporterConfig: bad environment values are refused.
func TestOTLPExporterConfig(t *testing.T) {
	for _, env := range []map[string]string{
		{"OTEL_EXPORTER_OTLP_TIMEOUT": "soon"},
		{"OTEL_EXPORTER_OTLP_COMPRESSION": "zstd"},
		{"OTEL_EXPORTER_OTLP_HEADERS": "novalue"},
		{"OTEL_EXPORTER_OTLP_CERTIFICATE": "/nonexistent/ca.pem"},
		{"OTEL_EXPORTER_OTLP_CLIENT_KEY": "/nonexistent/key.pem"},
	} {
		if _, err := New("http://127.0.0.1:4318/v1/traces", func(k string) string { return env[k] }, "idem/test"); err == nil {
			t.Errorf("%v: got no error, want one", env)
		}
	}
}

// spanAttr returns the value of the attribute key of s, nil if it has none.
func spanAttr(s *tracepb.Span, key string) *commonpb.AnyValue {
	for _, kv := range s.Attributes {
		if kv.Key == key {
			return kv.GetValue()
		}
	}
	return nil
}
