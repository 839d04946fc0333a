package prometheusidem

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/idemgo/idem/observe"
)

// DefaultBuckets are the histograms' bounds, in seconds: 50µs to 10s, fine
// enough to see the sub-millisecond cost of a store call.
var DefaultBuckets = []float64{
	0.00005, 0.0001, 0.00025, 0.0005,
	0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5,
	1, 2.5, 5, 10,
}

// DefaultMaxScopeKinds is the default of WithMaxScopeKinds.
const DefaultMaxScopeKinds = 100

// OtherScopeKind is the scope_kind label of the outcomes of the scope kinds
// beyond the limit of WithMaxScopeKinds.
const OtherScopeKind = "other"

// Option configures Metrics.
type Option func(*config)

type config struct {
	buckets  []float64
	maxKinds int
	kinds    []string
	constant prometheus.Labels
}

// WithBuckets sets the histograms' bounds, in seconds. The default is
// DefaultBuckets (50µs to 10s).
func WithBuckets(b []float64) Option { return func(c *config) { c.buckets = b } }

// WithMaxScopeKinds bounds the number of scope kinds (the scope_kind
// label) that get series of their own; the outcomes of others are counted
// under OtherScopeKind. It guards against a scope that holds request data
// (give such keys a Kind: idem.Key.Kind). The default is
// DefaultMaxScopeKinds (100).
func WithMaxScopeKinds(n int) Option { return func(c *config) { c.maxKinds = n } }

// WithScopeKinds creates the series of these scope kinds at once, at zero,
// so that dashboards and alerts see them before the first call (the idem
// proxy passes "http"). The default is none: a scope kind's series appear
// at its first outcome.
func WithScopeKinds(kinds ...string) Option {
	return func(c *config) { c.kinds = append(c.kinds, kinds...) }
}

// WithConstLabels adds labels with fixed values to every series, for
// example to tell two Executors apart. The default is none.
func WithConstLabels(l prometheus.Labels) Option { return func(c *config) { c.constant = l } }

// Metrics records the outcomes of Executors as Prometheus metrics. Its
// Observe method is an observe.Observer; it is a prometheus.Collector to
// register. The series:
//
//	idem_operations_total{outcome,scope_kind}                    counter
//	idem_operation_duration_seconds{outcome,scope_kind}          histogram
//	idem_operation_store_duration_seconds{scope_kind}            histogram
//	idem_operation_takeovers_total{scope_kind}                   counter
//
// outcome is observe.Outcome's name (executed, replayed, failed, in-progress,
// mismatch, released, abandoned, lease-lost, store-error, not-recorded).
// It is safe for concurrent use; one Metrics may observe several
// Executors.
type Metrics struct {
	outcomes  *prometheus.CounterVec
	durations *prometheus.HistogramVec
	store     *prometheus.HistogramVec
	takeovers *prometheus.CounterVec

	maxKinds int
	nkinds   atomic.Int64
	mu       sync.Mutex // creating a kind's series
	kinds    sync.Map   // scope kind → *kindSeries
	other    *kindSeries
}

// kindSeries are the series of one scope kind, resolved once so that an
// observation takes no lock and allocates nothing.
type kindSeries struct {
	outcomes  []prometheus.Counter  // by observe.Outcome
	durations []prometheus.Observer // by observe.Outcome
	store     prometheus.Observer
	takeovers prometheus.Counter
}

var _ prometheus.Collector = (*Metrics)(nil)

// New returns Metrics. Register it (prometheus.Registerer.Register) and
// pass its Observe method to the Executors: idem.WithObserver(m.Observe).
// It returns an error for an invalid option.
func New(opts ...Option) (*Metrics, error) {
	c := config{buckets: DefaultBuckets, maxKinds: DefaultMaxScopeKinds}
	for _, o := range opts {
		o(&c)
	}
	switch {
	case c.maxKinds < 1:
		return nil, errors.New("prometheusidem: the maximum of scope kinds must be at least 1")
	case len(c.buckets) == 0:
		return nil, errors.New("prometheusidem: no histogram buckets")
	}
	m := &Metrics{
		maxKinds: c.maxKinds,
		outcomes: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name:        "idem_operations_total",
			Help:        "Calls of an idem Executor (Do, Begin and the end of its attempt), by outcome and scope kind.",
			ConstLabels: c.constant,
		}, []string{"outcome", "scope_kind"}),
		durations: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:        "idem_operation_duration_seconds",
			Help:        "Time from the start of an Executor call to its outcome, the operation included, by outcome and scope kind.",
			Buckets:     c.buckets,
			ConstLabels: c.constant,
		}, []string{"outcome", "scope_kind"}),
		store: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:        "idem_operation_store_duration_seconds",
			Help:        "Time an Executor call spent in the store calls that acquire the key and end the attempt, by scope kind.",
			Buckets:     c.buckets,
			ConstLabels: c.constant,
		}, []string{"scope_kind"}),
		takeovers: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name:        "idem_operation_takeovers_total",
			Help:        "Attempts that took a key over from an owner whose lease had expired (it crashed, hung, or its outcome was unknown), by scope kind.",
			ConstLabels: c.constant,
		}, []string{"scope_kind"}),
	}
	m.other = m.series(OtherScopeKind)
	m.kinds.Store(OtherScopeKind, m.other)
	for _, k := range c.kinds {
		m.kind(k)
	}
	return m, nil
}

// series resolves the series of kind.
func (m *Metrics) series(kind string) *kindSeries {
	outcomes := observe.Outcomes()
	ks := &kindSeries{
		outcomes:  make([]prometheus.Counter, len(outcomes)+1),
		durations: make([]prometheus.Observer, len(outcomes)+1),
		store:     m.store.WithLabelValues(kind),
		takeovers: m.takeovers.WithLabelValues(kind),
	}
	for _, o := range outcomes {
		ks.outcomes[o] = m.outcomes.WithLabelValues(o.String(), kind)
		ks.durations[o] = m.durations.WithLabelValues(o.String(), kind)
	}
	return ks
}

// kind returns the series of kind, created at its first use; beyond the
// maximum of kinds, those of OtherScopeKind.
func (m *Metrics) kind(kind string) *kindSeries {
	if ks, ok := m.kinds.Load(kind); ok {
		return ks.(*kindSeries)
	}
	if m.nkinds.Load() >= int64(m.maxKinds) {
		return m.other
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if ks, ok := m.kinds.Load(kind); ok {
		return ks.(*kindSeries)
	}
	if m.nkinds.Load() >= int64(m.maxKinds) {
		return m.other
	}
	ks := m.series(kind)
	m.kinds.Store(kind, ks)
	m.nkinds.Add(1)
	return ks
}

// Observe records one outcome. It is an observe.Observer.
func (m *Metrics) Observe(_ context.Context, o observe.Observation) {
	ks := m.kind(o.ScopeKind)
	i := int(o.Outcome)
	if i <= 0 || i >= len(ks.outcomes) {
		return
	}
	ks.outcomes[i].Inc()
	ks.durations[i].Observe(o.Duration.Seconds())
	ks.store.Observe(o.StoreDuration.Seconds())
	if o.TakenOver {
		ks.takeovers.Inc()
	}
}

// Describe implements prometheus.Collector.
func (m *Metrics) Describe(ch chan<- *prometheus.Desc) {
	m.outcomes.Describe(ch)
	m.durations.Describe(ch)
	m.store.Describe(ch)
	m.takeovers.Describe(ch)
}

// Collect implements prometheus.Collector.
func (m *Metrics) Collect(ch chan<- prometheus.Metric) {
	m.outcomes.Collect(ch)
	m.durations.Collect(ch)
	m.store.Collect(ch)
	m.takeovers.Collect(ch)
}
