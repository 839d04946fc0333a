package storetest

import (
	"bytes"
	"errors"
	"strings"
	"testing"

	"github.com/idemgo/idem"
	"github.com/idemgo/idem/storekit"
)

// testRelayCompletion checks storekit.Relayer on stores that implement it
// (found through wrappers with storekit.StoreAs): a relayed completion moves
// any record that is not COMPLETED to COMPLETED, displacing its owner, and
// never changes a COMPLETED record.
func testRelayCompletion(t *testing.T, s storekit.Store) {
	r, ok := storekit.StoreAs[storekit.Relayer](s)
	if !ok {
		t.Skip("the store does not implement storekit.Relayer")
	}
	ctx := t.Context()
	relayed := func(fence int64, result string) storekit.Completion {
		return storekit.Completion{Fingerprint: "fp", Fence: fence, Result: []byte(result), Retention: retention}
	}
	relay := func(key string, c storekit.Completion) {
		t.Helper()
		if err := r.RelayCompletion(ctx, key, c); err != nil {
			t.Fatalf("RelayCompletion: %v", err)
		}
	}
	wantCompleted := func(key, result string, minFence int64) storekit.Record {
		t.Helper()
		rec := get(t, s, key)
		if rec.State != storekit.StateCompleted || string(rec.Result) != result || rec.Fence < minFence {
			t.Fatalf("record: got %v %q fence %d, want COMPLETED %q fence >= %d", rec.State, rec.Result, rec.Fence, result, minFence)
		}
		if a := acquire(t, s, key, req("fp", longLease), storekit.Replay); a.State != storekit.StateCompleted || string(a.Result) != result {
			t.Fatalf("replay: got %v %q, want COMPLETED %q", a.State, a.Result, result)
		}
		return rec
	}

	t.Run("absent", func(t *testing.T) {
		key := newKey(t)
		relay(key, relayed(7, "committed"))
		rec := wantCompleted(key, "committed", 7)
		if rec.Fingerprint != "fp" || rec.Attempts != 1 {
			t.Errorf("record: got fingerprint %q attempts %d, want fp and 1", rec.Fingerprint, rec.Attempts)
		}
		if left := rec.ExpiresAt.Sub(rec.Now); !rec.ExpiresAt.IsZero() && (left <= 0 || left > retention) {
			t.Errorf("expiry: got %v left, want in (0, %v]", left, retention)
		}
		// Acquiring again replays; the key is not handed out.
		acquire(t, s, key, req("other", longLease), storekit.Mismatch)
	})
	t.Run("in progress", func(t *testing.T) {
		key := newKey(t)
		a := acquire(t, s, key, req("fp", longLease), storekit.Acquired)
		relay(key, relayed(a.Lease.Fence-1, "committed")) // an older owner's commit
		wantCompleted(key, "committed", a.Lease.Fence)    // the fence never goes down
		// The displaced owner can do nothing any more.
		wantLeaseLost(t, "displaced owner Complete", s.Complete(ctx, key, a.Lease, []byte("late"), retention))
		wantLeaseLost(t, "displaced owner Extend", s.Extend(ctx, key, a.Lease, longLease))
		wantLeaseLost(t, "displaced owner Release", s.Release(ctx, key, a.Lease, retention))
		_, err := s.Fail(ctx, key, a.Lease, storekit.Failure{Retention: retention, Terminal: true})
		wantLeaseLost(t, "displaced owner Fail", err)
		wantCompleted(key, "committed", a.Lease.Fence)
	})
	t.Run("released and failed", func(t *testing.T) {
		for _, terminal := range []bool{false, true} {
			key := newKey(t)
			a := acquire(t, s, key, req("fp", longLease), storekit.Acquired)
			if _, err := s.Fail(ctx, key, a.Lease, storekit.Failure{Result: []byte("failure"), Terminal: terminal, Retention: retention}); err != nil {
				t.Fatalf("Fail: %v", err)
			}
			relay(key, relayed(a.Lease.Fence, "committed"))
			wantCompleted(key, "committed", a.Lease.Fence)
		}
	})
	t.Run("completed is never changed", func(t *testing.T) {
		key := newKey(t)
		a := acquire(t, s, key, req("fp", longLease), storekit.Acquired)
		if err := s.Complete(ctx, key, a.Lease, []byte("first"), retention); err != nil {
			t.Fatalf("Complete: %v", err)
		}
		relay(key, relayed(a.Lease.Fence+1, "second"))
		relay(key, relayed(a.Lease.Fence, "first")) // repeated after a lost reply
		rec := wantCompleted(key, "first", a.Lease.Fence)
		if rec.Fence != a.Lease.Fence {
			t.Errorf("fence: got %d, want %d unchanged", rec.Fence, a.Lease.Fence)
		}
		// A repeated relay of a relayed record succeeds and changes nothing.
		other := newKey(t)
		relay(other, relayed(3, "once"))
		relay(other, relayed(4, "twice"))
		wantCompleted(other, "once", 3)
	})
	t.Run("after a deletion", func(t *testing.T) {
		key := newKey(t)
		relay(key, relayed(1<<60, "far"))
		if err := s.Delete(ctx, key); err != nil {
			t.Fatalf("Delete: %v", err)
		}
		// Stores that seed fences from their clock may hand out a lower
		// fence after a deletion (as after a record loss); what matters is
		// that the relayed record kept the fence it was given.
		relay(key, relayed(5, "again"))
		wantCompleted(key, "again", 5)
	})
	t.Run("bad input", func(t *testing.T) {
		key := newKey(t)
		good := relayed(1, "x")
		cases := []struct {
			name string
			key  string
			c    storekit.Completion
		}{
			{"empty key", "", good},
			{"long key", strings.Repeat("k", storekit.MaxStoreKeyLen+1), good},
			{"zero fence", key, storekit.Completion{Fingerprint: "fp", Result: []byte("x"), Retention: retention}},
			{"empty result", key, storekit.Completion{Fingerprint: "fp", Fence: 1, Retention: retention}},
			{"zero retention", key, storekit.Completion{Fingerprint: "fp", Fence: 1, Result: []byte("x")}},
			{"long fingerprint", key, storekit.Completion{Fingerprint: strings.Repeat("f", storekit.MaxFingerprintLen+1), Fence: 1, Result: []byte("x"), Retention: retention}},
		}
		for _, tc := range cases {
			if err := r.RelayCompletion(ctx, tc.key, tc.c); !errors.Is(err, idem.ErrInvalid) {
				t.Errorf("RelayCompletion with %s: got %v, want ErrInvalid", tc.name, err)
			}
		}
		if _, err := s.Get(ctx, key); !errors.Is(err, storekit.ErrNotFound) {
			t.Fatalf("a rejected RelayCompletion left a record: Get got %v", err)
		}
	})
	t.Run("large result", func(t *testing.T) {
		key := newKey(t)
		big := bytes.Repeat([]byte{0, 1, 0xff}, 1<<18)
		relay(key, storekit.Completion{Fingerprint: "fp", Fence: 1, Result: big, Retention: retention})
		if a := acquire(t, s, key, req("fp", longLease), storekit.Replay); !bytes.Equal(a.Result, big) {
			t.Fatalf("replay of a large relayed result differs (got %d bytes)", len(a.Result))
		}
	})
}
