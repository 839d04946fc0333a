package otelidem_test

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/idemgo/idem"
	"github.com/idemgo/idem/adapterkit"
	"github.com/idemgo/idem/memstore"
	"github.com/idemgo/idem/otelidem"
	"github.com/idemgo/idem/storekit"
	"github.com/idemgo/idem/storetest"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"
)

// newTraced returns a memstore decorated with otelidem and the recorder of
// its spans.
func newTraced(t *testing.T, opts ...otelidem.Option) (storekit.Store, *tracetest.SpanRecorder) {
	t.Helper()
	ms, err := memstore.New()
	if err != nil {
		t.Fatal(err)
	}
	rec := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec))
	t.Cleanup(func() { _ = tp.Shutdown(context.Background()) })
	return otelidem.Store(ms, append([]otelidem.Option{otelidem.WithTracerProvider(tp)}, opts...)...), rec
}

func attrs(s sdktrace.ReadOnlySpan) map[attribute.Key]attribute.Value {
	m := make(map[attribute.Key]attribute.Value)
	for _, kv := range s.Attributes() {
		m[kv.Key] = kv.Value
	}
	return m
}

// lastSpan returns the last ended span, which must be named name.
func lastSpan(t *testing.T, rec *tracetest.SpanRecorder, name string) sdktrace.ReadOnlySpan {
	t.Helper()
	ended := rec.Ended()
	if len(ended) == 0 {
		t.Fatalf("no span ended, want %s", name)
	}
	s := ended[len(ended)-1]
	if s.Name() != name {
		t.Fatalf("got span %q, want %q", s.Name(), name)
	}
	if s.SpanKind() != trace.SpanKindClient {
		t.Errorf("span %s: got kind %v, want client", name, s.SpanKind())
	}
	return s
}

func wantAttr(t *testing.T, s sdktrace.ReadOnlySpan, key attribute.Key, want attribute.Value) {
	t.Helper()
	got, ok := attrs(s)[key]
	if !ok {
		t.Errorf("span %s: no attribute %s, want %s", s.Name(), key, want.Emit())
		return
	}
	if got != want {
		t.Errorf("span %s: got %s=%s, want %s", s.Name(), key, got.Emit(), want.Emit())
	}
}

func wantNoError(t *testing.T, s sdktrace.ReadOnlySpan) {
	t.Helper()
	if s.Status().Code == codes.Error {
		t.Errorf("span %s: got status Error (%s), want unset", s.Name(), s.Status().Description)
	}
	for _, ev := range s.Events() {
		if ev.Name == "exception" {
			t.Errorf("span %s: got an exception event, want none", s.Name())
		}
	}
}

func wantError(t *testing.T, s sdktrace.ReadOnlySpan, target error) {
	t.Helper()
	if s.Status().Code != codes.Error {
		t.Errorf("span %s: got status %v, want Error", s.Name(), s.Status().Code)
	}
	if s.Status().Description != target.Error() && !errors.Is(target, idem.ErrInvalid) {
		t.Errorf("span %s: got status description %q, want %q", s.Name(), s.Status().Description, target.Error())
	}
	var found bool
	for _, ev := range s.Events() {
		if ev.Name == "exception" {
			found = true
		}
	}
	if !found {
		t.Errorf("span %s: no exception event, want RecordError's", s.Name())
	}
}

func acquireReq(owner string) storekit.AcquireRequest {
	return storekit.AcquireRequest{Fingerprint: "fp", Owner: owner, Lease: time.Minute, Retention: time.Hour}
}

func TestSpans(t *testing.T) {
	ctx := t.Context()
	st, rec := newTraced(t, otelidem.WithAttributes(attribute.String("service", "test")))
	key := idem.Key{Scope: "s", ID: "k1"}.Digest()

	a, err := st.Acquire(ctx, key, acquireReq("o1"))
	if err != nil || a.Outcome != storekit.Acquired {
		t.Fatalf("Acquire: got %v, %v, want acquired", a.Outcome, err)
	}
	s := lastSpan(t, rec, "idem.acquire")
	wantAttr(t, s, otelidem.KeyDigest, attribute.StringValue(key))
	wantAttr(t, s, otelidem.KeyOutcome, attribute.StringValue("acquired"))
	wantAttr(t, s, otelidem.KeyFence, attribute.Int64Value(a.Lease.Fence))
	wantAttr(t, s, otelidem.KeyAttempts, attribute.IntValue(1))
	wantAttr(t, s, "service", attribute.StringValue("test"))
	wantNoError(t, s)

	// The same key from another owner while it is held.
	if a2, err := st.Acquire(ctx, key, acquireReq("o2")); err != nil || a2.Outcome != storekit.InProgress {
		t.Fatalf("Acquire: got %v, %v, want in-progress", a2.Outcome, err)
	}
	wantAttr(t, lastSpan(t, rec, "idem.acquire"), otelidem.KeyOutcome, attribute.StringValue("in-progress"))

	if err := st.Extend(ctx, key, a.Lease, time.Minute); err != nil {
		t.Fatal(err)
	}
	s = lastSpan(t, rec, "idem.extend")
	wantAttr(t, s, otelidem.KeyFence, attribute.Int64Value(a.Lease.Fence))
	wantNoError(t, s)

	if err := st.Complete(ctx, key, a.Lease, []byte("result"), time.Hour); err != nil {
		t.Fatal(err)
	}
	s = lastSpan(t, rec, "idem.complete")
	wantAttr(t, s, otelidem.KeyDigest, attribute.StringValue(key))
	wantAttr(t, s, otelidem.KeyFence, attribute.Int64Value(a.Lease.Fence))
	wantNoError(t, s)

	if a3, err := st.Acquire(ctx, key, acquireReq("o3")); err != nil || a3.Outcome != storekit.Replay {
		t.Fatalf("Acquire: got %v, %v, want replay", a3.Outcome, err)
	}
	s = lastSpan(t, rec, "idem.acquire")
	wantAttr(t, s, otelidem.KeyOutcome, attribute.StringValue("replay"))
	wantAttr(t, s, otelidem.KeyState, attribute.StringValue("COMPLETED"))

	mm := acquireReq("o4")
	mm.Fingerprint = "other"
	if a4, err := st.Acquire(ctx, key, mm); err != nil || a4.Outcome != storekit.Mismatch {
		t.Fatalf("Acquire: got %v, %v, want mismatch", a4.Outcome, err)
	}
	wantAttr(t, lastSpan(t, rec, "idem.acquire"), otelidem.KeyOutcome, attribute.StringValue("mismatch"))

	r, err := st.Get(ctx, key)
	if err != nil {
		t.Fatal(err)
	}
	s = lastSpan(t, rec, "idem.get")
	wantAttr(t, s, otelidem.KeyFound, attribute.BoolValue(true))
	wantAttr(t, s, otelidem.KeyState, attribute.StringValue("COMPLETED"))
	wantAttr(t, s, otelidem.KeyFence, attribute.Int64Value(r.Fence))
	wantNoError(t, s)

	if err := st.Delete(ctx, key); err != nil {
		t.Fatal(err)
	}
	s = lastSpan(t, rec, "idem.delete")
	wantAttr(t, s, otelidem.KeyDigest, attribute.StringValue(key))
	wantNoError(t, s)

	// Get of an absent record: ErrNotFound is an answer, not an error.
	if _, err := st.Get(ctx, key); !errors.Is(err, storekit.ErrNotFound) {
		t.Fatalf("Get: got %v, want ErrNotFound", err)
	}
	s = lastSpan(t, rec, "idem.get")
	wantAttr(t, s, otelidem.KeyFound, attribute.BoolValue(false))
	wantNoError(t, s)
}

func TestFailAndRelease(t *testing.T) {
	ctx := t.Context()
	st, rec := newTraced(t)
	for _, tc := range []struct {
		name     string
		terminal bool
		want     string
	}{
		{"retryable", false, "RELEASED"},
		{"terminal", true, "FAILED"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			key := idem.Key{ID: tc.name}.Digest()
			a, err := st.Acquire(ctx, key, acquireReq("o1"))
			if err != nil {
				t.Fatal(err)
			}
			state, err := st.Fail(ctx, key, a.Lease, storekit.Failure{Terminal: tc.terminal, Retention: time.Hour})
			if err != nil {
				t.Fatal(err)
			}
			if state.String() != tc.want {
				t.Fatalf("Fail: got %v, want %s", state, tc.want)
			}
			s := lastSpan(t, rec, "idem.fail")
			wantAttr(t, s, otelidem.KeyState, attribute.StringValue(tc.want))
			wantAttr(t, s, otelidem.KeyFence, attribute.Int64Value(a.Lease.Fence))
			wantNoError(t, s)
		})
	}

	key := idem.Key{ID: "release"}.Digest()
	a, err := st.Acquire(ctx, key, acquireReq("o1"))
	if err != nil {
		t.Fatal(err)
	}
	if err := st.Release(ctx, key, a.Lease, time.Hour); err != nil {
		t.Fatal(err)
	}
	s := lastSpan(t, rec, "idem.release")
	wantAttr(t, s, otelidem.KeyFence, attribute.Int64Value(a.Lease.Fence))
	wantNoError(t, s)

	a2, err := st.Acquire(ctx, key, acquireReq("o2"))
	if err != nil || a2.Outcome != storekit.Acquired {
		t.Fatalf("Acquire after Release: got %v, %v, want acquired", a2.Outcome, err)
	}
}

func TestErrors(t *testing.T) {
	ctx := t.Context()
	st, rec := newTraced(t)
	key := idem.Key{ID: "k"}.Digest()
	a, err := st.Acquire(ctx, key, acquireReq("o1"))
	if err != nil {
		t.Fatal(err)
	}
	stale := storekit.Lease{Owner: "someone-else", Fence: a.Lease.Fence}

	for _, tc := range []struct {
		name string
		call func() error
		span string
	}{
		{"complete", func() error { return st.Complete(ctx, key, stale, nil, time.Hour) }, "idem.complete"},
		{"extend", func() error { return st.Extend(ctx, key, stale, time.Minute) }, "idem.extend"},
		{"release", func() error { return st.Release(ctx, key, stale, time.Hour) }, "idem.release"},
		{"fail", func() error {
			_, err := st.Fail(ctx, key, stale, storekit.Failure{Retention: time.Hour})
			return err
		}, "idem.fail"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := tc.call()
			if !errors.Is(err, idem.ErrLeaseLost) {
				t.Fatalf("got %v, want ErrLeaseLost", err)
			}
			wantError(t, lastSpan(t, rec, tc.span), err)
		})
	}

	t.Run("invalid", func(t *testing.T) {
		_, err := st.Acquire(ctx, key, storekit.AcquireRequest{Owner: "o"}) // no lease
		if !errors.Is(err, idem.ErrInvalid) {
			t.Fatalf("got %v, want ErrInvalid", err)
		}
		s := lastSpan(t, rec, "idem.acquire")
		wantError(t, s, err)
		if _, ok := attrs(s)[otelidem.KeyOutcome]; ok {
			t.Errorf("got an outcome on a failed Acquire, want none")
		}
	})
}

// plainStore hides the Watcher of the store it holds.
type plainStore struct{ storekit.Store }

func TestWatcherPreserved(t *testing.T) {
	ctx := t.Context()
	st, rec := newTraced(t)
	w, ok := st.(storekit.Watcher)
	if !ok {
		t.Fatal("the decorated memstore is not a storekit.Watcher, want one")
	}
	key := idem.Key{ID: "w"}.Digest()
	a, err := st.Acquire(ctx, key, acquireReq("o1"))
	if err != nil {
		t.Fatal(err)
	}
	changed, stop, err := w.Watch(ctx, key)
	if err != nil {
		t.Fatal(err)
	}
	defer stop()
	lastSpan(t, rec, "idem.watch")
	if err := st.Complete(ctx, key, a.Lease, []byte("x"), time.Hour); err != nil {
		t.Fatal(err)
	}
	select {
	case <-changed:
	case <-time.After(5 * time.Second):
		t.Fatal("Watch was not woken by Complete")
	}

	ms, err := memstore.New()
	if err != nil {
		t.Fatal(err)
	}
	if _, ok := otelidem.Store(plainStore{ms}).(storekit.Watcher); ok {
		t.Error("the decorated store without Watch is a storekit.Watcher, want not")
	}
	// A watcher beneath another wrapper (one that unwraps) is found too,
	// so Watch keeps its span.
	if _, ok := otelidem.Store(unwrapping{plainStore{ms}}).(storekit.Watcher); !ok {
		t.Error("the decorated store over a wrapper of memstore is not a storekit.Watcher, want one")
	}
}

// unwrapping hides the optional methods of the store it wraps and unwraps
// to it, as a decorator that follows storekit.Unwrapper does.
type unwrapping struct{ plainStore }

func (u unwrapping) Unwrap() storekit.Store { return u.Store }

// TestConformance runs the store conformance suite (optional capabilities
// included) on a decorated memstore, and on a decorated wrapper of one.
func TestConformance(t *testing.T) {
	for name, wrap := range map[string]func(*memstore.Store) storekit.Store{
		"memstore":         func(ms *memstore.Store) storekit.Store { return otelidem.Store(ms) },
		"wrapped memstore": func(ms *memstore.Store) storekit.Store { return otelidem.Store(unwrapping{plainStore{ms}}) },
	} {
		t.Run(name, func(t *testing.T) {
			storetest.Run(t, func(t *testing.T) storekit.Store {
				ms, err := memstore.New()
				if err != nil {
					t.Fatal(err)
				}
				return wrap(ms)
			})
		})
	}
}

// TestExecutorParent checks that the spans of an Executor's calls are
// children of the caller's span, and that Await still uses the watch.
func TestExecutorParent(t *testing.T) {
	ms, err := memstore.New()
	if err != nil {
		t.Fatal(err)
	}
	rec := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec))
	defer tp.Shutdown(context.Background())
	exec, err := idem.New(otelidem.Store(ms, otelidem.WithTracerProvider(tp)))
	if err != nil {
		t.Fatal(err)
	}
	ctx, parent := tp.Tracer("test").Start(t.Context(), "handler")
	for range 2 {
		if _, err := exec.Do(ctx, idem.Key{ID: "pay-1"}, "fp", func(context.Context) ([]byte, error) {
			return []byte("ok"), nil
		}); err != nil {
			t.Fatal(err)
		}
	}
	if err := exec.Await(ctx, idem.Key{ID: "pay-1"}); err != nil {
		t.Fatal(err)
	}
	parent.End()

	var names []string
	for _, s := range rec.Ended() {
		if s.Name() == "handler" {
			continue
		}
		names = append(names, s.Name())
		if s.Parent().SpanID() != parent.SpanContext().SpanID() {
			t.Errorf("span %s: got parent %v, want the handler's span %v", s.Name(), s.Parent().SpanID(), parent.SpanContext().SpanID())
		}
		if got := attrs(s)[otelidem.KeyDigest].AsString(); got != (idem.Key{ID: "pay-1"}).Digest() {
			t.Errorf("span %s: got key digest %q, want the key's digest", s.Name(), got)
		}
	}
	want := []string{"idem.acquire", "idem.complete", "idem.acquire", "idem.watch", "idem.get"}
	if len(names) != len(want) {
		t.Fatalf("got spans %q, want %q", names, want)
	}
	for i := range want {
		if names[i] != want[i] {
			t.Fatalf("got spans %q, want %q", names, want)
		}
	}
}

// batching is a memstore that batches (one call per batch), counting its
// batch calls.
type batching struct {
	*memstore.Store
	acquires, completes int
}

func (b *batching) AcquireBatch(ctx context.Context, keys []string, reqs []storekit.AcquireRequest) ([]storekit.Acquisition, []error) {
	b.acquires++
	out := make([]storekit.Acquisition, len(keys))
	errs := make([]error, len(keys))
	for i, k := range keys {
		out[i], errs[i] = b.Acquire(ctx, k, reqs[i])
	}
	return out, errs
}

func (b *batching) CompleteBatch(ctx context.Context, keys []string, leases []storekit.Lease, results [][]byte, retention time.Duration) []error {
	b.completes++
	errs := make([]error, len(keys))
	for i, k := range keys {
		errs[i] = b.Complete(ctx, k, leases[i], results[i], retention)
	}
	return errs
}

// TestBatchStorePreserved: a traced store keeps the batching of the store
// it decorates (the Executor's BeginBatch and CommitBatch make one call
// per batch through it), with one span per batch call.
func TestBatchStorePreserved(t *testing.T) {
	ms, err := memstore.New()
	if err != nil {
		t.Fatal(err)
	}
	inner := &batching{Store: ms}
	rec := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec))
	t.Cleanup(func() { _ = tp.Shutdown(context.Background()) })
	e, err := idem.New(otelidem.Store(inner, otelidem.WithTracerProvider(tp)))
	if err != nil {
		t.Fatal(err)
	}
	keys := []idem.Key{{ID: "a"}, {ID: "b"}, {ID: "c"}}
	began := adapterkit.BeginBatch(t.Context(), e, keys, make([]string, len(keys)))
	attempts := make([]*idem.Attempt, len(keys))
	for i, b := range began {
		if b.Err != nil {
			t.Fatal(b.Err)
		}
		attempts[i] = b.Attempt
	}
	for _, err := range adapterkit.CommitBatch(t.Context(), e, attempts, make([][]byte, len(keys))) {
		if err != nil {
			t.Fatal(err)
		}
	}
	if inner.acquires != 1 || inner.completes != 1 {
		t.Fatalf("batch calls reaching the store: %d acquires, %d completes; want 1 and 1", inner.acquires, inner.completes)
	}
	var names []string
	for _, s := range rec.Ended() {
		names = append(names, s.Name())
		wantAttr(t, s, otelidem.KeyBatchSize, attribute.IntValue(3))
	}
	if fmt.Sprint(names) != fmt.Sprint([]string{otelidem.SpanAcquireBatch, otelidem.SpanCompleteBatch}) {
		t.Fatalf("spans %v, want one per batch call", names)
	}
	if got, ok := storekit.StoreAs[*batching](otelidem.Store(inner)); !ok || got != inner {
		t.Fatal("StoreAs does not find the decorated store through Unwrap")
	}
}
