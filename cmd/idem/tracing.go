package main

import (
	"context"
	"errors"
	"log/slog"
	"net/http"
	"net/url"
	"time"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/sdk/resource"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"

	"github.com/idemgo/idem"
	"github.com/idemgo/idem/cmd/idem/internal/cli"
	"github.com/idemgo/idem/cmd/idem/internal/otlp"
	"github.com/idemgo/idem/cmd/idem/internal/redact"
	"github.com/idemgo/idem/idemproxy"
	"github.com/idemgo/idem/otelidem"
)

// tracingFlags turn on OpenTelemetry tracing: a server span per proxied
// request (otelidem.ProxyTracer) and a client span per store call
// (otelidem.Store), exported over OTLP/HTTP. Off by default.
type tracingFlags struct {
	endpoint    string
	serviceName string
}

// tracesPath is where an OTLP/HTTP collector takes spans.
const tracesPath = "/v1/traces"

// tracingShutdownTimeout bounds the flush of the spans still buffered when
// the proxy exits.
const tracingShutdownTimeout = 5 * time.Second

func (t *tracingFlags) flags() []cli.Def {
	t.serviceName = "idem"
	return []cli.Def{
		{Name: "otel-endpoint", Placeholder: "URL", Value: cli.String(&t.endpoint), Secret: cli.URLSecret,
			Usage: "send OpenTelemetry traces over OTLP/HTTP to this collector, e.g. http://127.0.0.1:4318 (spans go to " + tracesPath + " unless the URL has a path; empty: tracing off)"},
		{Name: "otel-service-name", Placeholder: "NAME", Value: cli.String(&t.serviceName), Usage: "service.name of the traces sent to --otel-endpoint"},
	}
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
		return cli.Usagef("--otel-service-name is empty; give a name for the traces")
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

// tracing is the proxy's tracing when --otel-endpoint is set; its methods
// do nothing on nil (tracing off).
type tracing struct {
	tp    *sdktrace.TracerProvider
	proxy *otelidem.ProxyTracer
}

// start sets up the exporter and the tracer provider, or returns nil when
// tracing is off. Nothing is sent until the first batch of spans: an
// unreachable collector is reported in the log, and the proxy serves on.
func (t *tracingFlags) start(ctx context.Context, log *slog.Logger, getenv func(string) string) (*tracing, error) {
	if t.endpoint == "" {
		return nil, nil
	}
	u, err := t.exportURL()
	if err != nil {
		return nil, err
	}
	exp, err := otlp.New(u, getenv, "idem/"+version())
	if err != nil {
		return nil, cli.Usagef("--otel-endpoint: %v", err)
	}
	res, err := resource.New(ctx,
		resource.WithTelemetrySDK(),
		resource.WithAttributes(
			attribute.String("service.name", t.serviceName),
			attribute.String("service.version", version()),
		))
	if err != nil {
		return nil, cli.Usagef("--otel-service-name: %v", err)
	}
	// Export failures would otherwise be printed by OTel's own logger, out
	// of the proxy's log format.
	otel.SetErrorHandler(otel.ErrorHandlerFunc(func(err error) {
		log.Warn("tracing: exporting spans failed", "endpoint", redact.URL(u), "error", err)
	}))
	tp := sdktrace.NewTracerProvider(sdktrace.WithBatcher(exp), sdktrace.WithResource(res))
	otel.SetTracerProvider(tp)
	otel.SetTextMapPropagator(propagation.TraceContext{})
	return &tracing{tp: tp, proxy: otelidem.NewProxyTracer(otelidem.WithTracerProvider(tp))}, nil
}

// store returns s with a span per call.
func (tr *tracing) store(s idem.Store) idem.Store {
	if tr == nil {
		return s
	}
	return otelidem.Store(s, otelidem.WithTracerProvider(tr.tp))
}

// handler wires p to the tracer (the upstream gets the request's trace
// context, its span the outcome) and returns p inside the server spans.
func (tr *tracing) handler(p *idemproxy.Proxy) http.Handler {
	if tr == nil {
		return p
	}
	p.Rewrite = tr.proxy.Rewrite
	if observe := p.Observer; observe != nil {
		p.Observer = func(r *http.Request, ev idemproxy.Event) {
			observe(r, ev)
			tr.proxy.Observe(r, ev)
		}
	} else {
		p.Observer = tr.proxy.Observe
	}
	return tr.proxy.Handler(p)
}

// shutdown flushes the spans still buffered and stops the exporter.
func (tr *tracing) shutdown(log *slog.Logger) {
	if tr == nil {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), tracingShutdownTimeout)
	defer cancel()
	if err := tr.tp.Shutdown(ctx); err != nil {
		log.Warn("tracing: flushing the last spans failed", "error", err)
	}
}
