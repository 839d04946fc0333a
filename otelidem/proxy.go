package otelidem

import (
	"context"
	"net/http"
	"net/http/httputil"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"

	"github.com/idemgo/idem/idemproxy"
)

// SpanProxy starts the name of a ProxyTracer's server spans, which is
// followed by the request's method: "idem.proxy POST".
const SpanProxy = "idem.proxy"

// Attributes of a ProxyTracer's server spans, beside KeyOutcome (the
// idemhttp outcome of a covered request, or "passthrough", or "busy").
const (
	attrMethod = attribute.Key("http.request.method")
	attrPath   = attribute.Key("url.path")
	attrStatus = attribute.Key("http.response.status_code")
)

// ProxyTracer traces an idemproxy.Proxy with one server span per request,
// a child of the client's span when the request carries its trace
// context; the upstream gets the proxy's span as its parent. Wire its
// three parts, and wrap the Proxy's store with Store, so that the store
// calls are the span's children:
//
//	t := otelidem.NewProxyTracer(otelidem.WithTracerProvider(tp))
//	p := &idemproxy.Proxy{Target: u, Executor: exec, Rewrite: t.Rewrite, Observer: t.Observe}
//	srv := &http.Server{Handler: t.Handler(p)}
//
// A span carries the method, the path, the status and what the proxy did
// (KeyOutcome); a status of 500 or more, or a response cut off, is an
// error. It is safe for concurrent use.
type ProxyTracer struct {
	tracer trace.Tracer
	prop   propagation.TextMapPropagator
}

// NewProxyTracer returns a tracer of proxy requests. Of the options,
// WithTracerProvider and WithPropagator apply.
func NewProxyTracer(opts ...Option) *ProxyTracer {
	var c config
	for _, o := range opts {
		o(&c)
	}
	if c.tp == nil {
		c.tp = otel.GetTracerProvider()
	}
	if c.prop == nil {
		c.prop = otel.GetTextMapPropagator()
	}
	return &ProxyTracer{tracer: c.tp.Tracer(ScopeName), prop: c.prop}
}

// Handler returns next (the Proxy) with a server span around each request.
func (t *ProxyTracer) Handler(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		ctx := t.prop.Extract(r.Context(), propagation.HeaderCarrier(r.Header))
		ctx, span := t.tracer.Start(ctx, SpanProxy+" "+r.Method,
			trace.WithSpanKind(trace.SpanKindServer),
			trace.WithAttributes(attrMethod.String(r.Method), attrPath.String(r.URL.Path)))
		sw := &statusWriter{ResponseWriter: w}
		aborted := true
		defer func() { endSpan(span, sw.status, aborted) }()
		next.ServeHTTP(sw, r.WithContext(ctx))
		aborted = false
	})
}

// Rewrite writes the trace context of the request's span into the
// outgoing request. It is for idemproxy.Proxy.Rewrite.
func (t *ProxyTracer) Rewrite(pr *httputil.ProxyRequest) {
	t.prop.Inject(pr.Out.Context(), propagation.HeaderCarrier(pr.Out.Header))
}

// Observe records what the proxy did on the request's span. It is an
// idemproxy.Observer.
func (t *ProxyTracer) Observe(r *http.Request, ev idemproxy.Event) {
	outcome := ev.Kind.String()
	if ev.Kind == idemproxy.KindCovered {
		outcome = ev.Outcome.String()
	}
	setOutcome(r.Context(), outcome)
}

func setOutcome(ctx context.Context, outcome string) {
	if span := trace.SpanFromContext(ctx); span.IsRecording() {
		span.SetAttributes(KeyOutcome.String(outcome))
	}
}

// endSpan ends a request's server span. aborted says the response was cut
// off (the handler panicked).
func endSpan(span trace.Span, status int, aborted bool) {
	if status == 0 && !aborted {
		status = http.StatusOK // nothing written: net/http sends 200
	}
	if status != 0 {
		span.SetAttributes(attrStatus.Int(status))
	}
	switch {
	case aborted:
		span.SetStatus(codes.Error, "response aborted")
	case status >= 500:
		span.SetStatus(codes.Error, http.StatusText(status))
	}
	span.End()
}

// statusWriter records the status of a response. It keeps Unwrap, so that
// http.ResponseController (flushes, deadlines, the hijack of a protocol
// upgrade) reaches the server's writer.
type statusWriter struct {
	http.ResponseWriter
	status int
}

func (s *statusWriter) WriteHeader(code int) {
	if s.status == 0 && code >= 200 {
		s.status = code
	}
	s.ResponseWriter.WriteHeader(code)
}

func (s *statusWriter) Write(p []byte) (int, error) {
	if s.status == 0 {
		s.status = http.StatusOK
	}
	return s.ResponseWriter.Write(p)
}

// Unwrap returns the wrapped writer, for http.ResponseController.
func (s *statusWriter) Unwrap() http.ResponseWriter { return s.ResponseWriter }
