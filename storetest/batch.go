package storetest

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/idemgo/idem"
	"github.com/idemgo/idem/storekit"
)

// testBatch checks storekit.BatchStore on stores that implement it (found
// through wrappers with storekit.StoreAs): each key of AcquireBatch and
// CompleteBatch gets the outcome and error Acquire and Complete would give
// it, and invalid input fails its key only. A store that refuses batches in
// its configuration (every key of a valid batch fails with ErrInvalid, as
// redisstore does with WithWait) is skipped.
func testBatch(t *testing.T, s storekit.Store) {
	bs, ok := storekit.StoreAs[storekit.BatchStore](s)
	if !ok {
		t.Skip("the store does not implement storekit.BatchStore")
	}
	ctx := t.Context()
	probe := newKey(t)
	if _, errs := bs.AcquireBatch(ctx, []string{probe}, []storekit.AcquireRequest{req("fp", longLease)}); errors.Is(errs[0], idem.ErrInvalid) {
		t.Skipf("the store refuses batches: %v", errs[0])
	}

	completed, inProgress, mismatched := newKey(t), newKey(t), newKey(t)
	a := acquire(t, s, completed, req("fp", longLease), storekit.Acquired)
	if err := s.Complete(ctx, completed, a.Lease, []byte("done"), retention); err != nil {
		t.Fatalf("Complete: %v", err)
	}
	held := acquire(t, s, inProgress, req("fp", longLease), storekit.Acquired)
	acquire(t, s, mismatched, req("other", longLease), storekit.Acquired)

	fresh1, fresh2 := newKey(t), newKey(t)
	keys := []string{fresh1, completed, inProgress, "", mismatched, fresh2}
	reqs := []storekit.AcquireRequest{req("fp", longLease), req("fp", longLease), req("fp", longLease),
		req("fp", longLease), req("fp", longLease), req("fp", longLease)}
	got, errs := bs.AcquireBatch(ctx, keys, reqs)
	if len(got) != len(keys) || len(errs) != len(keys) {
		t.Fatalf("AcquireBatch: %d outcomes and %d errors for %d keys", len(got), len(errs), len(keys))
	}
	if !errors.Is(errs[3], idem.ErrInvalid) {
		t.Errorf("AcquireBatch of an empty key: got %v, want ErrInvalid", errs[3])
	}
	want := []storekit.Outcome{storekit.Acquired, storekit.Replay, storekit.InProgress, 0, storekit.Mismatch, storekit.Acquired}
	for i, w := range want {
		if i == 3 {
			continue
		}
		if errs[i] != nil {
			t.Fatalf("AcquireBatch key %d: %v", i, errs[i])
		}
		if got[i].Outcome != w {
			t.Fatalf("AcquireBatch key %d: got %v, want %v (%+v)", i, got[i].Outcome, w, got[i])
		}
	}
	if got[1].State != storekit.StateCompleted || string(got[1].Result) != "done" {
		t.Errorf("AcquireBatch replay: got %v %q, want COMPLETED \"done\"", got[1].State, got[1].Result)
	}
	if got[2].RetryAfter <= 0 || got[2].RetryAfter > longLease {
		t.Errorf("AcquireBatch in progress: RetryAfter %v, want in (0, %v]", got[2].RetryAfter, longLease)
	}
	for _, i := range []int{0, 5} {
		if got[i].Lease.Owner != reqs[i].Owner || got[i].Lease.Fence <= 0 || got[i].Attempts != 1 {
			t.Fatalf("AcquireBatch key %d: lease %+v attempts %d, want owner %q, a fence, 1 attempt", i, got[i].Lease, got[i].Attempts, reqs[i].Owner)
		}
		if rec := get(t, s, keys[i]); rec.State != storekit.StateInProgress || rec.Owner != reqs[i].Owner || rec.Fence != got[i].Lease.Fence {
			t.Fatalf("record of key %d: got %v owner %q fence %d, want IN_PROGRESS by the batch's lease", i, rec.State, rec.Owner, rec.Fence)
		}
	}

	// CompleteBatch: the two acquired keys complete, a stale lease loses,
	// an invalid key fails alone.
	stale := storekit.Lease{Owner: "not-the-owner", Fence: held.Lease.Fence}
	ckeys := []string{fresh1, inProgress, "", fresh2}
	leases := []storekit.Lease{got[0].Lease, stale, got[0].Lease, got[5].Lease}
	results := [][]byte{[]byte("one"), []byte("stale"), []byte("x"), []byte("two")}
	cerrs := bs.CompleteBatch(ctx, ckeys, leases, results, retention)
	if len(cerrs) != len(ckeys) {
		t.Fatalf("CompleteBatch: %d errors for %d keys", len(cerrs), len(ckeys))
	}
	if cerrs[0] != nil || cerrs[3] != nil {
		t.Fatalf("CompleteBatch: got %v and %v, want nil", cerrs[0], cerrs[3])
	}
	wantLeaseLost(t, "CompleteBatch with a stale lease", cerrs[1])
	if !errors.Is(cerrs[2], idem.ErrInvalid) {
		t.Errorf("CompleteBatch of an empty key: got %v, want ErrInvalid", cerrs[2])
	}
	// A repeated CompleteBatch (its reply was lost) succeeds and changes
	// nothing.
	again := bs.CompleteBatch(ctx, []string{fresh1, fresh2}, []storekit.Lease{got[0].Lease, got[5].Lease}, [][]byte{[]byte("one"), []byte("two")}, retention)
	if len(again) != 2 || again[0] != nil || again[1] != nil {
		t.Fatalf("repeated CompleteBatch: got %v, want no errors", again)
	}
	for k, res := range map[string]string{fresh1: "one", fresh2: "two"} {
		if a := acquire(t, s, k, req("fp", longLease), storekit.Replay); a.State != storekit.StateCompleted || string(a.Result) != res {
			t.Fatalf("replay after CompleteBatch: got %v %q, want COMPLETED %q", a.State, a.Result, res)
		}
	}
	if rec := get(t, s, inProgress); rec.State != storekit.StateInProgress || rec.Owner != held.Lease.Owner {
		t.Fatalf("the stale lease changed the record: %v owner %q", rec.State, rec.Owner)
	}

	// An empty batch is no error.
	if out, errs := bs.AcquireBatch(ctx, nil, nil); len(out) != 0 || len(errs) != 0 {
		t.Errorf("empty AcquireBatch: got %v, %v", out, errs)
	}
	if errs := bs.CompleteBatch(ctx, nil, nil, nil, retention); len(errs) != 0 {
		t.Errorf("empty CompleteBatch: got %v", errs)
	}
}

// testWatch checks storekit.Watcher on stores that implement it (found through
// wrappers with storekit.StoreAs): a watch of an IN_PROGRESS key is woken when
// the record leaves IN_PROGRESS through Complete, Fail or Release (an
// Extend before does not spoil it), every watcher of the key is woken,
// and a stopped watch does not spoil the next one.
func testWatch(t *testing.T, s storekit.Store) {
	w, ok := storekit.StoreAs[storekit.Watcher](s)
	if !ok {
		t.Skip("the store does not implement storekit.Watcher")
	}
	ctx := t.Context()
	// watch starts a watch of key, stopped at the end of the test.
	watch := func(t *testing.T, key string) <-chan struct{} {
		t.Helper()
		ch, stop, err := w.Watch(ctx, key)
		if err != nil {
			t.Fatalf("Watch: %v", err)
		}
		t.Cleanup(stop)
		return ch
	}
	woken := func(what string, ch <-chan struct{}) {
		t.Helper()
		select {
		case <-ch:
		case <-time.After(waitLimit):
			t.Fatalf("%s: the watch was not woken within %v", what, waitLimit)
		}
	}
	endings := []struct {
		name string
		end  func(key string, l storekit.Lease) error
	}{
		{"Complete", func(key string, l storekit.Lease) error { return s.Complete(ctx, key, l, []byte("r"), retention) }},
		{"Fail", func(key string, l storekit.Lease) error {
			_, err := s.Fail(ctx, key, l, storekit.Failure{Terminal: true, Retention: retention})
			return err
		}},
		{"Release", func(key string, l storekit.Lease) error { return s.Release(ctx, key, l, retention) }},
	}
	// Delete is left out: redisstore publishes no notification for it (its
	// waiters find the deletion when they look again).
	for _, e := range endings {
		t.Run(e.name, func(t *testing.T) {
			key := newKey(t)
			a := acquire(t, s, key, req("fp", longLease), storekit.Acquired)
			ch := watch(t, key)
			ch2 := watch(t, key) // every watcher of the key is woken
			if err := s.Extend(ctx, key, a.Lease, longLease); err != nil {
				t.Fatalf("Extend: %v", err)
			}
			if err := e.end(key, a.Lease); err != nil {
				t.Fatalf("%s: %v", e.name, err)
			}
			woken(e.name, ch)
			woken(e.name+", second watcher", ch2)
		})
	}
	t.Run("stopped early", func(t *testing.T) {
		key := newKey(t)
		a := acquire(t, s, key, req("fp", longLease), storekit.Acquired)
		_, stop, err := w.Watch(ctx, key)
		if err != nil {
			t.Fatalf("Watch: %v", err)
		}
		stop()
		ch := watch(t, key) // a new watch of the key works after one stopped
		if err := s.Complete(ctx, key, a.Lease, []byte("r"), retention); err != nil {
			t.Fatalf("Complete: %v", err)
		}
		woken("Complete after a stopped watch", ch)
	})
	t.Run("bad key", func(t *testing.T) {
		if _, _, err := w.Watch(ctx, strings.Repeat("k", storekit.MaxStoreKeyLen+1)); !errors.Is(err, idem.ErrInvalid) {
			t.Errorf("Watch of a long key: got %v, want ErrInvalid", err)
		}
	})
}
