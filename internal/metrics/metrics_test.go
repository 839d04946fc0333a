package metrics

import (
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"
)

func TestWrite(t *testing.T) {
	r := NewRegistry()
	c := r.Counter("app_events_total", "Events.\nSecond line with \\.")
	c.Add(3)
	cv := r.CounterVec("app_requests_total", "Requests by outcome.", "outcome", "code")
	cv.With("ok", "200").Inc()
	cv.With(`we"ird\`+"\n", "500").Add(2)
	cv.With("ok", "200").Inc() // the same series
	g := r.Gauge("app_in_flight", "In flight.")
	g.Add(2)
	g.Add(-0.5)
	r.GaugeFunc("app_answer", "The answer.", func() float64 { return 42 })
	r.GaugeVec("app_build_info", "Build.", "version").With("v1").Set(1)
	h := r.Histogram("app_latency_seconds", "Latency.", []float64{0.001, 0.01})
	h.Observe(0.001) // on a bound: in that bucket
	h.ObserveDuration(5 * time.Millisecond)
	h.Observe(3)
	hv := r.HistogramVec("app_store_seconds", "Store.", []float64{1}, "op")
	hv.With("get").Observe(0.5)

	var b strings.Builder
	if err := r.Write(&b); err != nil {
		t.Fatal(err)
	}
	want := `# HELP app_events_total Events.\nSecond line with \\.
# TYPE app_events_total counter
app_events_total 3
# HELP app_requests_total Requests by outcome.
# TYPE app_requests_total counter
app_requests_total{outcome="ok",code="200"} 2
app_requests_total{outcome="we\"ird\\\n",code="500"} 2
# HELP app_in_flight In flight.
# TYPE app_in_flight gauge
app_in_flight 1.5
# HELP app_answer The answer.
# TYPE app_answer gauge
app_answer 42
# HELP app_build_info Build.
# TYPE app_build_info gauge
app_build_info{version="v1"} 1
# HELP app_latency_seconds Latency.
# TYPE app_latency_seconds histogram
app_latency_seconds_bucket{le="0.001"} 1
app_latency_seconds_bucket{le="0.01"} 2
app_latency_seconds_bucket{le="+Inf"} 3
app_latency_seconds_sum 3.006
app_latency_seconds_count 3
# HELP app_store_seconds Store.
# TYPE app_store_seconds histogram
app_store_seconds_bucket{op="get",le="1"} 1
app_store_seconds_bucket{op="get",le="+Inf"} 1
app_store_seconds_sum{op="get"} 0.5
app_store_seconds_count{op="get"} 1
`
	if got := b.String(); got != want {
		t.Errorf("got:\n%s\nwant:\n%s", got, want)
	}
	if h.Count() != 3 || c.Value() != 3 || g.Value() != 1.5 {
		t.Errorf("values: got count %d, counter %d, gauge %v, want 3, 3, 1.5", h.Count(), c.Value(), g.Value())
	}
}

func TestHandler(t *testing.T) {
	r := NewRegistry()
	r.Counter("x_total", "X.").Inc()
	rec := httptest.NewRecorder()
	r.Handler().ServeHTTP(rec, httptest.NewRequest("GET", "/metrics", nil))
	if ct := rec.Header().Get("Content-Type"); ct != ContentType {
		t.Errorf("Content-Type: got %q, want %q", ct, ContentType)
	}
	if !strings.Contains(rec.Body.String(), "x_total 1\n") {
		t.Errorf("body: got %q, want it to hold x_total 1", rec.Body.String())
	}
}

func TestConcurrentUpdates(t *testing.T) {
	r := NewRegistry()
	c := r.CounterVec("c_total", "C.", "l").With("a")
	h := r.Histogram("h_seconds", "H.", DurationBuckets)
	g := r.Gauge("g", "G.")
	var wg sync.WaitGroup
	for range 8 {
		wg.Go(func() {
			for range 1000 {
				c.Inc()
				h.Observe(0.0003)
				g.Add(1)
			}
		})
	}
	wg.Go(func() {
		for range 10 {
			_ = r.Write(&strings.Builder{})
		}
	})
	wg.Wait()
	if c.Value() != 8000 || h.Count() != 8000 || g.Value() != 8000 {
		t.Errorf("got counter %d, histogram count %d, gauge %v, want 8000 each", c.Value(), h.Count(), g.Value())
	}
}

func TestUpdatesDoNotAllocate(t *testing.T) {
	r := NewRegistry()
	c := r.CounterVec("c_total", "C.", "l").With("a")
	h := r.HistogramVec("h_seconds", "H.", DurationBuckets, "l").With("a")
	g := r.Gauge("g", "G.")
	if n := testing.AllocsPerRun(100, func() {
		c.Inc()
		h.ObserveDuration(time.Millisecond)
		g.Add(1)
	}); n != 0 {
		t.Errorf("allocations per update: got %v, want 0", n)
	}
}

func TestMisusePanics(t *testing.T) {
	tests := []struct {
		name string
		fn   func(r *Registry)
	}{
		{"empty name", func(r *Registry) { r.Counter("", "x") }},
		{"bad name", func(r *Registry) { r.Counter("a-b", "x") }},
		{"leading digit", func(r *Registry) { r.Counter("1a", "x") }},
		{"bad label", func(r *Registry) { r.CounterVec("a", "x", "b:c") }},
		{"reserved label", func(r *Registry) { r.CounterVec("a", "x", "__b") }},
		{"twice", func(r *Registry) { r.Counter("a", "x"); r.Gauge("a", "x") }},
		{"label count", func(r *Registry) { r.CounterVec("a", "x", "l").With("1", "2") }},
		{"unsorted buckets", func(r *Registry) { r.Histogram("a", "x", []float64{2, 1}) }},
		{"no buckets", func(r *Registry) { r.Histogram("a", "x", nil) }},
		{"le label", func(r *Registry) { r.HistogramVec("a", "x", []float64{1}, "le") }},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			defer func() {
				if recover() == nil {
					t.Errorf("got no panic, want one")
				}
			}()
			tt.fn(NewRegistry())
		})
	}
}
