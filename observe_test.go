package idem_test

import (
	"context"
	"errors"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/idemgo/idem"
	"github.com/idemgo/idem/adapterkit"
	"github.com/idemgo/idem/memstore"
	"github.com/idemgo/idem/observe"
	"github.com/idemgo/idem/redisstore"
	"github.com/idemgo/idem/testkit/redistest"

	"github.com/idemgo/idem/storekit"
)

// newRedisStore returns a redisstore on a new redis-server started with
// args, or skips the test where there is no redis-server.
func newRedisStore(t *testing.T, args ...string) *redisstore.Store {
	t.Helper()
	if err := redistest.Available(); err != nil {
		t.Skip(err)
	}
	srv := redistest.Start(t, args...)
	c := redis.NewClient(&redis.Options{Addr: srv.Addr()})
	t.Cleanup(func() { _ = c.Close() })
	s, err := redisstore.New(c)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// recorder is an Observer that keeps what it is told.
type recorder struct {
	mu  sync.Mutex
	obs []observe.Observation
}

func (r *recorder) observe(_ context.Context, o observe.Observation) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.obs = append(r.obs, o)
}

// take returns the observations since the last take.
func (r *recorder) take() []observe.Observation {
	r.mu.Lock()
	defer r.mu.Unlock()
	out := r.obs
	r.obs = nil
	return out
}

// faultStore is a store whose Acquire or Complete fail on demand.
type faultStore struct {
	idem.Store
	failAcquire, failComplete atomic.Bool
}

var errInjected = errors.New("injected store failure")

func (s *faultStore) Acquire(ctx context.Context, key string, req storekit.AcquireRequest) (storekit.Acquisition, error) {
	if s.failAcquire.Load() {
		return storekit.Acquisition{}, errInjected
	}
	return s.Store.Acquire(ctx, key, req)
}

func (s *faultStore) Complete(ctx context.Context, key string, lease idem.Lease, result []byte, retention time.Duration) error {
	if s.failComplete.Load() {
		return errInjected
	}
	return s.Store.Complete(ctx, key, lease, result, retention)
}

// TestObserverOutcomes checks, on memstore and on a real Redis, that every
// outcome is reported exactly once, with its scope kind and durations.
func TestObserverOutcomes(t *testing.T) {
	stores := map[string]func(t *testing.T) idem.Store{
		"memstore": func(t *testing.T) idem.Store {
			s, err := memstore.New()
			if err != nil {
				t.Fatal(err)
			}
			return s
		},
		"redisstore": func(t *testing.T) idem.Store { return newRedisStore(t) },
	}
	for name, newStore := range stores {
		t.Run(name, func(t *testing.T) { testObserverOutcomes(t, newStore(t)) })
	}
}

func testObserverOutcomes(t *testing.T, store idem.Store) {
	fs := &faultStore{Store: store}
	rec := &recorder{}
	const lease = 200 * time.Millisecond
	e, err := idem.New(fs, idem.WithObserver(rec.observe), idem.WithLease(lease))
	if err != nil {
		t.Fatal(err)
	}
	ctx := t.Context()
	ok := func(context.Context) ([]byte, error) { return []byte("v"), nil }
	n := 0
	key := func() idem.Key { n++; return idem.Key{Scope: "charge", ID: "k" + string(rune('a'+n))} }
	want := func(step string, o observe.Outcome) observe.Observation {
		t.Helper()
		got := rec.take()
		if len(got) != 1 || got[0].Outcome != o {
			outs := make([]string, len(got))
			for i, g := range got {
				outs[i] = g.Outcome.String()
			}
			t.Fatalf("%s: got outcomes %v, want exactly [%v]", step, outs, o)
		}
		if got[0].ScopeKind != "charge" {
			t.Errorf("%s: got scope kind %q, want %q", step, got[0].ScopeKind, "charge")
		}
		if got[0].Duration <= 0 || got[0].StoreDuration <= 0 || got[0].StoreDuration > got[0].Duration {
			t.Errorf("%s: got duration %v, store duration %v, want 0 < store <= total", step, got[0].Duration, got[0].StoreDuration)
		}
		return got[0]
	}

	k := key()
	if _, err := e.Do(ctx, k, "fp", ok); err != nil {
		t.Fatal(err)
	}
	if o := want("first Do", observe.Executed); o.TakenOver || o.Err != nil {
		t.Errorf("first Do: got taken over %v, err %v, want false, nil", o.TakenOver, o.Err)
	}
	if r, err := e.Do(ctx, k, "fp", ok); err != nil || !r.Replayed {
		t.Fatal(r, err)
	}
	want("second Do", observe.Replayed)
	if _, err := e.Do(ctx, k, "other", ok); !errors.Is(err, idem.ErrMismatch) {
		t.Fatal(err)
	}
	want("other fingerprint", observe.Mismatch)

	k = key()
	terminal := idem.Terminal(errors.New("card declined"))
	if _, err := e.Do(ctx, k, "fp", func(context.Context) ([]byte, error) { return nil, terminal }); !errors.Is(err, terminal) {
		t.Fatal(err)
	}
	if o := want("terminal error", observe.Executed); !errors.Is(o.Err, terminal) {
		t.Errorf("terminal error: got err %v, want %v", o.Err, terminal)
	}
	if _, err := e.Do(ctx, k, "fp", ok); !errors.Is(err, idem.ErrFailed) {
		t.Fatal(err)
	}
	want("FAILED key", observe.Failed)

	k = key()
	if _, err := e.Do(ctx, k, "fp", func(context.Context) ([]byte, error) { return nil, errors.New("retry me") }); err == nil {
		t.Fatal("retryable error: got nil")
	}
	want("retryable error", observe.Released)

	// In progress, then abandoned, then taken over once the lease ended.
	k = key()
	_, a, err := e.Begin(ctx, k, "fp")
	if err != nil {
		t.Fatal(err)
	}
	if got := rec.take(); len(got) != 0 {
		t.Fatalf("Begin that acquired: got %d observations, want none before the attempt ends", len(got))
	}
	if _, err := e.Do(ctx, k, "fp", ok); !errors.Is(err, idem.ErrInProgress) {
		t.Fatal(err)
	}
	want("key held", observe.InProgress)
	deadline := a.LeaseDeadline()
	if err := a.Abandon(t.Context(), observe.Abandoned); err != nil {
		t.Fatal(err)
	}
	want("Abandon", observe.Abandoned)
	// The store ends the lease after the local deadline, by the acquire's
	// one-way delay (well under a millisecond here).
	time.Sleep(time.Until(deadline) + 100*time.Millisecond)
	if _, err := e.Do(ctx, k, "fp", ok); err != nil {
		t.Fatal(err)
	}
	if o := want("takeover", observe.Executed); !o.TakenOver {
		t.Error("takeover: got storekit.TakenOver false, want true")
	}

	// Lease lost: the record is deleted under the attempt and acquired by
	// another caller.
	k = key()
	_, a, err = e.Begin(ctx, k, "fp")
	if err != nil {
		t.Fatal(err)
	}
	if err := store.Delete(ctx, k.Digest()); err != nil {
		t.Fatal(err)
	}
	if _, err := e.Do(ctx, k, "fp", ok); err != nil {
		t.Fatal(err)
	}
	want("second owner", observe.Executed)
	if err := a.Commit(ctx, []byte("late")); !errors.Is(err, idem.ErrLeaseLost) {
		t.Fatalf("Commit after the key was taken: got %v, want ErrLeaseLost", err)
	}
	want("first owner's Commit", observe.LeaseLost)
	if err := a.Commit(ctx, []byte("late")); !errors.Is(err, idem.ErrLeaseLost) {
		t.Fatal(err)
	}
	if got := rec.take(); len(got) != 0 {
		t.Errorf("second Commit of an ended attempt: got %d observations, want none", len(got))
	}

	// Store errors.
	fs.failAcquire.Store(true)
	if _, err := e.Do(ctx, key(), "fp", ok); !errors.Is(err, errInjected) {
		t.Fatal(err)
	}
	want("acquire failing", observe.StoreError)
	fs.failAcquire.Store(false)
	fs.failComplete.Store(true)
	_, a, err = e.Begin(ctx, key(), "fp")
	if err != nil {
		t.Fatal(err)
	}
	done, cancel := context.WithCancel(ctx)
	cancel() // no repetitions of the completion
	if err := a.Commit(done, []byte("v")); !errors.Is(err, errInjected) {
		t.Fatal(err)
	}
	want("complete failing", observe.NotRecorded)
	fs.failComplete.Store(false)

	// Invalid input is the caller's mistake, not an outcome.
	if _, err := e.Do(ctx, idem.Key{}, "fp", ok); !errors.Is(err, idem.ErrInvalid) {
		t.Fatal(err)
	}
	if got := rec.take(); len(got) != 0 {
		t.Errorf("invalid key: got %d observations, want none", len(got))
	}
}

// TestObserverKind checks that Key.Kind replaces the scope in
// observations, and is not part of the key.
func TestObserverKind(t *testing.T) {
	rec := &recorder{}
	e, _ := newExec(t, idem.WithObserver(rec.observe))
	ok := func(context.Context) ([]byte, error) { return []byte("v"), nil }
	if _, err := e.Do(t.Context(), idem.Key{Scope: "POST u:/orders/1", ID: "a", Kind: "http"}, "fp", ok); err != nil {
		t.Fatal(err)
	}
	r, err := e.Do(t.Context(), idem.Key{Scope: "POST u:/orders/1", ID: "a"}, "fp", ok)
	if err != nil || !r.Replayed {
		t.Fatalf("the same key without Kind: got %+v, %v, want a replay", r, err)
	}
	got := rec.take()
	kinds := []string{got[0].ScopeKind, got[1].ScopeKind}
	if !slices.Equal(kinds, []string{"http", "POST u:/orders/1"}) {
		t.Errorf("got scope kinds %q, want [http, POST u:/orders/1]", kinds)
	}
}

// TestObserverBatch checks that BeginBatch and CommitBatch report each key
// once.
func TestObserverBatch(t *testing.T) {
	rec := &recorder{}
	e, _ := newExec(t, idem.WithObserver(rec.observe))
	ctx := t.Context()
	keys := []idem.Key{{Scope: "b", ID: "1"}, {Scope: "b", ID: "2"}}
	if _, err := e.Do(ctx, keys[0], "fp", func(context.Context) ([]byte, error) { return nil, nil }); err != nil {
		t.Fatal(err)
	}
	rec.take()
	began := adapterkit.BeginBatch(ctx, e, keys, []string{"fp", "fp"})
	attempts := make([]*idem.Attempt, len(began))
	for i, b := range began {
		if b.Err != nil {
			t.Fatal(b.Err)
		}
		attempts[i] = b.Attempt
	}
	for _, err := range adapterkit.CommitBatch(ctx, e, attempts, [][]byte{nil, []byte("v")}) {
		if err != nil {
			t.Fatal(err)
		}
	}
	var outs []string
	for _, o := range rec.take() {
		outs = append(outs, o.Outcome.String())
	}
	if !slices.Equal(outs, []string{"replayed", "executed"}) {
		t.Errorf("got %v, want [replayed executed]", outs)
	}
}

// TestObserverAbandonWith checks that Abandon reports the outcome given, once,
// and a lost lease as such.
func TestObserverAbandonWith(t *testing.T) {
	rec := &recorder{}
	e, s := newExec(t, idem.WithObserver(rec.observe))
	ctx := t.Context()
	key := idem.Key{Scope: "gate", ID: "1"}
	_, a, err := e.Begin(ctx, key, "")
	if err != nil {
		t.Fatal(err)
	}
	if err := a.Abandon(ctx, observe.Executed); err != nil {
		t.Fatal(err)
	}
	if err := a.Abandon(ctx, observe.Executed); !errors.Is(err, idem.ErrLeaseLost) {
		t.Fatalf("second Abandon: got %v, want ErrLeaseLost", err)
	}
	if got := rec.take(); len(got) != 1 || got[0].Outcome != observe.Executed {
		t.Fatalf("got %+v, want one executed", got)
	}
	// The record stays IN_PROGRESS: Abandon makes no store call.
	if r, err := s.Get(ctx, key.Digest()); err != nil || r.State != storekit.StateInProgress {
		t.Fatalf("record: got %v, %v, want IN_PROGRESS", r.State, err)
	}
}
