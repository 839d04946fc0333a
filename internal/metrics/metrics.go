// Package metrics is a small Prometheus instrumentation library for the idem
// binary: counters, gauges and histograms, with or without labels, written
// in the Prometheus text exposition format (version 0.0.4). It exists so
// that the root module needs no Prometheus client.
//
// Updating a metric is lock-free (atomic operations only) and allocates
// nothing; resolve labelled series once with With and keep them. Registering
// metrics and creating series take locks, and so does writing the
// exposition.
//
//	reg := metrics.NewRegistry()
//	reqs := reg.CounterVec("app_requests_total", "Requests by outcome.", "outcome")
//	ok := reqs.With("ok") // once
//	ok.Inc()              // per request
//	http.Handle("/metrics", reg.Handler())
//
// Names and label names must be valid Prometheus names; an invalid one, a
// name registered twice or a wrong number of label values is a programming
// error and panics, as regexp.MustCompile does.
package metrics

import (
	"bufio"
	"fmt"
	"io"
	"math"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

// DurationBuckets are histogram bounds, in seconds, fine enough to see
// sub-millisecond overhead: 50µs to 10s.
var DurationBuckets = []float64{
	0.00005, 0.0001, 0.00025, 0.0005,
	0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5,
	1, 2.5, 5, 10,
}

// Registry holds metrics and writes them. The zero value is not usable; call
// NewRegistry. It is safe for concurrent use.
type Registry struct {
	mu       sync.Mutex
	families []*family
	names    map[string]bool
}

// NewRegistry returns an empty Registry.
func NewRegistry() *Registry { return &Registry{names: make(map[string]bool)} }

type kind uint8

const (
	kindCounter kind = iota
	kindGauge
	kindHistogram
)

var kindNames = [...]string{"counter", "gauge", "histogram"}

// family is one metric name with its series.
type family struct {
	name    string
	help    string
	kind    kind
	labels  []string
	buckets []float64
	fn      func() float64 // GaugeFunc

	mu     sync.Mutex
	series []*series
	index  map[string]*series
}

// series is one combination of label values.
type series struct {
	labels string // rendered: {a="x",b="y"}, or ""
	value  atomic.Uint64
	hist   *Histogram
}

func (r *Registry) register(name, help string, k kind, buckets []float64, labels []string) *family {
	mustName(name, false)
	for _, l := range labels {
		mustName(l, true)
	}
	if k == kindHistogram {
		if len(buckets) == 0 || !slices.IsSorted(buckets) || slices.Contains(buckets, math.Inf(1)) {
			panic(fmt.Sprintf("metrics: %s: buckets must be sorted, finite and not empty", name))
		}
		if slices.Contains(labels, "le") {
			panic(fmt.Sprintf("metrics: %s: a histogram cannot have the label le", name))
		}
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.names[name] {
		panic(fmt.Sprintf("metrics: %s registered twice", name))
	}
	r.names[name] = true
	f := &family{name: name, help: help, kind: k, labels: slices.Clone(labels), buckets: slices.Clone(buckets), index: make(map[string]*series)}
	r.families = append(r.families, f)
	return f
}

func mustName(name string, label bool) {
	ok := name != ""
	for i, c := range name {
		switch {
		case c == '_' || c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z':
		case c >= '0' && c <= '9' && i > 0:
		case c == ':' && !label:
		default:
			ok = false
		}
	}
	if !ok || label && strings.HasPrefix(name, "__") {
		panic(fmt.Sprintf("metrics: invalid name %q", name))
	}
}

// with returns the series for values, creating it.
func (f *family) with(values []string) *series {
	if len(values) != len(f.labels) {
		panic(fmt.Sprintf("metrics: %s has %d labels, got %d values", f.name, len(f.labels), len(values)))
	}
	var b strings.Builder
	if len(values) > 0 {
		b.WriteByte('{')
		for i, v := range values {
			if i > 0 {
				b.WriteByte(',')
			}
			b.WriteString(f.labels[i])
			b.WriteString(`="`)
			writeEscaped(&b, v, true)
			b.WriteByte('"')
		}
		b.WriteByte('}')
	}
	key := b.String()
	f.mu.Lock()
	defer f.mu.Unlock()
	if s, ok := f.index[key]; ok {
		return s
	}
	s := &series{labels: key}
	if f.kind == kindHistogram {
		s.hist = &Histogram{upper: f.buckets, counts: make([]atomic.Uint64, len(f.buckets)+1)}
	}
	f.index[key] = s
	f.series = append(f.series, s)
	return s
}

// writeEscaped writes s escaped for a label value (quotes too) or a HELP
// line.
func writeEscaped(b *strings.Builder, s string, quote bool) {
	for i := 0; i < len(s); i++ {
		switch c := s[i]; {
		case c == '\\':
			b.WriteString(`\\`)
		case c == '\n':
			b.WriteString(`\n`)
		case c == '"' && quote:
			b.WriteString(`\"`)
		default:
			b.WriteByte(c)
		}
	}
}

// Counter is a monotonically increasing count.
type Counter struct{ s *series }

// Inc adds one.
func (c *Counter) Inc() { c.s.value.Add(1) }

// Add adds n.
func (c *Counter) Add(n uint64) { c.s.value.Add(n) }

// Value returns the count.
func (c *Counter) Value() uint64 { return c.s.value.Load() }

// Counter registers a counter without labels.
func (r *Registry) Counter(name, help string) *Counter {
	return &Counter{r.register(name, help, kindCounter, nil, nil).with(nil)}
}

// CounterVec is a counter with labels.
type CounterVec struct{ f *family }

// CounterVec registers a counter with the given label names.
func (r *Registry) CounterVec(name, help string, labels ...string) *CounterVec {
	return &CounterVec{r.register(name, help, kindCounter, nil, labels)}
}

// With returns the counter for the label values, in the order of the label
// names, creating it at zero. Keep the result: With takes a lock and
// allocates.
func (v *CounterVec) With(values ...string) *Counter { return &Counter{v.f.with(values)} }

// Gauge is a value that goes up and down.
type Gauge struct{ s *series }

// Set sets the gauge.
func (g *Gauge) Set(v float64) { g.s.value.Store(math.Float64bits(v)) }

// Add adds d (which may be negative).
func (g *Gauge) Add(d float64) { addFloat(&g.s.value, d) }

// Value returns the gauge's value.
func (g *Gauge) Value() float64 { return math.Float64frombits(g.s.value.Load()) }

// Gauge registers a gauge without labels.
func (r *Registry) Gauge(name, help string) *Gauge {
	return &Gauge{r.register(name, help, kindGauge, nil, nil).with(nil)}
}

// GaugeVec is a gauge with labels.
type GaugeVec struct{ f *family }

// GaugeVec registers a gauge with the given label names.
func (r *Registry) GaugeVec(name, help string, labels ...string) *GaugeVec {
	return &GaugeVec{r.register(name, help, kindGauge, nil, labels)}
}

// With returns the gauge for the label values, creating it at zero.
func (v *GaugeVec) With(values ...string) *Gauge { return &Gauge{v.f.with(values)} }

// GaugeFunc registers a gauge without labels whose value fn returns when
// the metrics are written. fn must be safe for concurrent use.
func (r *Registry) GaugeFunc(name, help string, fn func() float64) {
	f := r.register(name, help, kindGauge, nil, nil)
	f.fn = fn
	f.with(nil)
}

func addFloat(u *atomic.Uint64, d float64) {
	for {
		old := u.Load()
		if u.CompareAndSwap(old, math.Float64bits(math.Float64frombits(old)+d)) {
			return
		}
	}
}

// Histogram counts observations in buckets.
type Histogram struct {
	upper  []float64       // bucket upper bounds; +Inf is implicit
	counts []atomic.Uint64 // per bucket, not cumulative; the last is +Inf
	sum    atomic.Uint64   // float64 bits
}

// Observe records v.
func (h *Histogram) Observe(v float64) {
	i, _ := slices.BinarySearch(h.upper, v) // first bound >= v: le is inclusive
	h.counts[i].Add(1)
	addFloat(&h.sum, v)
}

// ObserveDuration records d in seconds.
func (h *Histogram) ObserveDuration(d time.Duration) { h.Observe(d.Seconds()) }

// Count returns the number of observations.
func (h *Histogram) Count() uint64 {
	var n uint64
	for i := range h.counts {
		n += h.counts[i].Load()
	}
	return n
}

// Histogram registers a histogram without labels, with the given bucket
// upper bounds (sorted; +Inf is added).
func (r *Registry) Histogram(name, help string, buckets []float64) *Histogram {
	return r.register(name, help, kindHistogram, buckets, nil).with(nil).hist
}

// HistogramVec is a histogram with labels.
type HistogramVec struct{ f *family }

// HistogramVec registers a histogram with the given bucket upper bounds and
// label names.
func (r *Registry) HistogramVec(name, help string, buckets []float64, labels ...string) *HistogramVec {
	return &HistogramVec{r.register(name, help, kindHistogram, buckets, labels)}
}

// With returns the histogram for the label values, creating it empty.
func (v *HistogramVec) With(values ...string) *Histogram { return v.f.with(values).hist }

// Write writes every metric in the text exposition format, in the order
// they were registered, each family's series in the order they were
// created.
func (r *Registry) Write(w io.Writer) error {
	r.mu.Lock()
	families := slices.Clone(r.families)
	r.mu.Unlock()
	bw := bufio.NewWriter(w)
	var b strings.Builder
	for _, f := range families {
		f.mu.Lock()
		series := slices.Clone(f.series)
		f.mu.Unlock()
		b.Reset()
		b.WriteString("# HELP ")
		b.WriteString(f.name)
		b.WriteByte(' ')
		writeEscaped(&b, f.help, false)
		b.WriteString("\n# TYPE ")
		b.WriteString(f.name)
		b.WriteByte(' ')
		b.WriteString(kindNames[f.kind])
		b.WriteByte('\n')
		for _, s := range series {
			switch {
			case f.kind == kindHistogram:
				writeHistogram(&b, f, s)
			case f.fn != nil:
				writeSample(&b, f.name, s.labels, f.fn())
			case f.kind == kindCounter:
				b.WriteString(f.name)
				b.WriteString(s.labels)
				b.WriteByte(' ')
				b.WriteString(strconv.FormatUint(s.value.Load(), 10))
				b.WriteByte('\n')
			default:
				writeSample(&b, f.name, s.labels, math.Float64frombits(s.value.Load()))
			}
		}
		if _, err := bw.WriteString(b.String()); err != nil {
			return err
		}
	}
	return bw.Flush()
}

func writeSample(b *strings.Builder, name, labels string, v float64) {
	b.WriteString(name)
	b.WriteString(labels)
	b.WriteByte(' ')
	b.WriteString(formatFloat(v))
	b.WriteByte('\n')
}

func writeHistogram(b *strings.Builder, f *family, s *series) {
	h := s.hist
	// With labels, le joins them inside the braces.
	prefix := f.name + "_bucket{"
	if s.labels != "" {
		prefix += s.labels[1:len(s.labels)-1] + ","
	}
	var cum uint64
	for i := range h.counts {
		cum += h.counts[i].Load()
		le := "+Inf"
		if i < len(h.upper) {
			le = formatFloat(h.upper[i])
		}
		b.WriteString(prefix)
		b.WriteString(`le="`)
		b.WriteString(le)
		b.WriteString(`"} `)
		b.WriteString(strconv.FormatUint(cum, 10))
		b.WriteByte('\n')
	}
	writeSample(b, f.name+"_sum", s.labels, math.Float64frombits(h.sum.Load()))
	b.WriteString(f.name + "_count")
	b.WriteString(s.labels)
	b.WriteByte(' ')
	b.WriteString(strconv.FormatUint(cum, 10))
	b.WriteByte('\n')
}

func formatFloat(v float64) string {
	switch {
	case math.IsInf(v, 1):
		return "+Inf"
	case math.IsInf(v, -1):
		return "-Inf"
	case math.IsNaN(v):
		return "NaN"
	}
	return strconv.FormatFloat(v, 'g', -1, 64)
}

// ContentType is the media type of the text exposition format.
const ContentType = "text/plain; version=0.0.4; charset=utf-8"

// Handler returns a handler that serves the metrics.
func (r *Registry) Handler() http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", ContentType)
		_ = r.Write(w)
	})
}
