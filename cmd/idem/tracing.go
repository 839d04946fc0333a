package main

import (
	"context"
	"log/slog"

	"github.com/idemgo/idem/cmd/idem/internal/cli"
	"github.com/idemgo/idem/cmd/idem/internal/tracing"
)

// tracingFlags turn on OpenTelemetry tracing (internal/tracing). Off by
// default.
type tracingFlags struct {
	endpoint    string
	serviceName string
}

func (t *tracingFlags) flags() []cli.Def {
	t.serviceName = "idem"
	return []cli.Def{
		{Name: "otel-endpoint", Placeholder: "URL", Value: cli.String(&t.endpoint), Secret: cli.URLSecret,
			Usage: "send OpenTelemetry traces over OTLP/HTTP to this collector, e.g. http://127.0.0.1:4318 (spans go to " + tracing.Path + " unless the URL has a path; empty: tracing off)"},
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

// exportURL returns the URL the spans are posted to.
func (t *tracingFlags) exportURL() (string, error) {
	u, err := tracing.ExportURL(t.endpoint)
	if err != nil {
		return "", cli.URLError("--otel-endpoint", t.endpoint, err, "http")
	}
	return u, nil
}

// start returns the proxy's tracing, or nil when it is off.
func (t *tracingFlags) start(ctx context.Context, log *slog.Logger, getenv func(string) string) (*tracing.Tracing, error) {
	if t.endpoint == "" {
		return nil, nil
	}
	u, err := t.exportURL()
	if err != nil {
		return nil, err
	}
	tr, err := tracing.Start(ctx, u, t.serviceName, version(), log, getenv)
	if err != nil {
		return nil, cli.Usagef("--otel-endpoint: %v", err)
	}
	return tr, nil
}
