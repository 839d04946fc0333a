package idem_test

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idemgo/idem"
	"github.com/idemgo/idem/memstore"
	"github.com/idemgo/idem/storekit"
)

// delayedStore delays the calls of a Store as a slow network does: Acquire
// by reqDelay before it reaches the store and by replyDelay after;
// Extend fails (the store is unreachable) while failExtend is set.
type delayedStore struct {
	idem.Store
	reqDelay, replyDelay time.Duration
	failExtend           atomic.Bool
}

var errUnreachable = errors.New("test: store unreachable")

func (s *delayedStore) Acquire(ctx context.Context, key string, req storekit.AcquireRequest) (storekit.Acquisition, error) {
	time.Sleep(s.reqDelay) // the request travels
	a, err := s.Store.Acquire(ctx, key, req)
	time.Sleep(s.replyDelay) // the reply travels
	return a, err
}

func (s *delayedStore) Extend(ctx context.Context, key string, lease idem.Lease, d time.Duration) error {
	if s.failExtend.Load() {
		return errUnreachable
	}
	return s.Store.Extend(ctx, key, lease, d)
}

func newDelayed(t *testing.T, reqDelay, replyDelay time.Duration) (*delayedStore, *memstore.Store) {
	t.Helper()
	ms, err := memstore.New()
	if err != nil {
		t.Fatal(err)
	}
	return &delayedStore{Store: ms, reqDelay: reqDelay, replyDelay: replyDelay}, ms
}

// TestNoStartAfterTheLease: the acquire's reply arrives after the lease
// has ended by the local clock (sent + lease). The operation must not
// start (another caller may hold the key by then); Do fails with
// ErrLeaseLost and the key is released, so the next caller runs it at once.
// The code before the local deadline ran the operation.
func TestNoStartAfterTheLease(t *testing.T) {
	const lease = 100 * time.Millisecond
	ds, ms := newDelayed(t, 0, 150*time.Millisecond)
	e, err := idem.New(ds, idem.WithLease(lease))
	if err != nil {
		t.Fatal(err)
	}
	key := idem.Key{ID: "late"}
	ran := false
	_, err = e.Do(t.Context(), key, "", func(ctx context.Context) ([]byte, error) {
		ran = true
		return []byte("late"), nil
	})
	if ran {
		t.Fatal("the operation started after its lease had ended")
	}
	if !errors.Is(err, idem.ErrLeaseLost) {
		t.Fatalf("Do: got %v, want ErrLeaseLost", err)
	}
	rec, err := ms.Get(t.Context(), key.Digest())
	if err != nil || rec.State != storekit.StateReleased {
		t.Fatalf("record: got %v, %v, want RELEASED", rec.State, err)
	}
}

// TestLeaseDeadlineCancels: the store cannot be reached for extensions, so
// the lease is never extended. The operation's context must be cancelled
// at the local deadline (the acquire's send time + lease), before the
// store's lease ends: at that moment nobody else can have the key. The
// acquire's request takes 40ms to reach the store, so the store's lease
// ends 40ms after the local deadline. The code before the local deadline
// cancelled only when an extension reported the lease lost, so the
// operation ran on with a live context past its lease.
func TestLeaseDeadlineCancels(t *testing.T) {
	const lease, delay = 150 * time.Millisecond, 40 * time.Millisecond
	ds, _ := newDelayed(t, delay, 0)
	ds.failExtend.Store(true)
	e, err := idem.New(ds, idem.WithLease(lease))
	if err != nil {
		t.Fatal(err)
	}
	key := idem.Key{ID: "deadline"}
	sent := time.Now()
	_, err = e.Do(t.Context(), key, "", func(ctx context.Context) ([]byte, error) {
		dl, ok := leaseDeadline(ctx)
		if !ok || dl.Before(sent.Add(lease)) || dl.After(time.Now().Add(lease)) {
			t.Errorf("LeaseDeadline: got %v, %v, want between the send and the reply + lease", dl, ok)
		}
		if _, ok := ctx.Deadline(); ok {
			t.Error("ctx.Deadline is set; extensions would not move it")
		}
		select {
		case <-ctx.Done():
		case <-time.After(10 * lease):
			t.Fatal("the context was not cancelled at the lease's local deadline")
		}
		if now := time.Now(); now.Before(dl) {
			t.Errorf("cancelled %v before the local deadline", dl.Sub(now))
		}
		if cause := context.Cause(ctx); !errors.Is(cause, idem.ErrLeaseLost) {
			t.Errorf("cause: got %v, want ErrLeaseLost", cause)
		}
		// The store's lease has not ended: another caller is refused.
		ds.reqDelay = 0
		if _, err := e.Do(context.Background(), key, "", func(context.Context) ([]byte, error) { return nil, nil }); !errors.Is(err, idem.ErrInProgress) {
			t.Errorf("another caller at the cancellation: got %v, want ErrInProgress", err)
		}
		return nil, context.Cause(ctx)
	})
	if !errors.Is(err, idem.ErrLeaseLost) {
		t.Errorf("Do: got %v, want the cancellation's ErrLeaseLost", err)
	}
}

// TestLeaseDeadlineMovesWithExtensions: while extensions succeed the
// context lives past the first deadline, and LeaseDeadline moves.
func TestLeaseDeadlineMovesWithExtensions(t *testing.T) {
	const lease = 300 * time.Millisecond
	ds, _ := newDelayed(t, 0, 0)
	e, err := idem.New(ds, idem.WithLease(lease))
	if err != nil {
		t.Fatal(err)
	}
	_, err = e.Do(t.Context(), idem.Key{ID: "extended"}, "", func(ctx context.Context) ([]byte, error) {
		first, _ := leaseDeadline(ctx)
		deadline := time.Now().Add(10 * time.Second)
		for {
			if dl, _ := leaseDeadline(ctx); dl.After(first.Add(lease)) {
				break // extended at least twice
			}
			if time.Now().After(deadline) {
				t.Fatal("LeaseDeadline did not move")
			}
			time.Sleep(lease / 10) // poll until two heartbeats extended
		}
		if err := ctx.Err(); err != nil {
			t.Errorf("context after the first deadline: got %v, want alive", context.Cause(ctx))
		}
		return nil, nil
	})
	if err != nil {
		t.Fatal(err)
	}
}

// leaseDeadline is the lease deadline of the attempt that runs with ctx.
func leaseDeadline(ctx context.Context) (time.Time, bool) {
	a, ok := idem.AttemptFrom(ctx)
	if !ok {
		return time.Time{}, false
	}
	return a.LeaseDeadline(), true
}
