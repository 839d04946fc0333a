package otelidem_test

import (
	"context"
	"errors"
	"maps"
	"testing"

	"go.opentelemetry.io/otel/attribute"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"

	"github.com/idemgo/idem"
	"github.com/idemgo/idem/memstore"
	"github.com/idemgo/idem/observe"
	"github.com/idemgo/idem/otelidem"
)

// TestMetrics runs an Executor observed by Metrics and reads the
// measurements with the SDK's manual reader.
func TestMetrics(t *testing.T) {
	reader := sdkmetric.NewManualReader()
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))
	t.Cleanup(func() { _ = mp.Shutdown(context.Background()) })
	m, err := otelidem.NewMetrics(otelidem.WithMeterProvider(mp), otelidem.WithAttributes(attribute.String("service.part", "payments")))
	if err != nil {
		t.Fatal(err)
	}
	store, _ := memstore.New()
	exec, err := idem.New(store, idem.WithObserver(m.Observe))
	if err != nil {
		t.Fatal(err)
	}
	ctx := t.Context()
	ok := func(context.Context) ([]byte, error) { return []byte("v"), nil }
	key := idem.Key{Scope: "charge", ID: "1"}
	for range 3 {
		if _, err := exec.Do(ctx, key, "fp", ok); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := exec.Do(ctx, key, "other", ok); !errors.Is(err, idem.ErrMismatch) {
		t.Fatal(err)
	}

	var rm metricdata.ResourceMetrics
	if err := reader.Collect(ctx, &rm); err != nil {
		t.Fatal(err)
	}
	got := map[string]metricdata.Metrics{}
	for _, sm := range rm.ScopeMetrics {
		if sm.Scope.Name != otelidem.ScopeName {
			t.Errorf("scope: got %q, want %q", sm.Scope.Name, otelidem.ScopeName)
		}
		for _, mm := range sm.Metrics {
			got[mm.Name] = mm
		}
	}

	ops, ok2 := got[otelidem.MetricOperations].Data.(metricdata.Sum[int64])
	if !ok2 || !ops.IsMonotonic {
		t.Fatalf("%s: got %T, want a monotonic int64 sum", otelidem.MetricOperations, got[otelidem.MetricOperations].Data)
	}
	counts := map[string]int64{}
	for _, dp := range ops.DataPoints {
		kind, _ := dp.Attributes.Value(otelidem.KeyScopeKind)
		part, _ := dp.Attributes.Value("service.part")
		if kind.AsString() != "charge" || part.AsString() != "payments" {
			t.Errorf("attributes: got %v, want idem.scope.kind=charge and service.part=payments", dp.Attributes)
		}
		outcome, _ := dp.Attributes.Value(otelidem.KeyOutcome)
		counts[outcome.AsString()] = dp.Value
	}
	if want := map[string]int64{"executed": 1, "replayed": 2, "mismatch": 1}; !maps.Equal(counts, want) {
		t.Errorf("%s: got %v, want %v", otelidem.MetricOperations, counts, want)
	}

	dur := got[otelidem.MetricOperationDuration]
	h, ok2 := dur.Data.(metricdata.Histogram[float64])
	if !ok2 || dur.Unit != "s" {
		t.Fatalf("%s: got %T in %q, want a float64 histogram in s", otelidem.MetricOperationDuration, dur.Data, dur.Unit)
	}
	var n uint64
	for _, dp := range h.DataPoints {
		n += dp.Count
		if dp.Bounds[0] != 50e-6 {
			t.Errorf("first bound: got %g, want 50µs", dp.Bounds[0])
		}
	}
	if n != 4 {
		t.Errorf("%s: got %d measurements, want 4", otelidem.MetricOperationDuration, n)
	}
	store2, ok2 := got[otelidem.MetricStoreDuration].Data.(metricdata.Histogram[float64])
	if !ok2 || len(store2.DataPoints) != 1 || store2.DataPoints[0].Count != 4 {
		t.Errorf("%s: got %+v, want 4 measurements of kind charge", otelidem.MetricStoreDuration, got[otelidem.MetricStoreDuration].Data)
	}
}

// BenchmarkMetricsObserve is the cost of one observation on the SDK.
func BenchmarkMetricsObserve(b *testing.B) {
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(sdkmetric.NewManualReader()))
	m, err := otelidem.NewMetrics(otelidem.WithMeterProvider(mp))
	if err != nil {
		b.Fatal(err)
	}
	o := observe.Observation{Outcome: observe.Executed, ScopeKind: "http"}
	ctx := context.Background()
	b.ReportAllocs()
	for b.Loop() {
		m.Observe(ctx, o)
	}
}
