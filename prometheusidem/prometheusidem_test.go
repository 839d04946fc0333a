package prometheusidem_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/idemgo/idem"
	"github.com/idemgo/idem/memstore"
	"github.com/idemgo/idem/observe"
	"github.com/idemgo/idem/prometheusidem"
)

func newMetrics(t *testing.T, opts ...prometheusidem.Option) (*prometheusidem.Metrics, *prometheus.Registry) {
	t.Helper()
	m, err := prometheusidem.New(opts...)
	if err != nil {
		t.Fatal(err)
	}
	reg := prometheus.NewPedanticRegistry()
	reg.MustRegister(m)
	return m, reg
}

// TestMetrics runs an Executor and checks the counters, the histograms'
// counts and their first bucket.
func TestMetrics(t *testing.T) {
	m, reg := newMetrics(t, prometheusidem.WithScopeKinds("http"))
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
	want := `
# HELP idem_operations_total Calls of an idem Executor (Do, Begin and the end of its attempt), by outcome and scope kind.
# TYPE idem_operations_total counter
`
	var lines []string
	for _, o := range observe.Outcomes() {
		for _, kind := range []string{"charge", "http", "other"} {
			v := "0"
			if kind == "charge" {
				switch o {
				case observe.Executed, observe.Mismatch:
					v = "1"
				case observe.Replayed:
					v = "2"
				}
			}
			lines = append(lines, `idem_operations_total{outcome="`+o.String()+`",scope_kind="`+kind+`"} `+v)
		}
	}
	if err := testutil.GatherAndCompare(reg, strings.NewReader(want+sortedLines(lines)), "idem_operations_total"); err != nil {
		t.Error(err)
	}
	if n := testutil.CollectAndCount(m, "idem_operation_duration_seconds"); n != 3*len(observe.Outcomes()) {
		t.Errorf("duration series: got %d, want %d", n, 3*len(observe.Outcomes()))
	}
	families, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range families {
		if f.GetName() != "idem_operation_store_duration_seconds" {
			continue
		}
		for _, s := range f.GetMetric() {
			if s.GetLabel()[0].GetValue() != "charge" {
				continue
			}
			h := s.GetHistogram()
			if h.GetSampleCount() != 4 {
				t.Errorf("store duration count: got %d, want 4", h.GetSampleCount())
			}
			if b := h.GetBucket()[0].GetUpperBound(); b != 50e-6 {
				t.Errorf("first bucket: got %g, want 50µs", b)
			}
		}
	}
}

// TestMaxScopeKinds checks that kinds beyond the limit are counted as
// "other".
func TestMaxScopeKinds(t *testing.T) {
	m, _ := newMetrics(t, prometheusidem.WithMaxScopeKinds(2))
	for _, kind := range []string{"a", "b", "c", "d", "a"} {
		m.Observe(t.Context(), observe.Observation{Outcome: observe.Executed, ScopeKind: kind, Duration: time.Millisecond, TakenOver: kind == "d"})
	}
	for kind, want := range map[string]float64{"a": 2, "b": 1, "other": 2} {
		c, err := mOutcome(m, kind)
		if err != nil {
			t.Fatal(err)
		}
		if c != want {
			t.Errorf("kind %s: got %v, want %v", kind, c, want)
		}
	}
	if n := testutil.CollectAndCount(m, "idem_operations_total"); n != 3*len(observe.Outcomes()) {
		t.Errorf("series: got %d, want %d (a, b, other)", n, 3*len(observe.Outcomes()))
	}
	if _, err := prometheusidem.New(prometheusidem.WithMaxScopeKinds(0)); err == nil {
		t.Error("WithMaxScopeKinds(0): got no error")
	}
}

// mOutcome returns the executed count of kind.
func mOutcome(m *prometheusidem.Metrics, kind string) (float64, error) {
	reg := prometheus.NewRegistry()
	if err := reg.Register(m); err != nil {
		return 0, err
	}
	families, err := reg.Gather()
	if err != nil {
		return 0, err
	}
	for _, f := range families {
		if f.GetName() != "idem_operations_total" {
			continue
		}
		for _, s := range f.GetMetric() {
			l := s.GetLabel()
			if l[0].GetValue() == "executed" && l[1].GetValue() == kind {
				return s.GetCounter().GetValue(), nil
			}
		}
	}
	return 0, errors.New("no series of kind " + kind)
}

func sortedLines(lines []string) string {
	// GatherAndCompare sorts both sides; the order here does not matter.
	return strings.Join(lines, "\n") + "\n"
}

// BenchmarkObserve is the cost of one observation.
func BenchmarkObserve(b *testing.B) {
	m, err := prometheusidem.New()
	if err != nil {
		b.Fatal(err)
	}
	o := observe.Observation{Outcome: observe.Executed, ScopeKind: "http", Duration: time.Millisecond, StoreDuration: 200 * time.Microsecond}
	ctx := context.Background()
	b.ReportAllocs()
	for b.Loop() {
		m.Observe(ctx, o)
	}
}
