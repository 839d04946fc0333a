package boltstore

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/idemgo/idem"
	"github.com/idemgo/idem/storekit"
	bolt "go.etcd.io/bbolt"
)

func newReq(owner string, lease time.Duration) storekit.AcquireRequest {
	return storekit.AcquireRequest{Fingerprint: "fp", Owner: owner, Lease: lease, Retention: time.Hour}
}

func mustAcquire(t *testing.T, s *Store, key string, r storekit.AcquireRequest, want storekit.Outcome) storekit.Acquisition {
	t.Helper()
	a, err := s.Acquire(t.Context(), key, r)
	if err != nil {
		t.Fatalf("Acquire: %v", err)
	}
	if a.Outcome != want {
		t.Fatalf("Acquire: got %v, want %v (%+v)", a.Outcome, want, a)
	}
	return a
}

// TestOutcomes walks through every outcome of Acquire with a fake clock.
func TestOutcomes(t *testing.T) {
	clock := newFakeClock()
	s := openTest(t, filepath.Join(t.TempDir(), "idem.db"), WithClock(clock.Now))
	ctx := t.Context()

	a := mustAcquire(t, s, "k", newReq("o1", time.Second), storekit.Acquired)
	if want := clock.Now().UnixMicro(); a.Lease.Fence != want {
		t.Errorf("first fence: got %d, want the clock in µs %d", a.Lease.Fence, want)
	}
	if ip := mustAcquire(t, s, "k", newReq("o2", time.Second), storekit.InProgress); ip.RetryAfter != time.Second {
		t.Errorf("RetryAfter: got %v, want 1s", ip.RetryAfter)
	}
	if again := mustAcquire(t, s, "k", newReq("o1", time.Second), storekit.Acquired); again.Lease != a.Lease {
		t.Errorf("repeated Acquire: got %+v, want %+v", again.Lease, a.Lease)
	}
	mismatch := newReq("o2", time.Second)
	mismatch.Fingerprint = "other"
	mustAcquire(t, s, "k", mismatch, storekit.Mismatch)

	clock.Add(time.Second)
	b := mustAcquire(t, s, "k", newReq("o2", time.Second), storekit.TakenOver)
	if b.PreviousOwner != "o1" || b.Lease.Fence <= a.Lease.Fence || b.Attempts != 2 {
		t.Errorf("takeover: got %+v, want previous owner o1, fence > %d, attempts 2", b, a.Lease.Fence)
	}
	if err := s.Complete(ctx, "k", b.Lease, []byte("done"), time.Hour); err != nil {
		t.Fatal(err)
	}
	r := mustAcquire(t, s, "k", newReq("o3", time.Second), storekit.Replay)
	if r.State != storekit.StateCompleted || string(r.Result) != "done" || r.Attempts != 2 {
		t.Errorf("replay: got %+v, want COMPLETED done attempts 2", r)
	}

	c := mustAcquire(t, s, "k2", newReq("o4", time.Second), storekit.Acquired)
	if st, err := s.Fail(ctx, "k2", c.Lease, storekit.Failure{Result: []byte("no"), Terminal: true, Retention: time.Hour}); err != nil || st != storekit.StateFailed {
		t.Fatalf("Fail: got %v, %v", st, err)
	}
	if r := mustAcquire(t, s, "k2", newReq("o5", time.Second), storekit.Replay); r.State != storekit.StateFailed || string(r.Result) != "no" {
		t.Errorf("replay of FAILED: got %+v", r)
	}
}

// TestStaleOwner checks that every owner-only method refuses a stale owner
// or fence with ErrLeaseLost and changes nothing.
func TestStaleOwner(t *testing.T) {
	clock := newFakeClock()
	s := openTest(t, filepath.Join(t.TempDir(), "idem.db"), WithClock(clock.Now))
	ctx := t.Context()
	first := mustAcquire(t, s, "k", newReq("o1", time.Second), storekit.Acquired)
	clock.Add(1500 * time.Millisecond) // past the lease, before the record expires
	second := mustAcquire(t, s, "k", newReq("o2", time.Minute), storekit.TakenOver)
	calls := map[string]func(l storekit.Lease) error{
		"Complete": func(l storekit.Lease) error { return s.Complete(ctx, "k", l, []byte("x"), time.Hour) },
		"Fail": func(l storekit.Lease) error {
			_, err := s.Fail(ctx, "k", l, storekit.Failure{Terminal: true, Retention: time.Hour})
			return err
		},
		"Extend":  func(l storekit.Lease) error { return s.Extend(ctx, "k", l, time.Hour) },
		"Release": func(l storekit.Lease) error { return s.Release(ctx, "k", l, time.Hour) },
	}
	stale := map[string]storekit.Lease{
		"taken over":  first.Lease,
		"other owner": {Owner: "o1", Fence: second.Lease.Fence},
		"older fence": {Owner: "o2", Fence: second.Lease.Fence - 1},
		"newer fence": {Owner: "o2", Fence: second.Lease.Fence + 1},
	}
	for name, call := range calls {
		for how, l := range stale {
			if err := call(l); !errors.Is(err, idem.ErrLeaseLost) {
				t.Errorf("%s by %s: got %v, want ErrLeaseLost", name, how, err)
			}
		}
	}
	rec, err := s.Get(ctx, "k")
	if err != nil {
		t.Fatal(err)
	}
	if rec.State != storekit.StateInProgress || rec.Owner != "o2" || rec.Fence != second.Lease.Fence || !rec.LeaseUntil.Equal(clock.Now().Add(time.Minute)) {
		t.Fatalf("record after stale calls: got %+v", rec)
	}
}

// TestRestart checks that records and the last fence issued survive Close
// and Open, even when the clock went back and the record was deleted.
func TestRestart(t *testing.T) {
	clock := newFakeClock()
	path := filepath.Join(t.TempDir(), "idem.db")
	ctx := t.Context()
	s, err := Open(path, WithClock(clock.Now))
	if err != nil {
		t.Fatal(err)
	}
	a := mustAcquire(t, s, "done", newReq("o1", time.Second), storekit.Acquired)
	if err := s.Complete(ctx, "done", a.Lease, []byte("result"), time.Hour); err != nil {
		t.Fatal(err)
	}
	held := mustAcquire(t, s, "held", newReq("o2", time.Minute), storekit.Acquired)
	gone := mustAcquire(t, s, "gone", newReq("o3", time.Minute), storekit.Acquired)
	if err := s.Delete(ctx, "gone"); err != nil {
		t.Fatal(err)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	if err := s.Close(); err != nil {
		t.Fatalf("second Close: %v", err)
	}

	clock.Add(-24 * time.Hour) // the fence must grow all the same
	s = openTest(t, path, WithClock(clock.Now))
	clock.Add(24*time.Hour + time.Second)
	if r := mustAcquire(t, s, "done", newReq("o4", time.Second), storekit.Replay); string(r.Result) != "result" {
		t.Errorf("replay after restart: got %q, want result", r.Result)
	}
	rec, err := s.Get(ctx, "held")
	if err != nil || rec.State != storekit.StateInProgress || rec.Fence != held.Lease.Fence || rec.Owner != "o2" {
		t.Fatalf("held record after restart: got %+v, %v", rec, err)
	}
	if err := s.Complete(ctx, "held", held.Lease, []byte("late"), time.Hour); err != nil {
		t.Fatalf("owner completes after restart: %v", err)
	}
	clock.Add(-48 * time.Hour)
	again := mustAcquire(t, s, "gone", newReq("o5", time.Second), storekit.Acquired)
	if again.Lease.Fence <= gone.Lease.Fence {
		t.Fatalf("fence after restart, delete and a clock that went back: got %d, want > %d", again.Lease.Fence, gone.Lease.Fence)
	}
}

func TestOpenLocked(t *testing.T) {
	path := filepath.Join(t.TempDir(), "idem.db")
	openTest(t, path)
	start := time.Now()
	s, err := Open(path, WithLockTimeout(200*time.Millisecond))
	if err == nil {
		s.Close()
		t.Fatal("second Open of an open file succeeded")
	}
	if !errors.Is(err, ErrLocked) {
		t.Fatalf("second Open: got %v, want ErrLocked", err)
	}
	if d := time.Since(start); d > 2*time.Second {
		t.Fatalf("second Open took %v", d)
	}
}

func TestOpenBadInput(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "idem.db")
	for name, opts := range map[string][]Option{
		"nil clock":               {WithClock(nil)},
		"zero lock timeout":       {WithLockTimeout(0)},
		"negative sweep interval": {WithSweepInterval(-time.Second)},
	} {
		if _, err := Open(path, opts...); !errors.Is(err, idem.ErrInvalid) {
			t.Errorf("Open with %s: got %v, want ErrInvalid", name, err)
		}
	}
	if _, err := Open(""); !errors.Is(err, idem.ErrInvalid) {
		t.Errorf("Open of an empty path: got %v, want ErrInvalid", err)
	}
	if _, err := Open(filepath.Join(dir, "missing", "idem.db")); err == nil {
		t.Error("Open in a missing directory succeeded")
	}
	garbage := filepath.Join(dir, "garbage.db")
	if err := os.WriteFile(garbage, []byte("this is not a bolt file, not at all, and long enough to look like one? no."), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := Open(garbage); err == nil {
		t.Error("Open of a garbage file succeeded")
	}
	// A bolt file of another program.
	foreign := filepath.Join(dir, "foreign.db")
	db, err := bolt.Open(foreign, 0o600, nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := db.Update(func(tx *bolt.Tx) error { _, err := tx.CreateBucket([]byte("theirs")); return err }); err != nil {
		t.Fatal(err)
	}
	db.Close()
	if _, err := Open(foreign); !errors.Is(err, ErrCorrupt) {
		t.Errorf("Open of another program's bolt file: got %v, want ErrCorrupt", err)
	}
}

// TestExpiry checks that expired records read as absent and are swept from
// the file, by writes and by the background sweeper.
func TestExpiry(t *testing.T) {
	clock := newFakeClock()
	s := openTest(t, filepath.Join(t.TempDir(), "idem.db"), WithClock(clock.Now), WithSweepInterval(0))
	ctx := t.Context()
	const n = 100
	for i := range n {
		key := fmt.Sprint("k", i)
		a := mustAcquire(t, s, key, newReq("o", time.Second), storekit.Acquired)
		if i%2 == 0 {
			if err := s.Complete(ctx, key, a.Lease, []byte("r"), time.Minute); err != nil {
				t.Fatal(err)
			}
		}
	}
	// The IN_PROGRESS records expire 2 leases and a grace after they were
	// acquired.
	clock.Add(2*time.Second + storekit.InProgressGrace)
	for i := range n {
		_, err := s.Get(ctx, fmt.Sprint("k", i))
		if i%2 == 0 && err != nil {
			t.Fatalf("completed record: %v", err)
		}
		if i%2 == 1 && !errors.Is(err, storekit.ErrNotFound) {
			t.Fatalf("abandoned record 2 leases and a grace later: got %v, want ErrNotFound", err)
		}
	}
	if entries, err := s.List(ctx, 1000); err != nil || len(entries) != n/2 {
		t.Fatalf("List: got %d entries, %v, want %d", len(entries), err, n/2)
	}
	// Checkpoints sweep as they go.
	for i := range 10 {
		mustAcquire(t, s, fmt.Sprint("new", i), newReq("o", time.Hour), storekit.Acquired)
	}
	if recs, idx := onDisk(t, s); recs != 0 || idx != 0 {
		t.Fatalf("before a checkpoint: %d records and %d index entries in the file, want none", recs, idx)
	}
	if _, err := s.requestCheckpoint(ctx); err != nil {
		t.Fatal(err)
	}
	if recs, idx := onDisk(t, s); recs != 10+n/2 || idx != recs {
		t.Fatalf("after writes: %d records and %d index entries on disk, want %d", recs, idx, 10+n/2)
	}
	// The retention of the completed ones ends; the sweeper removes them
	// without any write from callers.
	clock.Add(time.Minute)
	s.sweepExpired()
	if recs, idx := onDisk(t, s); recs != 10 || idx != 10 {
		t.Fatalf("after the sweep: %d records and %d index entries on disk, want 10", recs, idx)
	}
	// An expired record is replaced, not replayed.
	a := mustAcquire(t, s, "k0", newReq("o", time.Second), storekit.Acquired)
	if a.Attempts != 1 {
		t.Fatalf("attempts of a record acquired after expiry: got %d, want 1", a.Attempts)
	}
}

func TestBackgroundSweeper(t *testing.T) {
	clock := newFakeClock()
	s := openTest(t, filepath.Join(t.TempDir(), "idem.db"), WithClock(clock.Now), WithSweepInterval(5*time.Millisecond))
	for i := range 2*sweepBatch + 10 {
		mustAcquire(t, s, fmt.Sprint("k", i), newReq("o", time.Millisecond), storekit.Acquired)
	}
	clock.Add(time.Minute)
	deadline := time.Now().Add(10 * time.Second)
	for {
		recs, idx := onDisk(t, s)
		logged := inOverlay(s)
		if recs == 0 && idx == 0 && logged == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("sweeper left %d records and %d index entries in the file, and %d records in the log", recs, idx, logged)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func TestCorruptRecord(t *testing.T) {
	s := openTest(t, filepath.Join(t.TempDir(), "idem.db"))
	ctx := t.Context()
	a := mustAcquire(t, s, "bad", newReq("o", time.Minute), storekit.Acquired)
	mustAcquire(t, s, "good", newReq("o", time.Minute), storekit.Acquired)
	if _, err := s.requestCheckpoint(ctx); err != nil {
		t.Fatal(err)
	}
	err := s.db.Update(func(tx *bolt.Tx) error {
		return tx.Bucket(bucketRecords).Put([]byte("bad"), []byte{recordVersion, byte(storekit.StateInProgress), 0xff})
	})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.Get(ctx, "bad"); !errors.Is(err, ErrCorrupt) {
		t.Errorf("Get: got %v, want ErrCorrupt", err)
	}
	if _, err := s.Acquire(ctx, "bad", newReq("o2", time.Minute)); !errors.Is(err, ErrCorrupt) {
		t.Errorf("Acquire: got %v, want ErrCorrupt", err)
	}
	if err := s.Complete(ctx, "bad", a.Lease, nil, time.Hour); !errors.Is(err, ErrCorrupt) {
		t.Errorf("Complete: got %v, want ErrCorrupt", err)
	}
	if _, err := s.List(ctx, 10); !errors.Is(err, ErrCorrupt) {
		t.Errorf("List: got %v, want ErrCorrupt", err)
	}
	// Other keys, even in the same group commit, are unaffected, and the
	// corrupt record can be deleted.
	var wg sync.WaitGroup
	for i := range 20 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if _, err := s.Acquire(ctx, fmt.Sprint("other", i), newReq("o", time.Minute)); err != nil {
				t.Errorf("Acquire of another key: %v", err)
			}
			s.Extend(ctx, "bad", a.Lease, time.Minute)
		}()
	}
	wg.Wait()
	if err := s.Delete(ctx, "bad"); err != nil {
		t.Fatalf("Delete of the corrupt record: %v", err)
	}
	mustAcquire(t, s, "bad", newReq("o3", time.Minute), storekit.Acquired)
	if _, err := s.Get(ctx, "good"); err != nil {
		t.Fatal(err)
	}
}

func TestWatch(t *testing.T) {
	s := openTest(t, filepath.Join(t.TempDir(), "idem.db"))
	ctx := t.Context()
	a := mustAcquire(t, s, "k", newReq("o", time.Minute), storekit.Acquired)
	ch1, stop1, err := s.Watch(ctx, "k")
	if err != nil {
		t.Fatal(err)
	}
	defer stop1()
	ch2, stop2, _ := s.Watch(ctx, "k")
	stop2()
	stop2() // twice is fine
	other, stopOther, _ := s.Watch(ctx, "other")
	defer stopOther()
	if err := s.Extend(ctx, "k", a.Lease, time.Minute); err != nil {
		t.Fatal(err)
	}
	select {
	case <-ch1:
		t.Fatal("Extend woke the watcher")
	default:
	}
	if err := s.Complete(ctx, "k", a.Lease, nil, time.Hour); err != nil {
		t.Fatal(err)
	}
	for _, ch := range []<-chan struct{}{ch1, ch2} {
		select {
		case <-ch:
		case <-time.After(5 * time.Second):
			t.Fatal("Complete did not wake the watcher")
		}
	}
	select {
	case <-other:
		t.Fatal("Complete of k woke the watcher of another key")
	default:
	}
	if _, _, err := s.Watch(ctx, ""); !errors.Is(err, idem.ErrInvalid) {
		t.Errorf("Watch of an empty key: got %v, want ErrInvalid", err)
	}
	// Await of the Executor uses Watch.
	e, err := idem.New(s, idem.WithLease(time.Minute))
	if err != nil {
		t.Fatal(err)
	}
	key := idem.Key{ID: "awaited"}
	_, att, err := e.Begin(ctx, key, "fp")
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- e.Await(ctx, key) }()
	time.Sleep(20 * time.Millisecond)
	if err := att.Commit(ctx, []byte("v")); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-done:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("Await was not woken by Commit")
	}
}

func TestClosed(t *testing.T) {
	s, err := Open(filepath.Join(t.TempDir(), "idem.db"))
	if err != nil {
		t.Fatal(err)
	}
	ctx := t.Context()
	ch, stop, err := s.Watch(ctx, "k")
	if err != nil {
		t.Fatal(err)
	}
	defer stop()
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	select {
	case <-ch:
	default:
		t.Error("Close did not close the watch channel")
	}
	l := storekit.Lease{Owner: "o", Fence: 1}
	calls := map[string]error{
		"Acquire":  func() error { _, err := s.Acquire(ctx, "k", newReq("o", time.Second)); return err }(),
		"Complete": s.Complete(ctx, "k", l, nil, time.Hour),
		"Get":      func() error { _, err := s.Get(ctx, "k"); return err }(),
		"Delete":   s.Delete(ctx, "k"),
		"List":     func() error { _, err := s.List(ctx, 1); return err }(),
		"Watch":    func() error { _, _, err := s.Watch(ctx, "k"); return err }(),
	}
	for name, err := range calls {
		if !errors.Is(err, ErrClosed) {
			t.Errorf("%s after Close: got %v, want ErrClosed", name, err)
		}
	}
}

func TestCancelledContext(t *testing.T) {
	s := openTest(t, filepath.Join(t.TempDir(), "idem.db"))
	ctx, cancel := context.WithCancel(t.Context())
	cancel()
	if _, err := s.Acquire(ctx, "k", newReq("o", time.Second)); !errors.Is(err, context.Canceled) {
		t.Fatalf("Acquire: got %v, want context.Canceled", err)
	}
	if _, err := s.Get(t.Context(), "k"); !errors.Is(err, storekit.ErrNotFound) {
		t.Fatalf("a cancelled Acquire wrote: Get got %v", err)
	}
	// Contexts that end while calls are queued: each call either fails with
	// the context's error and wrote nothing, or succeeded.
	var wg sync.WaitGroup
	for i := range 200 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			ctx, cancel := context.WithTimeout(t.Context(), time.Duration(i%5)*100*time.Microsecond)
			defer cancel()
			key := fmt.Sprint("c", i)
			_, err := s.Acquire(ctx, key, newReq("o", time.Minute))
			_, gerr := s.Get(t.Context(), key)
			switch {
			case err == nil && gerr != nil:
				t.Errorf("Acquire succeeded but Get: %v", gerr)
			case err != nil && !errors.Is(err, context.DeadlineExceeded):
				t.Errorf("Acquire: %v", err)
			case err != nil && !errors.Is(gerr, storekit.ErrNotFound):
				t.Errorf("Acquire failed with %v but the record exists (%v)", err, gerr)
			}
		}()
	}
	wg.Wait()
}

func TestList(t *testing.T) {
	clock := newFakeClock()
	s := openTest(t, filepath.Join(t.TempDir(), "idem.db"), WithClock(clock.Now))
	ctx := t.Context()
	for i := range 5 {
		mustAcquire(t, s, fmt.Sprint("k", i), newReq(fmt.Sprint("o", i), time.Duration(i+1)*time.Second), storekit.Acquired)
	}
	clock.Add(2*time.Second + storekit.InProgressGrace) // k0 expired (2 leases of 1s and the grace)
	got, err := s.List(ctx, 10)
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != 4 || got[0].Key != "k1" || got[3].Key != "k4" || got[0].Record.Owner != "o1" || got[0].Record.State != storekit.StateInProgress {
		t.Fatalf("List: got %+v, want k1..k4", got)
	}
	if got, err := s.List(ctx, 2); err != nil || len(got) != 2 || got[1].Key != "k2" {
		t.Fatalf("List with limit 2: got %+v, %v", got, err)
	}
	if _, err := s.List(ctx, 0); !errors.Is(err, idem.ErrInvalid) {
		t.Fatalf("List with limit 0: got %v, want ErrInvalid", err)
	}
}

// TestCloseWhileBusy closes the store while goroutines write and read: each
// call succeeds or returns ErrClosed, and Close waits for the writes it let
// in.
func TestCloseWhileBusy(t *testing.T) {
	path := filepath.Join(t.TempDir(), "idem.db")
	s, err := Open(path, WithSweepInterval(time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	ctx := t.Context()
	var (
		wg   sync.WaitGroup
		mu   sync.Mutex
		done []string
	)
	for g := range 16 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; ; i++ {
				key := fmt.Sprint("g", g, "-", i)
				a, err := s.Acquire(ctx, key, newReq("o", time.Minute))
				if err == nil {
					err = s.Complete(ctx, key, a.Lease, nil, time.Hour)
				}
				if errors.Is(err, ErrClosed) {
					return
				}
				if err != nil {
					t.Errorf("during Close: %v", err)
					return
				}
				mu.Lock()
				done = append(done, key)
				mu.Unlock()
				if _, err := s.Get(ctx, key); err != nil && !errors.Is(err, ErrClosed) {
					t.Errorf("Get during Close: %v", err)
				}
			}
		}()
	}
	time.Sleep(50 * time.Millisecond)
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	wg.Wait()
	s = openTest(t, path)
	for _, key := range done {
		if rec, err := s.Get(ctx, key); err != nil || rec.State != storekit.StateCompleted {
			t.Fatalf("%s after Close and Open: got %v, %v", key, rec.State, err)
		}
	}
}

// TestNoChangeNoSync checks that calls that change nothing (a stale owner,
// a repeated call, deleting an absent key, outcomes read from the store)
// write nothing, so they cost no fsync.
func TestNoChangeNoSync(t *testing.T) {
	s := openTest(t, filepath.Join(t.TempDir(), "idem.db"), WithSweepInterval(0))
	ctx := t.Context()
	pageWrites := func() int64 { return s.log.frames.Load() }
	a := mustAcquire(t, s, "k", newReq("o", time.Minute), storekit.Acquired)
	if err := s.Release(ctx, "k", a.Lease, time.Hour); err != nil {
		t.Fatal(err)
	}
	b := mustAcquire(t, s, "k2", newReq("o2", time.Minute), storekit.Acquired)
	before := pageWrites()
	if err := s.Complete(ctx, "k", a.Lease, nil, time.Hour); !errors.Is(err, idem.ErrLeaseLost) {
		t.Fatalf("stale Complete: got %v, want ErrLeaseLost", err)
	}
	if err := s.Release(ctx, "k", a.Lease, time.Hour); err != nil {
		t.Fatalf("repeated Release: %v", err)
	}
	if err := s.Delete(ctx, "absent"); err != nil {
		t.Fatal(err)
	}
	mustAcquire(t, s, "k2", newReq("o3", time.Minute), storekit.InProgress)
	if again := mustAcquire(t, s, "k2", newReq("o2", time.Minute), storekit.Acquired); again.Lease != b.Lease {
		t.Fatalf("repeated Acquire: got %+v, want %+v", again.Lease, b.Lease)
	}
	if after := pageWrites(); after != before {
		t.Fatalf("calls that change nothing wrote %d log frames", after-before)
	}
	if err := s.Complete(ctx, "k2", b.Lease, nil, time.Hour); err != nil {
		t.Fatal(err)
	}
	if pageWrites() == before {
		t.Fatal("Complete wrote no log frame")
	}
}
