package main

import (
	"context"
	"errors"
	"net/http"
	"runtime"
	"sync/atomic"
	"time"

	"github.com/idemgo/idem"
	"github.com/idemgo/idem/idemhttp"
	"github.com/idemgo/idem/internal/metrics"
)

// observer holds the proxy's metrics. Every series is resolved when the
// proxy starts, so that recording takes no lock and allocates nothing.
type observer struct {
	reg *metrics.Registry
	// traced says that requests have spans, which get the outcome too.
	traced bool

	requests  []*metrics.Counter   // by idemhttp.Outcome
	durations []*metrics.Histogram // by idemhttp.Outcome
	overhead  *metrics.Histogram
	upstream  *metrics.Histogram
	passed    *metrics.Counter
	busy      *metrics.Counter
	inFlight  atomic.Int64

	upstreamErrors [upstreamFailureKinds]*metrics.Counter

	storeCalls   [storeOps]*metrics.Histogram
	storeErrors  [storeOps]*metrics.Counter
	leaseLost    [storeOps]*metrics.Counter
	acquisitions []*metrics.Counter // by idem.Outcome
	takeovers    *metrics.Counter
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
	reg := metrics.NewRegistry()
	o := &observer{reg: reg}
	reqs := reg.CounterVec("idem_requests_total",
		"Requests with a covered method, by what the idempotency layer did: executed (forwarded, response stored), replayed, conflict (409, in progress), mismatch (422), failed (422, key FAILED), rejected (400/413), released (forwarded, key released), abandoned (forwarded, outcome unknown, key left to its lease), not-recorded (forwarded, response not stored: 503 outcome unknown, key left to its lease), store-error (503), failed-open, no-key.",
		"outcome")
	durs := reg.HistogramVec("idem_request_duration_seconds",
		"Time from receiving a covered request to the end of its handling, upstream included, by outcome.",
		metrics.DurationBuckets, "outcome")
	for oc := idemhttp.Outcome(0); ; oc++ {
		name := oc.String()
		if oc > 0 && name == "invalid" {
			break
		}
		o.requests = append(o.requests, reqs.With(name))
		o.durations = append(o.durations, durs.With(name))
	}
	o.overhead = reg.Histogram("idem_overhead_seconds",
		"Time a forwarded request spent in the proxy outside the upstream call: reading the body, the store calls before and after.",
		metrics.DurationBuckets)
	o.upstream = reg.Histogram("idem_upstream_duration_seconds",
		"Time of the upstream call of forwarded covered requests, response body included.",
		metrics.DurationBuckets)
	o.passed = reg.Counter("idem_passthrough_requests_total",
		"Requests whose method the proxy does not cover (see --methods), forwarded untouched.")
	o.busy = reg.Counter("idem_busy_requests_total",
		"Requests answered 503 without being handled because --max-concurrent requests were in flight.")
	reg.GaugeFunc("idem_requests_in_flight", "Requests being handled.", func() float64 { return float64(o.inFlight.Load()) })
	uerr := reg.CounterVec("idem_upstream_errors_total",
		"Upstream calls that failed without a response: unreachable (never sent; key released, 502), timeout (sent; key left to its lease, 504), broken (sent; key left to its lease, 502).",
		"kind")
	for k := range upstreamFailureKinds {
		o.upstreamErrors[k] = uerr.With(upstreamFailureNames[k])
	}

	calls := reg.HistogramVec("idem_store_duration_seconds", "Duration of store calls, by operation.", metrics.DurationBuckets, "op")
	errs := reg.CounterVec("idem_store_errors_total", "Store calls that failed (not counting lease losses and absent records), by operation.", "op")
	lost := reg.CounterVec("idem_lease_lost_total", "Store calls refused because the caller no longer owned the key (ErrLeaseLost), by operation.", "op")
	for op := range storeOps {
		o.storeCalls[op] = calls.With(storeOpNames[op])
		o.storeErrors[op] = errs.With(storeOpNames[op])
		o.leaseLost[op] = lost.With(storeOpNames[op])
	}
	acq := reg.CounterVec("idem_store_acquire_total", "Acquire outcomes: acquired, taken-over, in-progress, replay, mismatch.", "outcome")
	for oc := idem.Outcome(0); ; oc++ {
		name := oc.String()
		if oc > 0 && name == "invalid" {
			break
		}
		o.acquisitions = append(o.acquisitions, acq.With(name))
	}
	o.takeovers = reg.Counter("idem_takeovers_total", "Keys taken over after their owner's lease expired (the owner crashed, hung, or its outcome was unknown).")
	reg.GaugeVec("idem_build_info", "The idem binary's version.", "version", "goversion").With(version(), runtime.Version()).Set(1)
	return o
}

// hook records one covered request.
func (o *observer) hook(r *http.Request, ev idemhttp.Event) {
	i := int(ev.Outcome)
	if i >= len(o.requests) {
		i = 0
	}
	o.requests[i].Inc()
	o.durations[i].ObserveDuration(ev.Duration)
	if o.traced {
		setOutcome(r.Context(), ev.Outcome.String())
	}
	if x := exchangeFrom(r.Context()); x != nil && x.upstreamTime > 0 {
		o.upstream.ObserveDuration(x.upstreamTime)
		o.overhead.ObserveDuration(max(ev.Duration-x.upstreamTime, 0))
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
	s.o.storeCalls[op].ObserveDuration(time.Since(start))
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
