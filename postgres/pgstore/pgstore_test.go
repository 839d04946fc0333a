package pgstore_test

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/idemgo/idem"
	"github.com/idemgo/idem/postgres/pggate"
	"github.com/idemgo/idem/postgres/pgstore"
	"github.com/idemgo/idem/postgres/pgtest"
	"github.com/idemgo/idem/storekit"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// TestAwaitWokenByNotify: a waiter on one Store is woken by a completion
// through another Store (another process) on the same database, well
// before the lease ends.
func TestAwaitWokenByNotify(t *testing.T) {
	pool, url := pgtest.Pool(t)
	a, err := pgstore.New(pool)
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	if err := a.Migrate(t.Context()); err != nil {
		t.Fatal(err)
	}
	pool2, err := pgxpool.New(t.Context(), url)
	if err != nil {
		t.Fatal(err)
	}
	defer pool2.Close()
	b, err := pgstore.New(pool2)
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	ea, err := idem.New(a, idem.WithLease(time.Minute))
	if err != nil {
		t.Fatal(err)
	}
	eb, err := idem.New(b, idem.WithLease(time.Minute))
	if err != nil {
		t.Fatal(err)
	}
	key := idem.Key{Scope: "t", ID: "await"}
	_, at, err := ea.Begin(t.Context(), key, "fp")
	if err != nil {
		t.Fatal(err)
	}
	woke := make(chan error, 1)
	go func() { woke <- eb.Await(context.Background(), key) }()
	// Await polls every second at the latest when a notification is lost;
	// waking well within that shows the notification arrived. Wait until
	// the waiter has registered (it is IN_PROGRESS, so it must block).
	select {
	case err := <-woke:
		t.Fatalf("Await returned before the completion: %v", err)
	case <-time.After(100 * time.Millisecond):
	}
	start := time.Now()
	if err := at.Commit(t.Context(), []byte("done")); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-woke:
		if err != nil {
			t.Fatalf("Await: %v", err)
		}
		if d := time.Since(start); d > 900*time.Millisecond {
			t.Errorf("Await woke %v after the completion: not by the notification", d)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("Await not woken 10s after the completion")
	}
}

func TestMissingSchema(t *testing.T) {
	pool, _ := pgtest.Pool(t)
	s, err := pgstore.New(pool)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	_, err = s.Acquire(t.Context(), "k", storekit.AcquireRequest{Fingerprint: "fp", Owner: "o", Lease: time.Second, Retention: time.Hour})
	if !errors.Is(err, pgstore.ErrNoSchema) {
		t.Fatalf("Acquire without the schema: got %v, want ErrNoSchema", err)
	}
	if storekit.OutcomeUnknown(err) == false {
		// A missing schema is not bad input: the caller may repeat after
		// Migrate; it is reported as a store error.
		t.Fatalf("OutcomeUnknown(%v) = false", err)
	}
}

// TestGateOnPgstoreRefusesStaleOwner: on pgstore the gate completes the
// record inside the transaction, so an owner whose lease was taken over is
// refused before anything commits, even before the new owner commits.
func TestGateOnPgstoreRefusesStaleOwner(t *testing.T) {
	pool, _ := pgtest.Pool(t)
	s, err := pgstore.New(pool)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if err := s.Migrate(t.Context()); err != nil {
		t.Fatal(err)
	}
	e, err := idem.New(s, idem.WithLease(time.Minute))
	if err != nil {
		t.Fatal(err)
	}
	g, err := pggate.New(e, pool, pggate.WithRelayInterval(0))
	if err != nil {
		t.Fatal(err)
	}
	defer g.Close()
	if err := g.Migrate(t.Context()); err != nil {
		t.Fatal(err)
	}
	if _, err := pool.Exec(t.Context(), `CREATE TABLE effects (key text NOT NULL)`); err != nil {
		t.Fatal(err)
	}
	key := idem.Key{Scope: "t", ID: "stale"}
	inFn := make(chan struct{})
	resume := make(chan struct{})
	var resumeOnce sync.Once
	// The stale owner's transaction must end before the schema is dropped.
	defer resumeOnce.Do(func() { close(resume) })
	staleErr := make(chan error, 1)
	go func() {
		_, err := g.Do(context.Background(), key, "fp", func(ctx context.Context, tx pgx.Tx) ([]byte, error) {
			if _, err := tx.Exec(ctx, `INSERT INTO effects VALUES ('stale')`); err != nil {
				return nil, err
			}
			close(inFn)
			<-resume
			return []byte("stale"), nil
		})
		staleErr <- err
	}()
	<-inFn
	// A newer owner takes the record (the stale owner's heartbeat keeps
	// its lease alive, so the record is deleted first, as an operator's
	// idem rm or a lost record would) and has not committed anything.
	if err := s.Delete(t.Context(), key.Digest()); err != nil {
		t.Fatal(err)
	}
	a, err := s.Acquire(t.Context(), key.Digest(), storekit.AcquireRequest{Fingerprint: "fp", Owner: "new", Lease: time.Minute, Retention: time.Hour})
	if err != nil || a.Outcome != storekit.Acquired {
		t.Fatalf("new owner: got %+v, %v, want Acquired", a, err)
	}
	resumeOnce.Do(func() { close(resume) })
	err = <-staleErr
	if !errors.Is(err, idem.ErrLeaseLost) {
		t.Fatalf("stale owner: got %v, want ErrLeaseLost (refused in its transaction)", err)
	}
	var n int
	pool.QueryRow(t.Context(), `SELECT count(*) FROM effects`).Scan(&n)
	if n != 0 {
		t.Fatalf("effects: got %d, want 0 (the stale owner's transaction rolled back)", n)
	}
}

// TestGateOnPgstore: the record is completed in the caller's transaction;
// the completion row needs no relay; a duplicate replays.
func TestGateOnPgstore(t *testing.T) {
	pool, _ := pgtest.Pool(t)
	s, err := pgstore.New(pool)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if err := s.Migrate(t.Context()); err != nil {
		t.Fatal(err)
	}
	e, err := idem.New(s)
	if err != nil {
		t.Fatal(err)
	}
	g, err := pggate.New(e, pool, pggate.WithRelayInterval(0))
	if err != nil {
		t.Fatal(err)
	}
	defer g.Close()
	if err := g.Migrate(t.Context()); err != nil {
		t.Fatal(err)
	}
	key := idem.Key{Scope: "t", ID: "k"}
	runs := 0
	fn := func(ctx context.Context, tx pgx.Tx) ([]byte, error) { runs++; return []byte("v"), nil }
	if res, err := g.Do(t.Context(), key, "fp", fn); err != nil || res.Replayed {
		t.Fatalf("Do: got %+v, %v", res, err)
	}
	rec, err := s.Get(t.Context(), key.Digest())
	if err != nil || rec.State != storekit.StateCompleted {
		t.Fatalf("record: got %v, %v, want COMPLETED", rec.State, err)
	}
	var relayed bool
	pool.QueryRow(t.Context(), `SELECT relayed FROM idem_completions WHERE digest = $1`, key.Digest()).Scan(&relayed)
	if !relayed {
		t.Error("the completion row of a pgstore record is not marked relayed")
	}
	if res, err := g.Do(t.Context(), key, "fp", fn); err != nil || !res.Replayed || string(res.Value) != "v" || runs != 1 {
		t.Fatalf("duplicate: got %+v, %v, runs %d, want the replay", res, err, runs)
	}
}

func TestList(t *testing.T) {
	s := newStore(t)
	ctx := t.Context()
	for _, k := range []string{"a", "b", "c"} {
		if _, err := s.Acquire(ctx, k, storekit.AcquireRequest{Fingerprint: "fp", Owner: "o" + k, Lease: time.Minute, Retention: time.Hour}); err != nil {
			t.Fatal(err)
		}
	}
	es, err := s.List(ctx, 0)
	if err != nil || len(es) != 3 {
		t.Fatalf("List: got %d entries, %v, want 3", len(es), err)
	}
	for _, e := range es {
		if e.Record.State != storekit.StateInProgress || e.Record.Owner != "o"+e.Key || e.Record.LeaseUntil.IsZero() {
			t.Errorf("entry %s: got %+v", e.Key, e.Record)
		}
	}
	if es, err := s.List(ctx, 2); err != nil || len(es) != 2 {
		t.Fatalf("List(2): got %d entries, %v", len(es), err)
	}
}
