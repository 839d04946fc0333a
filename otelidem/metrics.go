package otelidem

import (
	"context"
	"slices"
	"sync"
	"sync/atomic"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"

	"github.com/idemgo/idem/observe"
)

// The instruments of Metrics.
const (
	// MetricOperations counts the Executor's outcomes ({operation}), with
	// the attributes idem.outcome and idem.scope.kind.
	MetricOperations = "idem.operations"
	// MetricOperationDuration is the time from the start of an Executor
	// call to its outcome, the operation included, in seconds, with the
	// attributes idem.outcome and idem.scope.kind.
	MetricOperationDuration = "idem.operation.duration"
	// MetricStoreDuration is the part of it spent in the store calls that
	// acquire the key and end the attempt, in seconds, with the attribute
	// idem.scope.kind.
	MetricStoreDuration = "idem.operation.store.duration"
	// MetricTakeovers counts the attempts that took a key over from an
	// owner whose lease had expired ({operation}), with the attribute
	// idem.scope.kind.
	MetricTakeovers = "idem.operation.takeovers"
)

// KeyScopeKind is the scope's kind (observe.Observation.ScopeKind): "http"
// for idemhttp, the scope name otherwise; never a key. The measurements of
// Metrics carry it, and KeyOutcome with observe.Outcome's name (executed,
// replayed, failed, in-progress, mismatch, released, abandoned,
// lease-lost, store-error, not-recorded).
const KeyScopeKind = attribute.Key("idem.scope.kind")

// DurationBuckets are the explicit bucket boundaries advised for the
// duration histograms, in seconds: 50µs to 10s.
var DurationBuckets = []float64{
	0.00005, 0.0001, 0.00025, 0.0005,
	0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5,
	1, 2.5, 5, 10,
}

// maxScopeKinds bounds the scope kinds with attributes of their own; the
// others are recorded as "other".
const maxScopeKinds = 100

// Metrics records the outcomes of Executors with the OpenTelemetry metrics
// API. Its Observe method is an observe.Observer: pass it to
// idem.WithObserver, and idemhttp and the consumer adapters built on the
// Executor are measured too. It is safe for concurrent use.
type Metrics struct {
	operations metric.Int64Counter
	duration   metric.Float64Histogram
	store      metric.Float64Histogram
	takeovers  metric.Int64Counter
	attrs      []attribute.KeyValue

	mu     sync.Mutex
	kinds  sync.Map // scope kind → *kindAttrs
	nkinds atomic.Int64
	other  *kindAttrs // of the kinds beyond maxScopeKinds
}

// kindAttrs holds the measurement options of one scope kind, made once so
// that a measurement allocates nothing.
type kindAttrs struct {
	add     [][]metric.AddOption    // by observe.Outcome
	record  [][]metric.RecordOption // by observe.Outcome
	kind    []metric.RecordOption
	kindAdd []metric.AddOption
}

// NewMetrics returns Metrics on a meter of the configured provider
// (WithMeterProvider), with WithAttributes added to every measurement. It
// returns the error of creating an instrument.
func NewMetrics(opts ...Option) (*Metrics, error) {
	var c config
	for _, o := range opts {
		o(&c)
	}
	if c.mp == nil {
		c.mp = otel.GetMeterProvider()
	}
	meter := c.mp.Meter(ScopeName)
	m := &Metrics{attrs: c.attrs}
	var err error
	if m.operations, err = meter.Int64Counter(MetricOperations, metric.WithUnit("{operation}"),
		metric.WithDescription("Calls of an idem Executor (Do, Begin and the end of its attempt), by outcome and scope kind.")); err != nil {
		return nil, err
	}
	if m.duration, err = meter.Float64Histogram(MetricOperationDuration, metric.WithUnit("s"),
		metric.WithDescription("Time from the start of an Executor call to its outcome, the operation included."),
		metric.WithExplicitBucketBoundaries(DurationBuckets...)); err != nil {
		return nil, err
	}
	if m.store, err = meter.Float64Histogram(MetricStoreDuration, metric.WithUnit("s"),
		metric.WithDescription("Time an Executor call spent in the store calls that acquire the key and end the attempt."),
		metric.WithExplicitBucketBoundaries(DurationBuckets...)); err != nil {
		return nil, err
	}
	if m.takeovers, err = meter.Int64Counter(MetricTakeovers, metric.WithUnit("{operation}"),
		metric.WithDescription("Attempts that took a key over from an owner whose lease had expired.")); err != nil {
		return nil, err
	}
	m.other = m.makeKind("other")
	m.kinds.Store("other", m.other)
	return m, nil
}

// kind returns the measurement options of kind, made at its first use;
// beyond maxScopeKinds, those of "other".
func (m *Metrics) kind(kind string) *kindAttrs {
	if ka, ok := m.kinds.Load(kind); ok {
		return ka.(*kindAttrs)
	}
	if m.nkinds.Load() >= maxScopeKinds {
		return m.other
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if ka, ok := m.kinds.Load(kind); ok {
		return ka.(*kindAttrs)
	}
	if m.nkinds.Load() >= maxScopeKinds {
		return m.other
	}
	ka := m.makeKind(kind)
	m.kinds.Store(kind, ka)
	m.nkinds.Add(1)
	return ka
}

// makeKind makes the measurement options of kind.
func (m *Metrics) makeKind(kind string) *kindAttrs {
	outcomes := observe.Outcomes()
	ka := &kindAttrs{
		add:    make([][]metric.AddOption, len(outcomes)+1),
		record: make([][]metric.RecordOption, len(outcomes)+1),
	}
	base := append(slices.Clip(m.attrs), KeyScopeKind.String(kind))
	set := metric.WithAttributeSet(attribute.NewSet(base...))
	ka.kind, ka.kindAdd = []metric.RecordOption{set}, []metric.AddOption{set}
	for _, o := range outcomes {
		set := metric.WithAttributeSet(attribute.NewSet(append(slices.Clip(base), KeyOutcome.String(o.String()))...))
		ka.add[o] = []metric.AddOption{set}
		ka.record[o] = []metric.RecordOption{set}
	}
	return ka
}

// Observe records one outcome. It is an observe.Observer.
func (m *Metrics) Observe(ctx context.Context, o observe.Observation) {
	ka := m.kind(o.ScopeKind)
	i := int(o.Outcome)
	if i <= 0 || i >= len(ka.add) {
		return
	}
	m.operations.Add(ctx, 1, ka.add[i]...)
	m.duration.Record(ctx, o.Duration.Seconds(), ka.record[i]...)
	m.store.Record(ctx, o.StoreDuration.Seconds(), ka.kind...)
	if o.TakenOver {
		m.takeovers.Add(ctx, 1, ka.kindAdd...)
	}
}
