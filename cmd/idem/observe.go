package main

import (
	"context"
	"errors"
	"net/http"
	"runtime"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/idemgo/idem"
	"github.com/idemgo/idem/idemhttp"
	"github.com/idemgo/idem/prometheusidem"
)

// observer holds the proxy's metrics: its own (the HTTP outcomes, the
// upstream, the store calls), and the Executor's (prometheusidem). Every
// series is resolved when the proxy starts, so that recording takes no
// lock and allocates nothing.
type observer struct {
	reg *prometheus.Registry
	// exec records the Executor's outcomes (idem.WithObserver).
	exec *prometheusidem.Metrics
	// traced says that requests have spans, which get the outcome too.
	traced bool

	requests  []prometheus.Counter  // by idemhttp.Outcome
	durations []prometheus.Observer // by idemhttp.Outcome
	overhead  prometheus.Observer
	upstream  prometheus.Observer
	passed    prometheus.Counter
	busy      prometheus.Counter
	inFlight  atomic.Int64

	upstreamErrors [upstreamFailureKinds]prometheus.Counter

	storeCalls   [storeOps]prometheus.Observer
	storeErrors  [storeOps]prometheus.Counter
	leaseLost    [storeOps]prometheus.Counter
	acquisitions []prometheus.Counter // by idem.Outcome
	takeovers    prometheus.Counter
}

// The store operations that are timed and counted.
const (
	opAcquire = iota
	opComplete
	opFail
	opExtend
	opRelease
	opGet
	opDelete
	opWatch
	storeOps
)

var storeOpNames = [storeOps]string{"acquire", "complete", "fail", "extend", "release", "get", "delete", "watch"}

func newObserver() *observer {
	reg := prometheus.NewRegistry()
	f := promauto{reg}
	exec, err := prometheusidem.New(prometheusidem.WithScopeKinds("http"))
	if err != nil {
		panic(err) // the options are fixed
	}
	reg.MustRegister(exec, collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	o := &observer{reg: reg, exec: exec}
	reqs := f.counterVec("idem_requests_total",
		"Requests with a covered method, by what the idempotency layer did: executed (forwarded, response stored), replayed, conflict (409, in progress), mismatch (422), failed (422, key FAILED), rejected (400/413), released (forwarded, key released), abandoned (forwarded, outcome unknown, key left to its lease), not-recorded (forwarded, response not stored: 503 outcome unknown, key left to its lease), store-error (503), failed-open, no-key.",
		"outcome")
	durs := f.histogramVec("idem_request_duration_seconds",
		"Time from receiving a covered request to the end of its handling, upstream included, by outcome.",
		"outcome")
	for oc := idemhttp.Outcome(0); ; oc++ {
		name := oc.String()
		if oc > 0 && name == "invalid" {
			break
		}
		o.requests = append(o.requests, reqs.WithLabelValues(name))
		o.durations = append(o.durations, durs.WithLabelValues(name))
	}
	o.overhead = f.histogramVec("idem_overhead_seconds",
		"Time a forwarded request spent in the proxy outside the upstream call: reading the body, the store calls before and after.").WithLabelValues()
	o.upstream = f.histogramVec("idem_upstream_duration_seconds",
		"Time of the upstream call of forwarded covered requests, response body included.").WithLabelValues()
	o.passed = f.counterVec("idem_passthrough_requests_total",
		"Requests whose method the proxy does not cover (see --methods), forwarded untouched.").WithLabelValues()
	o.busy = f.counterVec("idem_busy_requests_total",
		"Requests answered 503 without being handled because --max-concurrent requests were in flight.").WithLabelValues()
	reg.MustRegister(prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "idem_requests_in_flight", Help: "Requests being handled."},
		func() float64 { return float64(o.inFlight.Load()) }))
	uerr := f.counterVec("idem_upstream_errors_total",
		"Upstream calls that failed without a response: unreachable (never sent; key released, 502), timeout (sent; key left to its lease, 504), broken (sent; key left to its lease, 502).",
		"kind")
	for k := range upstreamFailureKinds {
		o.upstreamErrors[k] = uerr.WithLabelValues(upstreamFailureNames[k])
	}

	calls := f.histogramVec("idem_store_duration_seconds", "Duration of store calls, by operation.", "op")
	errs := f.counterVec("idem_store_errors_total", "Store calls that failed (not counting lease losses and absent records), by operation.", "op")
	lost := f.counterVec("idem_lease_lost_total", "Store calls refused because the caller no longer owned the key (ErrLeaseLost), by operation.", "op")
	for op := range storeOps {
		o.storeCalls[op] = calls.WithLabelValues(storeOpNames[op])
		o.storeErrors[op] = errs.WithLabelValues(storeOpNames[op])
		o.leaseLost[op] = lost.WithLabelValues(storeOpNames[op])
	}
	acq := f.counterVec("idem_store_acquire_total", "Acquire outcomes: acquired, taken-over, in-progress, replay, mismatch.", "outcome")
	for oc := idem.Outcome(0); ; oc++ {
		name := oc.String()
		if oc > 0 && name == "invalid" {
			break
		}
		o.acquisitions = append(o.acquisitions, acq.WithLabelValues(name))
	}
	o.takeovers = f.counterVec("idem_takeovers_total", "Keys taken over after their owner's lease expired (the owner crashed, hung, or its outcome was unknown).").WithLabelValues()
	build := prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "idem_build_info", Help: "The idem binary's version."}, []string{"version", "goversion"})
	build.WithLabelValues(version(), runtime.Version()).Set(1)
	reg.MustRegister(build)
	return o
}

// handler serves the metrics page.
func (o *observer) handler() http.Handler {
	return promhttp.HandlerFor(o.reg, promhttp.HandlerOpts{})
}

// promauto creates and registers the proxy's metric families.
type promauto struct{ reg *prometheus.Registry }

func (f promauto) counterVec(name, help string, labels ...string) *prometheus.CounterVec {
	v := prometheus.NewCounterVec(prometheus.CounterOpts{Name: name, Help: help}, labels)
	f.reg.MustRegister(v)
	return v
}

func (f promauto) histogramVec(name, help string, labels ...string) *prometheus.HistogramVec {
	v := prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: name, Help: help, Buckets: prometheusidem.DefaultBuckets}, labels)
	f.reg.MustRegister(v)
	return v
}

// hook records one covered request.
func (o *observer) hook(r *http.Request, ev idemhttp.Event) {
	i := int(ev.Outcome)
	if i >= len(o.requests) {
		i = 0
	}
	o.requests[i].Inc()
	o.durations[i].Observe(ev.Duration.Seconds())
	if o.traced {
		setOutcome(r.Context(), ev.Outcome.String())
	}
	if x := exchangeFrom(r.Context()); x != nil && x.upstreamTime > 0 {
		o.upstream.Observe(x.upstreamTime.Seconds())
		o.overhead.Observe(max(ev.Duration-x.upstreamTime, 0).Seconds())
	}
}

// instrumentedStore times the calls of a store and counts their errors,
// lease losses and takeovers.
type instrumentedStore struct {
	s idem.Store
	o *observer
}

// watchingStore is an instrumentedStore whose store is an idem.Watcher; the
// decorator must keep that, or Await would poll.
type watchingStore struct {
	instrumentedStore
	w idem.Watcher
}

var (
	_ idem.Store     = (*instrumentedStore)(nil)
	_ idem.Unwrapper = (*instrumentedStore)(nil)
	_ idem.Watcher   = (*watchingStore)(nil)
)

// Unwrap returns the instrumented store, so that the Executor finds its
// other capabilities (idem.StoreAs: EffectStore, Relayer, BatchStore);
// their calls are not timed.
func (s *instrumentedStore) Unwrap() idem.Store { return s.s }

func (o *observer) instrument(s idem.Store) idem.Store {
	is := instrumentedStore{s: s, o: o}
	if w, ok := idem.StoreAs[idem.Watcher](s); ok {
		return &watchingStore{instrumentedStore: is, w: w}
	}
	return &is
}

func (s *instrumentedStore) done(op int, start time.Time, err error) {
	s.o.storeCalls[op].Observe(time.Since(start).Seconds())
	switch {
	case err == nil, op == opGet && errors.Is(err, idem.ErrNotFound):
	case errors.Is(err, idem.ErrLeaseLost):
		s.o.leaseLost[op].Inc()
	default:
		s.o.storeErrors[op].Inc()
	}
}

func (s *instrumentedStore) Acquire(ctx context.Context, key string, req idem.AcquireRequest) (idem.Acquisition, error) {
	start := time.Now()
	a, err := s.s.Acquire(ctx, key, req)
	s.done(opAcquire, start, err)
	if err == nil && int(a.Outcome) < len(s.o.acquisitions) {
		s.o.acquisitions[a.Outcome].Inc()
		if a.Outcome == idem.TakenOver {
			s.o.takeovers.Inc()
		}
	}
	return a, err
}

func (s *instrumentedStore) Complete(ctx context.Context, key string, lease idem.Lease, result []byte, retention time.Duration) error {
	start := time.Now()
	err := s.s.Complete(ctx, key, lease, result, retention)
	s.done(opComplete, start, err)
	return err
}

func (s *instrumentedStore) Fail(ctx context.Context, key string, lease idem.Lease, f idem.Failure) (idem.State, error) {
	start := time.Now()
	st, err := s.s.Fail(ctx, key, lease, f)
	s.done(opFail, start, err)
	return st, err
}

func (s *instrumentedStore) Extend(ctx context.Context, key string, lease idem.Lease, d time.Duration) error {
	start := time.Now()
	err := s.s.Extend(ctx, key, lease, d)
	s.done(opExtend, start, err)
	return err
}

func (s *instrumentedStore) Release(ctx context.Context, key string, lease idem.Lease, retention time.Duration) error {
	start := time.Now()
	err := s.s.Release(ctx, key, lease, retention)
	s.done(opRelease, start, err)
	return err
}

func (s *instrumentedStore) Get(ctx context.Context, key string) (idem.Record, error) {
	start := time.Now()
	r, err := s.s.Get(ctx, key)
	s.done(opGet, start, err)
	return r, err
}

func (s *instrumentedStore) Delete(ctx context.Context, key string) error {
	start := time.Now()
	err := s.s.Delete(ctx, key)
	s.done(opDelete, start, err)
	return err
}

func (s *watchingStore) Watch(ctx context.Context, key string) (<-chan struct{}, func(), error) {
	start := time.Now()
	ch, stop, err := s.w.Watch(ctx, key)
	s.done(opWatch, start, err)
	return ch, stop, err
}
