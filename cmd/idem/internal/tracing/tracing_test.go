package tracing

import (
	"context"
	"testing"

	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"

	"github.com/idemgo/idem"
	"github.com/idemgo/idem/memstore"
	"github.com/idemgo/idem/storekit"
)

// TestTracedStoreKeepsWatcher: the store the proxy runs on, traced, is
// still a storekit.Watcher, and its calls have spans.
func TestTracedStoreKeepsWatcher(t *testing.T) {
	ms, err := memstore.New()
	if err != nil {
		t.Fatal(err)
	}
	rec := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec))
	t.Cleanup(func() { _ = tp.Shutdown(context.Background()) })
	store := newTracing(tp).Store(ms)
	w, ok := store.(storekit.Watcher)
	if !ok {
		t.Fatal("the traced store is not a storekit.Watcher, want one")
	}
	_, stop, err := w.Watch(t.Context(), "k")
	if err != nil {
		t.Fatal(err)
	}
	stop()
	if _, err := store.Get(t.Context(), "k"); err == nil {
		t.Fatal("Get: got a record, want ErrNotFound")
	}
	var names []string
	for _, s := range rec.Ended() {
		names = append(names, s.Name())
	}
	if len(names) != 2 || names[0] != "idem.watch" || names[1] != "idem.get" {
		t.Errorf("got spans %q, want idem.watch and idem.get", names)
	}
}

// TestNilTracing: tracing off hands the store and the proxy back as they
// are.
func TestNilTracing(t *testing.T) {
	ms, err := memstore.New()
	if err != nil {
		t.Fatal(err)
	}
	var tr *Tracing
	if got := tr.Store(ms); got != idem.Store(ms) {
		t.Errorf("Store: got %T, want the store itself", got)
	}
	tr.Shutdown(nil)
}

func TestExportURL(t *testing.T) {
	for _, tt := range []struct{ endpoint, want string }{
		{"http://127.0.0.1:4318", "http://127.0.0.1:4318/v1/traces"},
		{"http://127.0.0.1:4318/", "http://127.0.0.1:4318/v1/traces"},
		{"https://collector.example:443/otlp/v1/traces", "https://collector.example:443/otlp/v1/traces"},
	} {
		if got, err := ExportURL(tt.endpoint); err != nil || got != tt.want {
			t.Errorf("ExportURL(%q): got %q, %v, want %q", tt.endpoint, got, err, tt.want)
		}
	}
	for _, bad := range []string{"127.0.0.1:4318", "ftp://x", "http://", "::"} {
		if _, err := ExportURL(bad); err == nil {
			t.Errorf("ExportURL(%q): got nil, want an error", bad)
		}
	}
}
