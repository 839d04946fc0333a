package otelidem

import (
	"context"
	"errors"
	"time"

	"github.com/idemgo/idem/storekit"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"
)

// ScopeName is the instrumentation scope of the tracer the decorator uses.
const ScopeName = "github.com/idemgo/idem/otelidem"

// The span names, one per store method.
const (
	SpanAcquire  = "idem.acquire"
	SpanComplete = "idem.complete"
	SpanFail     = "idem.fail"
	SpanExtend   = "idem.extend"
	SpanRelease  = "idem.release"
	SpanGet      = "idem.get"
	SpanDelete   = "idem.delete"
	SpanWatch    = "idem.watch"
	// SpanAcquireBatch and SpanCompleteBatch cover one batch call of a
	// store that batches (storekit.BatchStore); a store that does not batch
	// gets one Acquire or Complete span per key under them.
	SpanAcquireBatch  = "idem.acquire_batch"
	SpanCompleteBatch = "idem.complete_batch"
)

// The attribute keys the spans carry.
const (
	// KeyDigest is the store key: a digest made by idem.Key.Digest, never
	// the raw idempotency key. Every span has it.
	KeyDigest = attribute.Key("idem.key_digest")
	// KeyOutcome is Acquire's outcome: acquired, taken-over, in-progress,
	// replay or mismatch.
	KeyOutcome = attribute.Key("idem.outcome")
	// KeyFence is the fencing token of the lease handed out (Acquire) or
	// passed (Complete, Fail, Extend, Release), or the record's (Get).
	KeyFence = attribute.Key("idem.fence")
	// KeyBatchSize is the number of keys of a batch call.
	KeyBatchSize = attribute.Key("idem.batch_size")
	// KeyAttempts is the record's number of acquisitions (Acquire, Get).
	KeyAttempts = attribute.Key("idem.attempts")
	// KeyState is the state the record moved to (Fail), was in (Acquire's
	// replay, Get).
	KeyState = attribute.Key("idem.state")
	// KeyFound is false on a Get of an absent record.
	KeyFound = attribute.Key("idem.found")
)

// Option configures Store.
type Option func(*config)

type config struct {
	tp    trace.TracerProvider
	mp    metric.MeterProvider
	prop  propagation.TextMapPropagator
	attrs []attribute.KeyValue
}

// WithTracerProvider sets the provider of the tracer. The default is the
// global one, otel.GetTracerProvider(), read when Store is called; a nil tp
// also means the global one.
func WithTracerProvider(tp trace.TracerProvider) Option {
	return func(c *config) { c.tp = tp }
}

// WithMeterProvider sets the provider of the meter that Metrics uses. The
// default is the global one, otel.GetMeterProvider(), read when NewMetrics
// is called; a nil mp also means the global one.
func WithMeterProvider(mp metric.MeterProvider) Option {
	return func(c *config) { c.mp = mp }
}

// WithPropagator sets how a ProxyTracer reads and writes the trace
// context of requests. The default is the global propagator,
// otel.GetTextMapPropagator(), read when NewProxyTracer is called.
func WithPropagator(p propagation.TextMapPropagator) Option {
	return func(c *config) { c.prop = p }
}

// WithAttributes adds attrs to every span and measurement, for example the store's kind or
// the name of the service that uses it. The default is none.
func WithAttributes(attrs ...attribute.KeyValue) Option {
	return func(c *config) { c.attrs = append(c.attrs, attrs...) }
}

// Store returns inner decorated with one span per call, of kind client,
// started as a child of the span in the call's context. A call's error is
// recorded on its span (RecordError and status Error), except ErrNotFound
// from Get, which only sets idem.found=false. ErrLeaseLost counts as an
// error. The decorator returns inner's results and errors unchanged and is
// safe for concurrent use as inner is.
//
// If inner implements storekit.Watcher (or unwraps to one, see storekit.StoreAs),
// so does the returned store (Watch gets
// a span too), so that Executor.Await keeps being woken rather than
// polling. That is why Store returns the interface and not a concrete type:
// the type differs by whether inner watches.
func Store(inner storekit.Store, opts ...Option) storekit.Store {
	var c config
	for _, o := range opts {
		o(&c)
	}
	if c.tp == nil {
		c.tp = otel.GetTracerProvider()
	}
	s := tracedStore{
		inner:  inner,
		tracer: c.tp.Tracer(ScopeName),
		attrs:  c.attrs,
	}
	if w, ok := storekit.StoreAs[storekit.Watcher](inner); ok {
		return &watchingStore{tracedStore: s, w: w}
	}
	return &s
}

// tracedStore is the decorator of a store that does not watch.
type tracedStore struct {
	inner  storekit.Store
	tracer trace.Tracer
	attrs  []attribute.KeyValue
}

// watchingStore is the decorator of a store that is also a storekit.Watcher.
type watchingStore struct {
	tracedStore
	w storekit.Watcher
}

var (
	_ storekit.Store      = (*tracedStore)(nil)
	_ storekit.Store      = (*watchingStore)(nil)
	_ storekit.Watcher    = (*watchingStore)(nil)
	_ storekit.BatchStore = (*tracedStore)(nil)
	_ storekit.Unwrapper  = (*tracedStore)(nil)
)

// Unwrap returns the decorated store, so that storekit.StoreAs finds the
// capabilities the decorator does not trace itself.
func (s *tracedStore) Unwrap() storekit.Store { return s.inner }

// AcquireBatch implements storekit.BatchStore with one span for the batch: a
// store that batches keeps its one round trip under the decorator; one
// that does not gets one Acquire per key.
func (s *tracedStore) AcquireBatch(ctx context.Context, keys []string, reqs []storekit.AcquireRequest) ([]storekit.Acquisition, []error) {
	ctx, span := s.tracer.Start(ctx, SpanAcquireBatch, trace.WithSpanKind(trace.SpanKindClient),
		trace.WithAttributes(append([]attribute.KeyValue{KeyBatchSize.Int(len(keys))}, s.attrs...)...))
	defer span.End()
	if bs, ok := storekit.StoreAs[storekit.BatchStore](s.inner); ok {
		out, errs := bs.AcquireBatch(ctx, keys, reqs)
		recordFirst(span, errs)
		return out, errs
	}
	out := make([]storekit.Acquisition, len(keys))
	errs := make([]error, len(keys))
	for i, k := range keys {
		if i < len(reqs) {
			out[i], errs[i] = s.Acquire(ctx, k, reqs[i])
		}
	}
	return out, errs
}

// CompleteBatch implements storekit.BatchStore as AcquireBatch does.
func (s *tracedStore) CompleteBatch(ctx context.Context, keys []string, leases []storekit.Lease, results [][]byte, retention time.Duration) []error {
	ctx, span := s.tracer.Start(ctx, SpanCompleteBatch, trace.WithSpanKind(trace.SpanKindClient),
		trace.WithAttributes(append([]attribute.KeyValue{KeyBatchSize.Int(len(keys))}, s.attrs...)...))
	defer span.End()
	if bs, ok := storekit.StoreAs[storekit.BatchStore](s.inner); ok {
		errs := bs.CompleteBatch(ctx, keys, leases, results, retention)
		recordFirst(span, errs)
		return errs
	}
	errs := make([]error, len(keys))
	for i, k := range keys {
		if i < len(leases) && i < len(results) {
			errs[i] = s.Complete(ctx, k, leases[i], results[i], retention)
		}
	}
	return errs
}

// recordFirst records the first error of a batch on its span.
func recordFirst(span trace.Span, errs []error) {
	for _, err := range errs {
		if err != nil {
			span.RecordError(err)
			span.SetStatus(codes.Error, err.Error())
			return
		}
	}
}

func (s *tracedStore) start(ctx context.Context, name, key string) (context.Context, trace.Span) {
	attrs := make([]attribute.KeyValue, 0, len(s.attrs)+1)
	attrs = append(attrs, KeyDigest.String(key))
	attrs = append(attrs, s.attrs...)
	return s.tracer.Start(ctx, name, trace.WithSpanKind(trace.SpanKindClient), trace.WithAttributes(attrs...))
}

// end records err on span, if any, and ends it.
func end(span trace.Span, err error) {
	if err != nil {
		span.RecordError(err)
		span.SetStatus(codes.Error, err.Error())
	}
	span.End()
}

func (s *tracedStore) Acquire(ctx context.Context, key string, req storekit.AcquireRequest) (storekit.Acquisition, error) {
	ctx, span := s.start(ctx, SpanAcquire, key)
	a, err := s.inner.Acquire(ctx, key, req)
	if err == nil && span.IsRecording() {
		span.SetAttributes(KeyOutcome.String(a.Outcome.String()), KeyAttempts.Int(a.Attempts))
		switch a.Outcome {
		case storekit.Acquired, storekit.TakenOver:
			span.SetAttributes(KeyFence.Int64(a.Lease.Fence))
		case storekit.Replay:
			span.SetAttributes(KeyState.String(a.State.String()))
		}
	}
	end(span, err)
	return a, err
}

func (s *tracedStore) Complete(ctx context.Context, key string, lease storekit.Lease, result []byte, retention time.Duration) error {
	ctx, span := s.start(ctx, SpanComplete, key)
	span.SetAttributes(KeyFence.Int64(lease.Fence))
	err := s.inner.Complete(ctx, key, lease, result, retention)
	end(span, err)
	return err
}

func (s *tracedStore) Fail(ctx context.Context, key string, lease storekit.Lease, f storekit.Failure) (storekit.State, error) {
	ctx, span := s.start(ctx, SpanFail, key)
	span.SetAttributes(KeyFence.Int64(lease.Fence))
	st, err := s.inner.Fail(ctx, key, lease, f)
	if err == nil {
		span.SetAttributes(KeyState.String(st.String()))
	}
	end(span, err)
	return st, err
}

func (s *tracedStore) Extend(ctx context.Context, key string, lease storekit.Lease, d time.Duration) error {
	ctx, span := s.start(ctx, SpanExtend, key)
	span.SetAttributes(KeyFence.Int64(lease.Fence))
	err := s.inner.Extend(ctx, key, lease, d)
	end(span, err)
	return err
}

func (s *tracedStore) Release(ctx context.Context, key string, lease storekit.Lease, retention time.Duration) error {
	ctx, span := s.start(ctx, SpanRelease, key)
	span.SetAttributes(KeyFence.Int64(lease.Fence))
	err := s.inner.Release(ctx, key, lease, retention)
	end(span, err)
	return err
}

func (s *tracedStore) Get(ctx context.Context, key string) (storekit.Record, error) {
	ctx, span := s.start(ctx, SpanGet, key)
	r, err := s.inner.Get(ctx, key)
	switch {
	case err == nil:
		span.SetAttributes(KeyFound.Bool(true), KeyState.String(r.State.String()),
			KeyFence.Int64(r.Fence), KeyAttempts.Int(r.Attempts))
		end(span, nil)
	case errors.Is(err, storekit.ErrNotFound):
		// An absent record is an answer, not a failure.
		span.SetAttributes(KeyFound.Bool(false))
		end(span, nil)
	default:
		end(span, err)
	}
	return r, err
}

func (s *tracedStore) Delete(ctx context.Context, key string) error {
	ctx, span := s.start(ctx, SpanDelete, key)
	err := s.inner.Delete(ctx, key)
	end(span, err)
	return err
}

// Watch implements storekit.Watcher. Its span covers setting the watch up, not
// the wait that follows.
func (s *watchingStore) Watch(ctx context.Context, key string) (<-chan struct{}, func(), error) {
	ctx, span := s.start(ctx, SpanWatch, key)
	ch, stop, err := s.w.Watch(ctx, key)
	end(span, err)
	return ch, stop, err
}
