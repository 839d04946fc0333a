// Package storetest is the conformance suite that every storekit.Store must pass.
//
// Call Run from a test of the store's package:
//
//	func TestConformance(t *testing.T) {
//		storetest.Run(t, func(t *testing.T) storekit.Store {
//			s, err := mystore.New(...)
//			if err != nil {
//				t.Fatal(err)
//			}
//			return s
//		})
//	}
//
// The suite uses the store's own clock only through the store: it waits for
// leases and retention windows of a few hundred milliseconds to pass by
// polling the store, never by trusting the test's clock alone. newStore may
// return the same store for every call: each test uses keys of its own.
//
// The optional capabilities (storekit.BatchStore, storekit.Watcher, storekit.Relayer)
// are checked when the store has them, also beneath wrappers that follow
// storekit.Unwrapper (they are found with storekit.StoreAs); their tests are
// skipped otherwise.
package storetest

import (
	"bytes"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	mrand "math/rand/v2"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/idemgo/idem"
	"github.com/idemgo/idem/storekit"
)

// Durations used by the suite. Leases that must not expire during a test are
// long; leases that must expire are short enough to keep the suite fast and
// long enough for a store on a loaded machine.
const (
	longLease  = time.Minute
	shortLease = 300 * time.Millisecond
	retention  = time.Hour
	waitLimit  = 10 * time.Second
)

// Run runs the conformance suite against the stores newStore returns.
func Run(t *testing.T, newStore func(t *testing.T) storekit.Store) {
	tests := []struct {
		name string
		fn   func(t *testing.T, s storekit.Store)
	}{
		{"AcquireNew", testAcquireNew},
		{"InProgress", testInProgress},
		{"CompleteThenReplay", testCompleteThenReplay},
		{"Mismatch", testMismatch},
		{"StaleOwner", testStaleOwner},
		{"TakeoverOnlyAfterExpiry", testTakeoverOnlyAfterExpiry},
		{"ExpiredLeaseStillCompletes", testExpiredLeaseStillCompletes},
		{"Extend", testExtend},
		{"ReleaseThenReacquire", testReleaseThenReacquire},
		{"FenceIncreases", testFenceIncreases},
		{"RetentionExpiry", testRetentionExpiry},
		{"TerminalFailure", testTerminalFailure},
		{"AttemptsExhaustedByFail", testAttemptsExhaustedByFail},
		{"AttemptsExhaustedByAcquire", testAttemptsExhaustedByAcquire},
		{"GetAndDelete", testGetAndDelete},
		{"DeleteWhileInProgress", testDeleteWhileInProgress},
		{"BadInput", testBadInput},
		{"LargeResult", testLargeResult},
		{"RepeatedCalls", testRepeatedCalls},
		{"Race64", testRace64},
		{"ConcurrentInvariants", testConcurrentInvariants},
		{"SequentialModel", testSequentialModel},
		{"RelayCompletion", testRelayCompletion},
		{"BinaryFingerprint", testBinaryFingerprint},
		{"Batch", testBatch},
		{"Watch", testWatch},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			tt.fn(t, newStore(t))
		})
	}
	t.Run("WaitingDo", func(t *testing.T) {
		s := newStore(t)
		RunWait(t, s, s)
	})
}

// newKey returns a fresh store key for the running test.
func newKey(t *testing.T) string {
	t.Helper()
	var b [8]byte
	rand.Read(b[:])
	return idem.Key{Scope: t.Name(), ID: hex.EncodeToString(b[:])}.Digest()
}

var ownerSeq struct {
	sync.Mutex
	n int
}

func newOwner() string {
	ownerSeq.Lock()
	defer ownerSeq.Unlock()
	ownerSeq.n++
	return fmt.Sprintf("owner-%d", ownerSeq.n)
}

func req(fp string, lease time.Duration) storekit.AcquireRequest {
	return storekit.AcquireRequest{Fingerprint: fp, Owner: newOwner(), Lease: lease, Retention: retention}
}

func acquire(t *testing.T, s storekit.Store, key string, r storekit.AcquireRequest, want storekit.Outcome) storekit.Acquisition {
	t.Helper()
	a, err := s.Acquire(t.Context(), key, r)
	if err != nil {
		t.Fatalf("Acquire: %v", err)
	}
	if a.Outcome != want {
		t.Fatalf("Acquire outcome: got %v, want %v (acquisition %+v)", a.Outcome, want, a)
	}
	switch want {
	case storekit.Acquired, storekit.TakenOver:
		if a.Lease.Owner != r.Owner {
			t.Fatalf("lease owner: got %q, want %q", a.Lease.Owner, r.Owner)
		}
		if a.Lease.Fence <= 0 {
			t.Fatalf("fence: got %d, want > 0", a.Lease.Fence)
		}
	}
	return a
}

func wantLeaseLost(t *testing.T, what string, err error) {
	t.Helper()
	if !errors.Is(err, idem.ErrLeaseLost) {
		t.Fatalf("%s: got error %v, want ErrLeaseLost", what, err)
	}
}

func get(t *testing.T, s storekit.Store, key string) storekit.Record {
	t.Helper()
	rec, err := s.Get(t.Context(), key)
	if err != nil {
		t.Fatalf("Get: %v", err)
	}
	return rec
}

// waitFor polls cond until it is true or waitLimit passes.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(waitLimit)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("waited %v for %s", waitLimit, what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

func testAcquireNew(t *testing.T, s storekit.Store) {
	key := newKey(t)
	r := req("fp", longLease)
	a := acquire(t, s, key, r, storekit.Acquired)
	if a.Attempts != 1 {
		t.Errorf("attempts: got %d, want 1", a.Attempts)
	}
	rec := get(t, s, key)
	if rec.State != storekit.StateInProgress || rec.Fence != a.Lease.Fence || rec.Fingerprint != "fp" || rec.Owner != r.Owner || rec.Attempts != 1 {
		t.Errorf("record: got %+v, want IN_PROGRESS fence %d fingerprint fp owner %s attempts 1", rec, a.Lease.Fence, r.Owner)
	}
	if left := rec.LeaseUntil.Sub(rec.Now); left <= 0 || left > longLease {
		t.Errorf("lease left: got %v, want in (0, %v]", left, longLease)
	}
	if rec.Created.IsZero() || rec.Created.After(rec.Now) {
		t.Errorf("created: got %v, want non-zero and not after now %v", rec.Created, rec.Now)
	}
}

func testInProgress(t *testing.T, s storekit.Store) {
	key := newKey(t)
	acquire(t, s, key, req("fp", longLease), storekit.Acquired)
	a := acquire(t, s, key, req("fp", longLease), storekit.InProgress)
	if a.RetryAfter <= 0 || a.RetryAfter > longLease {
		t.Errorf("RetryAfter: got %v, want in (0, %v]", a.RetryAfter, longLease)
	}
	if a.Lease != (storekit.Lease{}) {
		t.Errorf("InProgress carries a lease: %+v", a.Lease)
	}
}

func testCompleteThenReplay(t *testing.T, s storekit.Store) {
	key := newKey(t)
	a := acquire(t, s, key, req("fp", longLease), storekit.Acquired)
	created := get(t, s, key).Created
	result := []byte("result \x00\xff bytes")
	if err := s.Complete(t.Context(), key, a.Lease, result, retention); err != nil {
		t.Fatalf("Complete: %v", err)
	}
	for range 2 {
		r := acquire(t, s, key, req("fp", longLease), storekit.Replay)
		if r.State != storekit.StateCompleted || !bytes.Equal(r.Result, result) {
			t.Fatalf("replay: got state %v result %q, want COMPLETED %q", r.State, r.Result, result)
		}
	}
	rec := get(t, s, key)
	if rec.State != storekit.StateCompleted || !bytes.Equal(rec.Result, result) || rec.Fence != a.Lease.Fence {
		t.Errorf("record: got %+v, want COMPLETED with the result and fence %d", rec, a.Lease.Fence)
	}
	if !rec.LeaseUntil.IsZero() {
		t.Errorf("completed record has a lease until %v", rec.LeaseUntil)
	}
	if !rec.Created.Equal(created) {
		t.Errorf("created: got %v after Complete, want %v, as before (admin tools show a record's age)", rec.Created, created)
	}
	if rec.ExpiresAt.IsZero() || rec.ExpiresAt.Sub(rec.Now) > retention || rec.ExpiresAt.Sub(rec.Now) < retention-time.Minute {
		t.Errorf("expires in %v, want about %v", rec.ExpiresAt.Sub(rec.Now), retention)
	}
	// A repeated Complete (its reply was lost) succeeds; another result
	// from the same lease does not overwrite the first.
	if err := s.Complete(t.Context(), key, a.Lease, result, retention); err != nil {
		t.Fatalf("repeated Complete: %v", err)
	}
	wantLeaseLost(t, "second Complete with another result", s.Complete(t.Context(), key, a.Lease, []byte("x"), retention))
	// An empty result is a result.
	key2 := newKey(t)
	a2 := acquire(t, s, key2, req("", longLease), storekit.Acquired)
	if err := s.Complete(t.Context(), key2, a2.Lease, nil, retention); err != nil {
		t.Fatalf("Complete with empty result: %v", err)
	}
	if r := acquire(t, s, key2, req("", longLease), storekit.Replay); len(r.Result) != 0 || r.State != storekit.StateCompleted {
		t.Errorf("empty replay: got %v %q, want COMPLETED with empty result", r.State, r.Result)
	}
}

func testMismatch(t *testing.T, s storekit.Store) {
	key := newKey(t)
	a := acquire(t, s, key, req("fp-1", longLease), storekit.Acquired)
	acquire(t, s, key, req("fp-2", longLease), storekit.Mismatch)
	if err := s.Complete(t.Context(), key, a.Lease, []byte("r"), retention); err != nil {
		t.Fatalf("Complete: %v", err)
	}
	acquire(t, s, key, req("fp-2", longLease), storekit.Mismatch)
	acquire(t, s, key, req("", longLease), storekit.Mismatch)
	acquire(t, s, key, req("fp-1", longLease), storekit.Replay)
}

func testStaleOwner(t *testing.T, s storekit.Store) {
	ctx := t.Context()
	key := newKey(t)
	a := acquire(t, s, key, req("fp", longLease), storekit.Acquired)
	stale := []struct {
		name  string
		lease storekit.Lease
	}{
		{"other owner", storekit.Lease{Owner: "intruder", Fence: a.Lease.Fence}},
		{"older fence", storekit.Lease{Owner: a.Lease.Owner, Fence: a.Lease.Fence - 1}},
		{"newer fence", storekit.Lease{Owner: a.Lease.Owner, Fence: a.Lease.Fence + 1}},
	}
	for _, st := range stale {
		wantLeaseLost(t, st.name+" Complete", s.Complete(ctx, key, st.lease, []byte("x"), retention))
		_, err := s.Fail(ctx, key, st.lease, storekit.Failure{Retention: retention, Terminal: true})
		wantLeaseLost(t, st.name+" Fail", err)
		wantLeaseLost(t, st.name+" Extend", s.Extend(ctx, key, st.lease, longLease))
		wantLeaseLost(t, st.name+" Release", s.Release(ctx, key, st.lease, retention))
	}
	// The record is untouched by the stale calls.
	rec := get(t, s, key)
	if rec.State != storekit.StateInProgress || rec.Owner != a.Lease.Owner || rec.Fence != a.Lease.Fence {
		t.Fatalf("after stale calls: got %+v, want IN_PROGRESS owned by %s fence %d", rec, a.Lease.Owner, a.Lease.Fence)
	}
	// Calls on an absent key.
	absent := newKey(t)
	wantLeaseLost(t, "Complete on absent key", s.Complete(ctx, absent, a.Lease, nil, retention))
	wantLeaseLost(t, "Extend on absent key", s.Extend(ctx, absent, a.Lease, longLease))
	if _, err := s.Get(ctx, absent); !errors.Is(err, storekit.ErrNotFound) {
		t.Fatalf("stale calls created a record: Get got %v, want ErrNotFound", err)
	}
}

func testTakeoverOnlyAfterExpiry(t *testing.T, s storekit.Store) {
	ctx := t.Context()
	key := newKey(t)
	start := time.Now()
	first := acquire(t, s, key, req("fp", shortLease), storekit.Acquired)
	var second storekit.Acquisition
	r := req("fp", longLease)
	waitFor(t, "the lease to expire", func() bool {
		a, err := s.Acquire(ctx, key, r)
		if err != nil {
			t.Fatalf("Acquire: %v", err)
		}
		if a.Outcome == storekit.InProgress {
			return false
		}
		second = a
		return true
	})
	elapsed := time.Since(start)
	if second.Outcome != storekit.TakenOver {
		t.Fatalf("after expiry: got %v, want TakenOver", second.Outcome)
	}
	// The store's clock and ours run at the same rate; allow for the
	// coarser resolution of a store's clock.
	if elapsed < shortLease-2*time.Millisecond {
		t.Fatalf("taken over after %v, before the lease of %v expired", elapsed, shortLease)
	}
	if second.PreviousOwner != first.Lease.Owner {
		t.Errorf("previous owner: got %q, want %q", second.PreviousOwner, first.Lease.Owner)
	}
	if second.Lease.Fence <= first.Lease.Fence {
		t.Errorf("fence after takeover: got %d, want > %d", second.Lease.Fence, first.Lease.Fence)
	}
	if second.Attempts != 2 {
		t.Errorf("attempts: got %d, want 2", second.Attempts)
	}
	// The old owner can do nothing any more.
	wantLeaseLost(t, "old owner Extend", s.Extend(ctx, key, first.Lease, longLease))
	wantLeaseLost(t, "old owner Complete", s.Complete(ctx, key, first.Lease, []byte("stale"), retention))
	_, err := s.Fail(ctx, key, first.Lease, storekit.Failure{Retention: retention})
	wantLeaseLost(t, "old owner Fail", err)
	wantLeaseLost(t, "old owner Release", s.Release(ctx, key, first.Lease, retention))
	if err := s.Complete(ctx, key, second.Lease, []byte("new"), retention); err != nil {
		t.Fatalf("new owner Complete: %v", err)
	}
	if a := acquire(t, s, key, req("fp", longLease), storekit.Replay); string(a.Result) != "new" {
		t.Fatalf("replay: got %q, want the new owner's result", a.Result)
	}
}

func testExpiredLeaseStillCompletes(t *testing.T, s storekit.Store) {
	key := newKey(t)
	a := acquire(t, s, key, req("fp", shortLease), storekit.Acquired)
	waitFor(t, "the lease to expire", func() bool {
		rec := get(t, s, key)
		return !rec.Now.Before(rec.LeaseUntil)
	})
	// Expiry alone does not make Complete fail; only a takeover does.
	if err := s.Complete(t.Context(), key, a.Lease, []byte("late"), retention); err != nil {
		t.Fatalf("Complete after the lease expired without a takeover: %v", err)
	}
	acquire(t, s, key, req("fp", longLease), storekit.Replay)
}

func testExtend(t *testing.T, s storekit.Store) {
	key := newKey(t)
	a := acquire(t, s, key, req("fp", shortLease), storekit.Acquired)
	if err := s.Extend(t.Context(), key, a.Lease, longLease); err != nil {
		t.Fatalf("Extend: %v", err)
	}
	rec := get(t, s, key)
	if left := rec.LeaseUntil.Sub(rec.Now); left < longLease-time.Second || left > longLease {
		t.Fatalf("lease left after Extend: got %v, want about %v", left, longLease)
	}
	if rec.Fence != a.Lease.Fence {
		t.Errorf("Extend changed the fence: got %d, want %d", rec.Fence, a.Lease.Fence)
	}
	// Well past the original lease, the key is still held.
	start := time.Now()
	for time.Since(start) < shortLease+100*time.Millisecond {
		acquire(t, s, key, req("fp", longLease), storekit.InProgress)
		time.Sleep(20 * time.Millisecond)
	}
	// An expired, not taken over lease can still be extended.
	key2 := newKey(t)
	b := acquire(t, s, key2, req("fp", shortLease), storekit.Acquired)
	waitFor(t, "the lease to expire", func() bool {
		rec := get(t, s, key2)
		return !rec.Now.Before(rec.LeaseUntil)
	})
	if err := s.Extend(t.Context(), key2, b.Lease, longLease); err != nil {
		t.Fatalf("Extend after expiry without takeover: %v", err)
	}
	acquire(t, s, key2, req("fp", longLease), storekit.InProgress)
}

func testReleaseThenReacquire(t *testing.T, s storekit.Store) {
	key := newKey(t)
	a := acquire(t, s, key, req("fp", longLease), storekit.Acquired)
	if err := s.Release(t.Context(), key, a.Lease, retention); err != nil {
		t.Fatalf("Release: %v", err)
	}
	if rec := get(t, s, key); rec.State != storekit.StateReleased || rec.Fence != a.Lease.Fence || rec.Attempts != 1 {
		t.Fatalf("after Release: got %+v, want RELEASED fence %d attempts 1", rec, a.Lease.Fence)
	}
	b := acquire(t, s, key, req("fp", longLease), storekit.Acquired)
	if b.Lease.Fence <= a.Lease.Fence || b.Attempts != 2 {
		t.Fatalf("re-acquire: got fence %d attempts %d, want fence > %d attempts 2", b.Lease.Fence, b.Attempts, a.Lease.Fence)
	}
	wantLeaseLost(t, "Release by the previous owner", s.Release(t.Context(), key, a.Lease, retention))
	// A retryable Fail releases too.
	st, err := s.Fail(t.Context(), key, b.Lease, storekit.Failure{Result: []byte("err"), Retention: retention})
	if err != nil || st != storekit.StateReleased {
		t.Fatalf("retryable Fail: got %v, %v, want RELEASED", st, err)
	}
	c := acquire(t, s, key, req("fp", longLease), storekit.Acquired)
	if c.Lease.Fence <= b.Lease.Fence || c.Attempts != 3 {
		t.Fatalf("re-acquire after Fail: got fence %d attempts %d, want fence > %d attempts 3", c.Lease.Fence, c.Attempts, b.Lease.Fence)
	}
	// Another fingerprint is still a mismatch while the record is released.
	if err := s.Release(t.Context(), key, c.Lease, retention); err != nil {
		t.Fatalf("Release: %v", err)
	}
	acquire(t, s, key, req("other", longLease), storekit.Mismatch)
}

func testFenceIncreases(t *testing.T, s storekit.Store) {
	ctx := t.Context()
	key := newKey(t)
	var last int64
	next := func(how string, a storekit.Acquisition) {
		t.Helper()
		if a.Lease.Fence <= last {
			t.Fatalf("%s: fence %d, want > %d", how, a.Lease.Fence, last)
		}
		last = a.Lease.Fence
	}
	for i := range 5 {
		a := acquire(t, s, key, req("fp", longLease), storekit.Acquired)
		next(fmt.Sprintf("acquisition %d", i), a)
		switch i % 3 {
		case 0:
			if err := s.Release(ctx, key, a.Lease, retention); err != nil {
				t.Fatal(err)
			}
		case 1:
			if _, err := s.Fail(ctx, key, a.Lease, storekit.Failure{Retention: retention}); err != nil {
				t.Fatal(err)
			}
		case 2:
			// The record is deleted: the fence must still grow.
			if err := s.Delete(ctx, key); err != nil {
				t.Fatal(err)
			}
		}
	}
	a := acquire(t, s, key, req("fp", longLease), storekit.Acquired)
	next("after delete", a)
	if err := s.Complete(ctx, key, a.Lease, nil, retention); err != nil {
		t.Fatal(err)
	}
	if err := s.Delete(ctx, key); err != nil {
		t.Fatal(err)
	}
	next("after completed and deleted", acquire(t, s, key, req("fp", longLease), storekit.Acquired))
}

func testRetentionExpiry(t *testing.T, s storekit.Store) {
	ctx := t.Context()
	key := newKey(t)
	a := acquire(t, s, key, storekit.AcquireRequest{Fingerprint: "fp", Owner: newOwner(), Lease: 100 * time.Millisecond, Retention: shortLease}, storekit.Acquired)
	done := time.Now() // before the call: the store's clock starts the retention during it
	if err := s.Complete(ctx, key, a.Lease, []byte("r"), shortLease); err != nil {
		t.Fatal(err)
	}
	acquire(t, s, key, req("fp", longLease), storekit.Replay)
	waitFor(t, "the record to expire", func() bool {
		_, err := s.Get(ctx, key)
		if err != nil && !errors.Is(err, storekit.ErrNotFound) {
			t.Fatalf("Get: %v", err)
		}
		return err != nil
	})
	if elapsed := time.Since(done); elapsed < shortLease-2*time.Millisecond {
		t.Fatalf("record expired after %v, before its retention of %v", elapsed, shortLease)
	}
	b := acquire(t, s, key, req("other fingerprint", longLease), storekit.Acquired)
	if b.Lease.Fence <= a.Lease.Fence {
		t.Errorf("fence after expiry: got %d, want > %d", b.Lease.Fence, a.Lease.Fence)
	}
	// An abandoned IN_PROGRESS record does not stay forever either: it
	// expires some time after its lease (stores keep it at most a few
	// leases).
	key2 := newKey(t)
	acquire(t, s, key2, storekit.AcquireRequest{Fingerprint: "fp", Owner: newOwner(), Lease: 100 * time.Millisecond, Retention: retention}, storekit.Acquired)
	waitFor(t, "the abandoned record to expire", func() bool {
		_, err := s.Get(ctx, key2)
		return errors.Is(err, storekit.ErrNotFound)
	})
}

func testTerminalFailure(t *testing.T, s storekit.Store) {
	key := newKey(t)
	a := acquire(t, s, key, req("fp", longLease), storekit.Acquired)
	st, err := s.Fail(t.Context(), key, a.Lease, storekit.Failure{Result: []byte("card declined"), Terminal: true, Retention: retention})
	if err != nil || st != storekit.StateFailed {
		t.Fatalf("terminal Fail: got %v, %v, want FAILED", st, err)
	}
	r := acquire(t, s, key, req("fp", longLease), storekit.Replay)
	if r.State != storekit.StateFailed || string(r.Result) != "card declined" {
		t.Fatalf("replay: got %v %q, want FAILED \"card declined\"", r.State, r.Result)
	}
	acquire(t, s, key, req("other", longLease), storekit.Mismatch)
}

func testAttemptsExhaustedByFail(t *testing.T, s storekit.Store) {
	ctx := t.Context()
	key := newKey(t)
	r := req("fp", longLease)
	r.MaxAttempts = 2
	a := acquire(t, s, key, r, storekit.Acquired)
	f := storekit.Failure{Result: []byte("boom 1"), Retention: retention, MaxAttempts: 2}
	if st, err := s.Fail(ctx, key, a.Lease, f); err != nil || st != storekit.StateReleased {
		t.Fatalf("first retryable Fail: got %v, %v, want RELEASED", st, err)
	}
	r.Owner = newOwner()
	b := acquire(t, s, key, r, storekit.Acquired)
	f.Result = []byte("boom 2")
	if st, err := s.Fail(ctx, key, b.Lease, f); err != nil || st != storekit.StateFailed {
		t.Fatalf("second retryable Fail with 2 attempts max: got %v, %v, want FAILED", st, err)
	}
	r.Owner = newOwner()
	got := acquire(t, s, key, r, storekit.Replay)
	if got.State != storekit.StateFailed || string(got.Result) != "boom 2" || got.Attempts != 2 {
		t.Fatalf("replay: got %v %q attempts %d, want FAILED \"boom 2\" attempts 2", got.State, got.Result, got.Attempts)
	}
}

func testAttemptsExhaustedByAcquire(t *testing.T, s storekit.Store) {
	ctx := t.Context()
	key := newKey(t)
	r := req("fp", longLease)
	r.MaxAttempts = 1
	a := acquire(t, s, key, r, storekit.Acquired)
	if err := s.Release(ctx, key, a.Lease, retention); err != nil {
		t.Fatal(err)
	}
	r.Owner = newOwner()
	got := acquire(t, s, key, r, storekit.Replay)
	if got.State != storekit.StateFailed || len(got.Result) != 0 {
		t.Fatalf("acquire past max attempts: got %v %q, want FAILED with no result", got.State, got.Result)
	}
	if rec := get(t, s, key); rec.State != storekit.StateFailed {
		t.Fatalf("record: got %v, want FAILED", rec.State)
	}
	// An expired lease counts as an attempt too: a crashing owner cannot
	// loop forever.
	key2 := newKey(t)
	r2 := storekit.AcquireRequest{Fingerprint: "fp", Owner: newOwner(), Lease: 50 * time.Millisecond, Retention: retention, MaxAttempts: 1}
	acquire(t, s, key2, r2, storekit.Acquired)
	r2.Owner = newOwner()
	var last storekit.Acquisition
	waitFor(t, "the lease to expire", func() bool {
		a, err := s.Acquire(ctx, key2, r2)
		if err != nil {
			t.Fatal(err)
		}
		last = a
		return a.Outcome != storekit.InProgress
	})
	if last.Outcome != storekit.Replay || last.State != storekit.StateFailed {
		t.Fatalf("takeover past max attempts: got %v %v, want Replay of FAILED", last.Outcome, last.State)
	}
}

func testGetAndDelete(t *testing.T, s storekit.Store) {
	ctx := t.Context()
	key := newKey(t)
	if _, err := s.Get(ctx, key); !errors.Is(err, storekit.ErrNotFound) {
		t.Fatalf("Get of an absent key: got %v, want ErrNotFound", err)
	}
	if err := s.Delete(ctx, key); err != nil {
		t.Fatalf("Delete of an absent key: %v", err)
	}
	a := acquire(t, s, key, req("fp", longLease), storekit.Acquired)
	if err := s.Complete(ctx, key, a.Lease, []byte("r"), retention); err != nil {
		t.Fatal(err)
	}
	if err := s.Delete(ctx, key); err != nil {
		t.Fatalf("Delete: %v", err)
	}
	if _, err := s.Get(ctx, key); !errors.Is(err, storekit.ErrNotFound) {
		t.Fatalf("Get after Delete: got %v, want ErrNotFound", err)
	}
	acquire(t, s, key, req("another fingerprint", longLease), storekit.Acquired)
}

func testDeleteWhileInProgress(t *testing.T, s storekit.Store) {
	ctx := t.Context()
	key := newKey(t)
	a := acquire(t, s, key, req("fp", longLease), storekit.Acquired)
	if err := s.Delete(ctx, key); err != nil {
		t.Fatal(err)
	}
	wantLeaseLost(t, "Complete after Delete", s.Complete(ctx, key, a.Lease, []byte("r"), retention))
	if _, err := s.Get(ctx, key); !errors.Is(err, storekit.ErrNotFound) {
		t.Fatalf("Complete after Delete recreated the record: %v", err)
	}
}

func testBadInput(t *testing.T, s storekit.Store) {
	ctx := t.Context()
	key := newKey(t)
	good := req("fp", longLease)
	lease := storekit.Lease{Owner: "o", Fence: 1}
	acquires := []struct {
		name string
		key  string
		r    storekit.AcquireRequest
	}{
		{"empty key", "", good},
		{"long key", strings.Repeat("k", storekit.MaxStoreKeyLen+1), good},
		{"long fingerprint", key, storekit.AcquireRequest{Fingerprint: strings.Repeat("f", storekit.MaxFingerprintLen+1), Owner: "o", Lease: longLease, Retention: retention}},
		{"empty owner", key, storekit.AcquireRequest{Fingerprint: "fp", Lease: longLease, Retention: retention}},
		{"long owner", key, storekit.AcquireRequest{Fingerprint: "fp", Owner: strings.Repeat("o", storekit.MaxOwnerLen+1), Lease: longLease, Retention: retention}},
		{"zero lease", key, storekit.AcquireRequest{Fingerprint: "fp", Owner: "o", Retention: retention}},
		{"negative lease", key, storekit.AcquireRequest{Fingerprint: "fp", Owner: "o", Lease: -time.Second, Retention: retention}},
		{"retention below lease", key, storekit.AcquireRequest{Fingerprint: "fp", Owner: "o", Lease: longLease, Retention: time.Second}},
		{"negative max attempts", key, storekit.AcquireRequest{Fingerprint: "fp", Owner: "o", Lease: longLease, Retention: retention, MaxAttempts: -1}},
	}
	for _, tc := range acquires {
		if _, err := s.Acquire(ctx, tc.key, tc.r); !errors.Is(err, idem.ErrInvalid) {
			t.Errorf("Acquire with %s: got %v, want ErrInvalid", tc.name, err)
		}
	}
	if _, err := s.Get(ctx, key); !errors.Is(err, storekit.ErrNotFound) {
		t.Fatalf("a rejected Acquire left a record: Get got %v", err)
	}
	a := acquire(t, s, key, good, storekit.Acquired)
	bad := []struct {
		name string
		err  error
	}{
		{"Complete with empty key", s.Complete(ctx, "", a.Lease, nil, retention)},
		{"Complete with zero fence", s.Complete(ctx, key, storekit.Lease{Owner: a.Lease.Owner}, nil, retention)},
		{"Complete with empty owner", s.Complete(ctx, key, storekit.Lease{Fence: a.Lease.Fence}, nil, retention)},
		{"Complete with zero retention", s.Complete(ctx, key, a.Lease, nil, 0)},
		{"Extend with zero lease", s.Extend(ctx, key, a.Lease, 0)},
		{"Release with zero retention", s.Release(ctx, key, a.Lease, 0)},
		{"Extend with empty key", s.Extend(ctx, "", lease, longLease)},
		{"Release with long key", s.Release(ctx, strings.Repeat("k", storekit.MaxStoreKeyLen+1), lease, retention)},
		{"Get with empty key", func() error { _, err := s.Get(ctx, ""); return err }()},
		{"Delete with empty key", s.Delete(ctx, "")},
	}
	_, failErr := s.Fail(ctx, key, a.Lease, storekit.Failure{Retention: 0})
	bad = append(bad, struct {
		name string
		err  error
	}{"Fail with zero retention", failErr})
	for _, tc := range bad {
		if !errors.Is(tc.err, idem.ErrInvalid) {
			t.Errorf("%s: got %v, want ErrInvalid", tc.name, tc.err)
		}
	}
	// None of them touched the record.
	rec := get(t, s, key)
	if rec.State != storekit.StateInProgress || rec.Fence != a.Lease.Fence {
		t.Fatalf("record after rejected calls: got %+v, want IN_PROGRESS fence %d", rec, a.Lease.Fence)
	}
}

func testLargeResult(t *testing.T, s storekit.Store) {
	key := newKey(t)
	a := acquire(t, s, key, req("fp", longLease), storekit.Acquired)
	result := make([]byte, 1<<20)
	for i := range result {
		result[i] = byte(i * 7)
	}
	if err := s.Complete(t.Context(), key, a.Lease, result, retention); err != nil {
		t.Fatalf("Complete with 1 MiB: %v", err)
	}
	if r := acquire(t, s, key, req("fp", longLease), storekit.Replay); !bytes.Equal(r.Result, result) {
		t.Fatalf("replay of 1 MiB differs (got %d bytes)", len(r.Result))
	}
}

func testRace64(t *testing.T, s storekit.Store) {
	ctx := t.Context()
	key := newKey(t)
	const n = 64
	outcomes := make([]storekit.Outcome, n)
	errs := make([]error, n)
	var start, done sync.WaitGroup
	start.Add(1)
	for i := range n {
		done.Add(1)
		go func() {
			defer done.Done()
			start.Wait()
			a, err := s.Acquire(ctx, key, req("fp", longLease))
			outcomes[i], errs[i] = a.Outcome, err
		}()
	}
	start.Done()
	done.Wait()
	acquired := 0
	for i := range n {
		if errs[i] != nil {
			t.Fatalf("goroutine %d: %v", i, errs[i])
		}
		switch outcomes[i] {
		case storekit.Acquired:
			acquired++
		case storekit.InProgress:
		default:
			t.Errorf("goroutine %d: got %v, want Acquired or InProgress", i, outcomes[i])
		}
	}
	if acquired != 1 {
		t.Fatalf("got %d Acquired among %d racing goroutines, want exactly 1", acquired, n)
	}
}

// testConcurrentInvariants runs random operations on a few keys from
// several goroutines without any coordination, and checks what must hold
// whatever the interleaving: at most one successful Complete per key, every
// successful Acquire gets a fence no other acquisition of the key got, and
// after a Complete every Acquire replays its result.
func testConcurrentInvariants(t *testing.T, s storekit.Store) {
	ctx := t.Context()
	const (
		workers = 8
		ops     = 150
		nkeys   = 4
	)
	keys := make([]string, nkeys)
	for i := range keys {
		keys[i] = newKey(t)
	}
	var mu sync.Mutex
	completes := map[string]int{}
	results := map[string]string{}
	fences := map[string]map[int64]bool{}
	var wg sync.WaitGroup
	for w := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			rng := mrand.New(mrand.NewPCG(uint64(w), 7))
			for i := range ops {
				key := keys[rng.IntN(nkeys)]
				a, err := s.Acquire(ctx, key, req("fp", longLease))
				if err != nil {
					t.Errorf("Acquire: %v", err)
					return
				}
				switch a.Outcome {
				case storekit.Acquired, storekit.TakenOver:
					mu.Lock()
					if fences[key] == nil {
						fences[key] = map[int64]bool{}
					}
					if fences[key][a.Lease.Fence] {
						t.Errorf("fence %d handed out twice for one key", a.Lease.Fence)
					}
					fences[key][a.Lease.Fence] = true
					mu.Unlock()
					switch rng.IntN(3) {
					case 0:
						res := fmt.Sprintf("w%d-op%d", w, i)
						if err := s.Complete(ctx, key, a.Lease, []byte(res), retention); err != nil {
							t.Errorf("Complete by the owner: %v", err)
							return
						}
						mu.Lock()
						completes[key]++
						results[key] = res
						mu.Unlock()
					case 1:
						if err := s.Release(ctx, key, a.Lease, retention); err != nil {
							t.Errorf("Release by the owner: %v", err)
							return
						}
					case 2:
						if _, err := s.Fail(ctx, key, a.Lease, storekit.Failure{Retention: retention}); err != nil {
							t.Errorf("Fail by the owner: %v", err)
							return
						}
					}
				case storekit.Replay:
					mu.Lock()
					want, ok := results[key]
					mu.Unlock()
					// The completer records the result after Complete
					// returns, so a replay may be seen first.
					if ok && string(a.Result) != want {
						t.Errorf("replay: got %q, want %q", a.Result, want)
					}
				case storekit.InProgress:
				default:
					t.Errorf("unexpected outcome %v", a.Outcome)
				}
			}
		}()
	}
	wg.Wait()
	for key, n := range completes {
		if n > 1 {
			t.Errorf("key completed %d times, want at most 1", n)
		}
		if r := acquire(t, s, key, req("fp", longLease), storekit.Replay); string(r.Result) != results[key] {
			t.Errorf("final replay: got %q, want %q", r.Result, results[key])
		}
	}
}

// testRepeatedCalls repeats each call as a client does after a lost reply:
// the repeat must report what the first call did, never act twice.
func testRepeatedCalls(t *testing.T, s storekit.Store) {
	ctx := t.Context()
	key := newKey(t)
	r := req("fp", longLease)
	a := acquire(t, s, key, r, storekit.Acquired)
	again := acquire(t, s, key, r, storekit.Acquired)
	if again.Lease != a.Lease || again.Attempts != 1 {
		t.Fatalf("repeated Acquire: got %+v attempts %d, want %+v attempts 1", again.Lease, again.Attempts, a.Lease)
	}
	if err := s.Release(ctx, key, a.Lease, retention); err != nil {
		t.Fatal(err)
	}
	if err := s.Release(ctx, key, a.Lease, retention); err != nil {
		t.Fatalf("repeated Release: %v", err)
	}
	b := acquire(t, s, key, req("fp", longLease), storekit.Acquired)
	if b.Attempts != 2 {
		t.Fatalf("attempts after a repeated Release: got %d, want 2", b.Attempts)
	}
	for i := range 2 {
		st, err := s.Fail(ctx, key, b.Lease, storekit.Failure{Result: []byte("no"), Terminal: true, Retention: retention})
		if err != nil || st != storekit.StateFailed {
			t.Fatalf("Fail call %d: got %v, %v, want FAILED", i+1, st, err)
		}
	}
	wantLeaseLost(t, "Release of a FAILED record", s.Release(ctx, key, b.Lease, retention))
	if rec := get(t, s, key); rec.State != storekit.StateFailed || string(rec.Result) != "no" {
		t.Fatalf("record: got %v %q, want FAILED \"no\"", rec.State, rec.Result)
	}
}
