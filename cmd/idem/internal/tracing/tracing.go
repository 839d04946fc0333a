// Package tracing is the OpenTelemetry tracing of idem proxy
// (--otel-endpoint): a server span per proxied request
// (otelidem.ProxyTracer) and a client span per store call (otelidem.Store),
// exported over OTLP/HTTP by internal/otlp, whose doc says why the binary
// does not use OpenTelemetry's own exporter.
package tracing

import (
	"context"
	"errors"
	"fmt"
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
	"github.com/idemgo/idem/cmd/idem/internal/otlp"
	"github.com/idemgo/idem/cmd/idem/internal/redact"
	"github.com/idemgo/idem/idemproxy"
	"github.com/idemgo/idem/otelidem"
)

// Path is where an OTLP/HTTP collector takes spans.
const Path = "/v1/traces"

// shutdownTimeout bounds the flush of the spans still buffered when the
// proxy exits.
const shutdownTimeout = 5 * time.Second

// ExportURL returns the URL the spans are posted to: endpoint, with Path
// when it has none. It fails unless endpoint is an http or https URL with
// a host.
func ExportURL(endpoint string) (string, error) {
	u, err := url.Parse(endpoint)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		if err == nil {
			err = errors.New("want an http:// or https:// URL with a host, e.g. http://127.0.0.1:4318")
		}
		return "", err
	}
	if u.Path == "" || u.Path == "/" {
		u.Path = Path
	}
	return u.String(), nil
}

// Tracing is the proxy's tracing. Its methods do nothing on nil (tracing
// off), so the caller needs no branch of its own.
type Tracing struct {
	tp    *sdktrace.TracerProvider
	proxy *otelidem.ProxyTracer
}

// Start sets up the exporter to exportURL (see ExportURL), the tracer
// provider with the service's name and version, and the global
// propagator. Nothing is sent until the first batch of spans: an
// unreachable collector is reported in log, and the proxy serves on. The
// exporter reads the OTEL_EXPORTER_OTLP_* variables through getenv.
func Start(ctx context.Context, exportURL, service, version string, log *slog.Logger, getenv func(string) string) (*Tracing, error) {
	exp, err := otlp.New(exportURL, getenv, "idem/"+version)
	if err != nil {
		return nil, err
	}
	res, err := resource.New(ctx,
		resource.WithTelemetrySDK(),
		resource.WithAttributes(
			attribute.String("service.name", service),
			attribute.String("service.version", version),
		))
	if err != nil {
		return nil, fmt.Errorf("service name: %w", err)
	}
	// Export failures would otherwise be printed by OTel's own logger, out
	// of the proxy's log format.
	otel.SetErrorHandler(otel.ErrorHandlerFunc(func(err error) {
		log.Warn("tracing: exporting spans failed", "endpoint", redact.URL(exportURL), "error", err)
	}))
	tp := sdktrace.NewTracerProvider(sdktrace.WithBatcher(exp), sdktrace.WithResource(res))
	otel.SetTracerProvider(tp)
	otel.SetTextMapPropagator(propagation.TraceContext{})
	return newTracing(tp), nil
}

func newTracing(tp *sdktrace.TracerProvider) *Tracing {
	return &Tracing{tp: tp, proxy: otelidem.NewProxyTracer(otelidem.WithTracerProvider(tp))}
}

// Store returns s with a span per call; its capabilities pass through.
func (t *Tracing) Store(s idem.Store) idem.Store {
	if t == nil {
		return s
	}
	return otelidem.Store(s, otelidem.WithTracerProvider(t.tp))
}

// Handler wires p to the tracer (the upstream gets the request's trace
// context, its span the outcome, after p's own Observer) and returns p
// inside the server spans. Call it before p.Init.
func (t *Tracing) Handler(p *idemproxy.Proxy) http.Handler {
	if t == nil {
		return p
	}
	p.Rewrite = t.proxy.Rewrite
	if observe := p.Observer; observe != nil {
		p.Observer = func(r *http.Request, ev idemproxy.Event) {
			observe(r, ev)
			t.proxy.Observe(r, ev)
		}
	} else {
		p.Observer = t.proxy.Observe
	}
	return t.proxy.Handler(p)
}

// Shutdown flushes the spans still buffered and stops the exporter.
func (t *Tracing) Shutdown(log *slog.Logger) {
	if t == nil {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), shutdownTimeout)
	defer cancel()
	if err := t.tp.Shutdown(ctx); err != nil {
		log.Warn("tracing: flushing the last spans failed", "error", err)
	}
}
