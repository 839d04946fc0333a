package main

import (
	"context"
	"errors"
	"log/slog"
	"net/http"
	"net/url"
	"time"

	"github.com/idemgo/idem"
	"github.com/idemgo/idem/otelidem"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/sdk/resource"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/trace"
)

// tracingFlags turn on OpenTelemetry tracing: a server span per proxied
// request and a client span per store call (otelidem), exported over
// OTLP/HTTP. Off by default.
type tracingFlags struct {
	endpoint    string
	serviceName string
}

// tracesPath is where an OTLP/HTTP collector takes spans.
const tracesPath = "/v1/traces"

// tracingShutdownTimeout bounds the flush of the spans still buffered when
// the proxy exits.
const tracingShutdownTimeout = 5 * time.Second

func (t *tracingFlags) register(fs *flagSet) {
	fs.URL(&t.endpoint, "otel-endpoint", "URL", "", "send OpenTelemetry traces over OTLP/HTTP to this collector, e.g. http://127.0.0.1:4318 (spans go to "+tracesPath+" unless the URL has a path; empty: tracing off)")
	fs.String(&t.serviceName, "otel-service-name", "NAME", "idem", "service.name of the traces sent to --otel-endpoint")
}

// validate checks the flags without I/O.
func (t *tracingFlags) validate() error {
	if t.endpoint == "" {
		return nil
	}
	if _, err := t.exportURL(); err != nil {
		return err
	}
	if t.serviceName == "" {
		return usagef("--otel-service-name is empty; give a name for the traces")
	}
	return nil
}

// exportURL returns the URL the spans are posted to: the endpoint, with
// /v1/traces when it has no path.
func (t *tracingFlags) exportURL() (string, error) {
	u, err := url.Parse(t.endpoint)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		if err == nil {
			err = errors.New("want an http:// or https:// URL with a host, e.g. http://127.0.0.1:4318")
		}
		return "", urlFlagError("--otel-endpoint", t.endpoint, err, "http")
	}
	if u.Path == "" || u.Path == "/" {
		u.Path = tracesPath
	}
	return u.String(), nil
}

// tracing is the proxy's tracing when --otel-endpoint is set.
type tracing struct {
	tp     *sdktrace.TracerProvider
	tracer trace.Tracer
	prop   propagation.TextMapPropagator
}

// startTracing sets up the exporter and the tracer provider. Nothing is
// sent until the first batch of spans: an unreachable collector is
// reported in the log, and the proxy serves on.
func (t *tracingFlags) start(ctx context.Context, log *slog.Logger, getenv func(string) string) (*tracing, error) {
	u, err := t.exportURL()
	if err != nil {
		return nil, err
	}
	exp, err := newOTLPExporter(u, getenv)
	if err != nil {
		return nil, usagef("--otel-endpoint: %v", err)
	}
	res, err := resource.New(ctx,
		resource.WithTelemetrySDK(),
		resource.WithAttributes(
			attribute.String("service.name", t.serviceName),
			attribute.String("service.version", version()),
		))
	if err != nil {
		return nil, usagef("--otel-service-name: %v", err)
	}
	// Export failures would otherwise be printed by OTel's own logger, out
	// of the proxy's log format.
	otel.SetErrorHandler(otel.ErrorHandlerFunc(func(err error) {
		log.Warn("tracing: exporting spans failed", "endpoint", redactURL(u), "error", err)
	}))
	tp := sdktrace.NewTracerProvider(sdktrace.WithBatcher(exp), sdktrace.WithResource(res))
	prop := propagation.TraceContext{}
	otel.SetTracerProvider(tp)
	otel.SetTextMapPropagator(prop)
	return &tracing{tp: tp, tracer: tp.Tracer("github.com/idemgo/idem/cmd/idem"), prop: prop}, nil
}

// store returns s with a span per call.
func (tr *tracing) store(s idem.Store) idem.Store {
	return otelidem.Store(s, otelidem.WithTracerProvider(tr.tp))
}

// shutdown flushes the spans still buffered and stops the exporter.
func (tr *tracing) shutdown() error {
	ctx, cancel := context.WithTimeout(context.Background(), tracingShutdownTimeout)
	defer cancel()
	return tr.tp.Shutdown(ctx)
}

// Attributes of the proxy's server spans.
const (
	attrMethod  = attribute.Key("http.request.method")
	attrPath    = attribute.Key("url.path")
	attrStatus  = attribute.Key("http.response.status_code")
	attrOutcome = attribute.Key("idem.outcome")
)

// startSpan starts the server span of a request, as a child of the
// client's span if the request carries a W3C traceparent. The returned
// writer records the status for end.
func (tr *tracing) startSpan(w http.ResponseWriter, r *http.Request) (*statusWriter, *http.Request, trace.Span) {
	ctx := tr.prop.Extract(r.Context(), propagation.HeaderCarrier(r.Header))
	ctx, span := tr.tracer.Start(ctx, "idem.proxy "+r.Method,
		trace.WithSpanKind(trace.SpanKindServer),
		trace.WithAttributes(attrMethod.String(r.Method), attrPath.String(r.URL.Path)))
	return &statusWriter{ResponseWriter: w}, r.WithContext(ctx), span
}

// endSpan ends a request's server span. aborted says the response was cut
// off (the handler panicked).
func endSpan(span trace.Span, sw *statusWriter, aborted bool) {
	status := sw.status
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

// setOutcome records on the request's span what the idempotency layer did.
func setOutcome(ctx context.Context, outcome string) {
	if span := trace.SpanFromContext(ctx); span.IsRecording() {
		span.SetAttributes(attrOutcome.String(outcome))
	}
}

// statusWriter records the status of a response. It keeps Unwrap, so that
// http.ResponseController (flushes, the hijack of a protocol upgrade)
// reaches the server's writer.
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

func (s *statusWriter) Unwrap() http.ResponseWriter { return s.ResponseWriter }
