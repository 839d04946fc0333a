package pggate_test

import (
	"context"
	"database/sql"
	"errors"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idemgo/idem"
	"github.com/idemgo/idem/memstore"
	"github.com/idemgo/idem/observe"
	"github.com/idemgo/idem/postgres/pggate"
	"github.com/idemgo/idem/postgres/pgtest"
	"github.com/idemgo/idem/storekit"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	_ "github.com/jackc/pgx/v5/stdlib"
)

// clock is a settable clock for memstore.
type clock struct {
	mu  sync.Mutex
	now time.Time
}

func (c *clock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

func (c *clock) Add(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.now = c.now.Add(d)
}

type env struct {
	pool  *pgxpool.Pool
	url   string
	store *memstore.Store
	clock *clock
	exec  *idem.Executor
	gate  *pggate.Gate[pgx.Tx]
}

// newEnv returns a gate on a memstore with a settable clock and a fresh
// schema holding the completion table and an effects table without any
// unique key (the sink does no fence check: every duplicate shows).
func newEnv(t *testing.T, opts ...pggate.Option) *env {
	t.Helper()
	pool, url := pgtest.Pool(t)
	return newEnvOn(t, pool, url, opts...)
}

// newEnvOn is newEnv on pool, a pool of the fresh schema at url.
func newEnvOn(t *testing.T, pool *pgxpool.Pool, url string, opts ...pggate.Option) *env {
	t.Helper()
	c := &clock{now: time.Now()}
	ms, err := memstore.New(memstore.WithClock(c.Now))
	if err != nil {
		t.Fatal(err)
	}
	e, err := idem.New(ms, idem.WithLease(time.Minute))
	if err != nil {
		t.Fatal(err)
	}
	g, err := pggate.New(e, pool, append([]pggate.Option{pggate.WithRelayInterval(0)}, opts...)...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { g.Close() })
	if err := g.Migrate(t.Context()); err != nil {
		t.Fatalf("Migrate: %v", err)
	}
	if _, err := pool.Exec(t.Context(), `CREATE TABLE effects (key text NOT NULL, fence bigint NOT NULL)`); err != nil {
		t.Fatal(err)
	}
	return &env{pool: pool, url: url, store: ms, clock: c, exec: e, gate: g}
}

// effect is an operation whose effect is one row in effects.
func effect(id string, result string) func(ctx context.Context, tx pgx.Tx) ([]byte, error) {
	return func(ctx context.Context, tx pgx.Tx) ([]byte, error) {
		fence, _ := idem.FenceFrom(ctx)
		_, err := tx.Exec(ctx, `INSERT INTO effects (key, fence) VALUES ($1, $2)`, id, fence)
		return []byte(result), err
	}
}

func (v *env) effects(t *testing.T, id string) int {
	t.Helper()
	var n int
	if err := v.pool.QueryRow(t.Context(), `SELECT count(*) FROM effects WHERE key = $1`, id).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

func (v *env) row(t *testing.T, key idem.Key) (fence int64, relayed bool, ok bool) {
	t.Helper()
	err := v.pool.QueryRow(t.Context(), `SELECT fence, relayed FROM idem_completions WHERE digest = $1`, key.Digest()).Scan(&fence, &relayed)
	if errors.Is(err, pgx.ErrNoRows) {
		return 0, false, false
	}
	if err != nil {
		t.Fatal(err)
	}
	return fence, relayed, true
}

// xmin is the transaction that wrote the completion row of key last.
func (v *env) xmin(t *testing.T, key idem.Key) string {
	t.Helper()
	var x string
	if err := v.pool.QueryRow(t.Context(), `SELECT xmin::text FROM idem_completions WHERE digest = $1`, key.Digest()).Scan(&x); err != nil {
		t.Fatal(err)
	}
	return x
}

func TestDoCommitsOnceAndReplays(t *testing.T) {
	v := newEnv(t, pggate.WithRelayDelay(0))
	key := idem.Key{Scope: "t", ID: "k1"}
	res, err := v.gate.Do(t.Context(), key, "fp", effect("k1", "paid"))
	if err != nil || res.Replayed || string(res.Value) != "paid" || res.Fence == 0 {
		t.Fatalf("first Do: got %+v, %v, want paid, not replayed, a fence", res, err)
	}
	written := v.xmin(t, key)
	rec0Fence := res.Fence
	ran := false
	res, err = v.gate.Do(t.Context(), key, "fp", func(context.Context, pgx.Tx) ([]byte, error) { ran = true; return nil, nil })
	if err != nil || !res.Replayed || string(res.Value) != "paid" || ran {
		t.Fatalf("second Do: got %+v, %v, ran %v, want the replay of paid without running", res, err, ran)
	}
	if n := v.effects(t, "k1"); n != 1 {
		t.Fatalf("effects: got %d, want 1", n)
	}
	fence, _, ok := v.row(t, key)
	if first := rec0Fence; !ok || fence != first {
		t.Fatalf("completion row: got fence %d (found %v), want %d", fence, ok, first)
	}
	rec, err := v.store.Get(t.Context(), key.Digest())
	if err != nil || rec.State != storekit.StateCompleted {
		t.Fatalf("store record: got %v, %v, want COMPLETED", rec.State, err)
	}
	// The row is written once: neither the relay nor Close marks it.
	if n, err := v.gate.Relay(t.Context()); err != nil || n != 0 {
		t.Fatalf("Relay: got %d, %v, want 0 (the gate copied the completion itself)", n, err)
	}
	v.gate.Close()
	if x := v.xmin(t, key); x != written {
		t.Fatalf("the completion row was written again (xmin %s, then %s): one write per key", written, x)
	}
}

// TestReplayWithoutPostgres: through the hybrid gate (redisstore), a replay
// is answered from Redis alone, without a statement to Postgres
// (docs/postgres.md): it succeeds with the pool closed, where a new key
// fails.
func TestReplayWithoutPostgres(t *testing.T) {
	v := newRedisEnv(t, 5*time.Second)
	paid := func(id string) func(ctx context.Context, tx pgx.Tx) ([]byte, error) {
		return func(ctx context.Context, tx pgx.Tx) ([]byte, error) {
			_, err := tx.Exec(ctx, `INSERT INTO effects (key) VALUES ($1)`, id)
			return []byte("paid"), err
		}
	}
	key := idem.Key{Scope: "t", ID: "k1"}
	if _, err := v.gate.Do(t.Context(), key, "fp", paid("k1")); err != nil {
		t.Fatal(err)
	}
	v.pool.Close()
	ran := false
	res, err := v.gate.Do(t.Context(), key, "fp", func(context.Context, pgx.Tx) ([]byte, error) { ran = true; return nil, nil })
	if err != nil || !res.Replayed || string(res.Value) != "paid" || ran {
		t.Fatalf("replay with the pool closed: got %+v, %v, ran %v, want the replay of paid", res, err, ran)
	}
	// The control: a new key needs Postgres, and the closed pool refuses it.
	if _, err := v.gate.Do(t.Context(), idem.Key{Scope: "t", ID: "k2"}, "fp", paid("k2")); err == nil {
		t.Fatal("a new key with the pool closed succeeded: the pool is not closed, and the replay above proves nothing")
	}
}

// TestRecordLostReplaysCommittedCompletion: the store forgets the record
// after the commit (a Redis failover, FLUSHALL). The retry runs the
// function, whose effect the completion's unique key rolls back.
func TestRecordLostReplaysCommittedCompletion(t *testing.T) {
	v := newEnv(t)
	key := idem.Key{Scope: "t", ID: "lost"}
	if _, err := v.gate.Do(t.Context(), key, "fp", effect("lost", "first")); err != nil {
		t.Fatal(err)
	}
	if err := v.store.Delete(t.Context(), key.Digest()); err != nil {
		t.Fatal(err)
	}
	ran := false
	res, err := v.gate.Do(t.Context(), key, "fp", func(ctx context.Context, tx pgx.Tx) ([]byte, error) {
		ran = true
		return effect("lost", "second")(ctx, tx)
	})
	if err != nil || !res.Replayed || string(res.Value) != "first" || !ran {
		t.Fatalf("retry after the record was lost: got %+v, %v, ran %v, want the replay of first after running", res, err, ran)
	}
	if n := v.effects(t, "lost"); n != 1 {
		t.Fatalf("effects: got %d, want 1 (the retry's effect must roll back)", n)
	}
	// The store was repaired: the next duplicate replays without running.
	rec, err := v.store.Get(t.Context(), key.Digest())
	if err != nil || rec.State != storekit.StateCompleted || string(rec.Result[1:]) != "first" {
		t.Fatalf("store record: got %+v, %v, want COMPLETED with first", rec, err)
	}
	// Another payload with the lost key is a mismatch, not a new effect.
	if err := v.store.Delete(t.Context(), key.Digest()); err != nil {
		t.Fatal(err)
	}
	if _, err := v.gate.Do(t.Context(), key, "other", effect("lost", "x")); !errors.Is(err, idem.ErrMismatch) {
		t.Fatalf("other fingerprint after the loss: got %v, want ErrMismatch", err)
	}
	if n := v.effects(t, "lost"); n != 1 {
		t.Fatalf("effects: got %d, want 1", n)
	}
}

// TestStaleOwnerRolledBack: an owner paused past its lease resumes after
// the new owner committed; its transaction conflicts and rolls back.
func TestStaleOwnerRolledBack(t *testing.T) {
	v := newEnv(t)
	key := idem.Key{Scope: "t", ID: "stale"}
	inFn := make(chan struct{})
	resume := make(chan struct{})
	type out struct {
		res idem.Result
		err error
	}
	staleDone := make(chan out, 1)
	go func() {
		res, err := v.gate.Do(context.Background(), key, "fp", func(ctx context.Context, tx pgx.Tx) ([]byte, error) {
			if _, err := effect("stale", "stale")(ctx, tx); err != nil {
				return nil, err
			}
			close(inFn)
			<-resume
			return []byte("stale"), nil
		})
		staleDone <- out{res, err}
	}()
	<-inFn
	v.clock.Add(2 * time.Minute) // the stale owner's lease ends
	res, err := v.gate.Do(t.Context(), key, "fp", effect("stale", "fresh"))
	if err != nil || res.Replayed || string(res.Value) != "fresh" {
		t.Fatalf("takeover: got %+v, %v, want fresh", res, err)
	}
	close(resume)
	o := <-staleDone
	if o.err != nil || !o.res.Replayed || string(o.res.Value) != "fresh" {
		t.Fatalf("stale owner: got %+v, %v, want the replay of fresh", o.res, o.err)
	}
	if n := v.effects(t, "stale"); n != 1 {
		t.Fatalf("effects: got %d, want 1", n)
	}
}

// flaky is a store whose RelayCompletion fails while broken is set: the
// completion does not reach the store after the commit, as when the owner
// dies between the two.
type flaky struct {
	idem.Store
	r      storekit.Relayer
	broken atomic.Bool
}

func (f *flaky) RelayCompletion(ctx context.Context, key string, c storekit.Completion) error {
	if f.broken.Load() {
		return errors.New("flaky: connection refused")
	}
	return f.r.RelayCompletion(ctx, key, c)
}

func TestRelayRepairsTheStore(t *testing.T) {
	pool, _ := pgtest.Pool(t)
	ms, _ := memstore.New()
	f := &flaky{Store: ms, r: ms}
	f.broken.Store(true)
	g, _ := manualRelayGate(t, pool, f)
	key := idem.Key{Scope: "t", ID: "relay"}
	res, err := g.Do(t.Context(), key, "fp", func(context.Context, pgx.Tx) ([]byte, error) { return []byte("ok"), nil })
	if err != nil || string(res.Value) != "ok" {
		t.Fatalf("Do: got %+v, %v, want ok (the effect committed; the store is repaired later)", res, err)
	}
	rec, _ := ms.Get(t.Context(), key.Digest())
	if rec.State != storekit.StateInProgress {
		t.Fatalf("record before the relay: got %v, want IN_PROGRESS (the completion did not reach the store)", rec.State)
	}
	if _, err := g.Do(t.Context(), key, "fp", func(context.Context, pgx.Tx) ([]byte, error) { return nil, nil }); !errors.Is(err, idem.ErrInProgress) {
		t.Fatalf("duplicate before the relay: got %v, want ErrInProgress", err)
	}
	if n, err := g.Relay(t.Context()); err == nil || n != 0 {
		t.Fatalf("Relay with the store down: got %d, %v, want 0 and an error", n, err)
	}
	f.broken.Store(false)
	if n, err := g.Relay(t.Context()); err != nil || n != 1 {
		t.Fatalf("Relay: got %d, %v, want 1", n, err)
	}
	if n, err := g.Relay(t.Context()); err != nil || n != 0 {
		t.Fatalf("second Relay: got %d, %v, want 0 (the cursor is past the row)", n, err)
	}
	res, err = g.Do(t.Context(), key, "fp", func(context.Context, pgx.Tx) ([]byte, error) { return nil, errors.New("ran") })
	if err != nil || !res.Replayed || string(res.Value) != "ok" {
		t.Fatalf("duplicate after the relay: got %+v, %v, want the replay of ok", res, err)
	}
}

func TestFunctionErrorRollsBack(t *testing.T) {
	v := newEnv(t)
	ctx := t.Context()
	key := idem.Key{Scope: "t", ID: "err"}
	boom := errors.New("boom")
	_, err := v.gate.Do(ctx, key, "fp", func(ctx context.Context, tx pgx.Tx) ([]byte, error) {
		effect("err", "")(ctx, tx)
		return nil, boom
	})
	if !errors.Is(err, boom) {
		t.Fatalf("Do: got %v, want boom", err)
	}
	if n := v.effects(t, "err"); n != 0 {
		t.Fatalf("effects after an error: got %d, want 0", n)
	}
	if _, _, ok := v.row(t, key); ok {
		t.Fatal("a failed attempt left a completion row")
	}
	// Retryable: the key was released and runs again.
	if res, err := v.gate.Do(ctx, key, "fp", effect("err", "ok")); err != nil || res.Replayed {
		t.Fatalf("retry: got %+v, %v", res, err)
	}
	// Terminal: FAILED and replayed as such.
	tkey := idem.Key{Scope: "t", ID: "terminal"}
	_, err = v.gate.Do(ctx, tkey, "fp", func(context.Context, pgx.Tx) ([]byte, error) { return nil, idem.Terminal(boom) })
	if !errors.Is(err, boom) {
		t.Fatalf("terminal: got %v", err)
	}
	if _, err := v.gate.Do(ctx, tkey, "fp", effect("terminal", "")); !errors.Is(err, idem.ErrFailed) {
		t.Fatalf("after a terminal failure: got %v, want ErrFailed", err)
	}
}

func TestPanicRollsBackAndReleases(t *testing.T) {
	v := newEnv(t)
	key := idem.Key{Scope: "t", ID: "panic"}
	func() {
		defer func() {
			if recover() == nil {
				t.Fatal("the panic did not continue")
			}
		}()
		v.gate.Do(t.Context(), key, "fp", func(ctx context.Context, tx pgx.Tx) ([]byte, error) {
			effect("panic", "")(ctx, tx)
			panic("boom")
		})
	}()
	if n := v.effects(t, "panic"); n != 0 {
		t.Fatalf("effects after a panic: got %d, want 0", n)
	}
	rec, err := v.store.Get(t.Context(), key.Digest())
	if err != nil || rec.State != storekit.StateReleased {
		t.Fatalf("record after a panic: got %v, %v, want RELEASED", rec.State, err)
	}
}

func TestFunctionThatEndsTheTransaction(t *testing.T) {
	v := newEnv(t)
	for _, end := range []string{"commit", "rollback"} {
		key := idem.Key{Scope: "t", ID: end}
		_, err := v.gate.Do(t.Context(), key, "fp", func(ctx context.Context, tx pgx.Tx) ([]byte, error) {
			if end == "commit" {
				return []byte("x"), tx.Commit(ctx)
			}
			return []byte("x"), tx.Rollback(ctx)
		})
		if !errors.Is(err, pggate.ErrTxDone) {
			t.Fatalf("%s inside the function: got %v, want ErrTxDone", end, err)
		}
		// The effect may have committed without its completion: the key
		// is FAILED rather than run again.
		if _, err := v.gate.Do(t.Context(), key, "fp", effect(end, "")); !errors.Is(err, idem.ErrFailed) {
			t.Fatalf("after %s inside the function: got %v, want ErrFailed", end, err)
		}
	}
}

func TestMissingTable(t *testing.T) {
	pool, _ := pgtest.Pool(t)
	ms, _ := memstore.New()
	e, _ := idem.New(ms)
	g, err := pggate.New(e, pool, pggate.WithRelayInterval(0))
	if err != nil {
		t.Fatal(err)
	}
	defer g.Close()
	key := idem.Key{Scope: "t", ID: "k"}
	_, err = g.Do(t.Context(), key, "fp", func(context.Context, pgx.Tx) ([]byte, error) { return []byte("x"), nil })
	if !errors.Is(err, pggate.ErrNoTable) || !strings.Contains(err.Error(), "Migrate") || !strings.Contains(err.Error(), "schema.sql") {
		t.Fatalf("Do without the table: got %v, want ErrNoTable naming Migrate and schema.sql", err)
	}
	if _, err := g.Relay(t.Context()); !errors.Is(err, pggate.ErrNoTable) {
		t.Fatalf("Relay without the table: got %v, want ErrNoTable", err)
	}
	// The key was released: after Migrate the same key runs.
	if err := g.Migrate(t.Context()); err != nil {
		t.Fatal(err)
	}
	if err := g.Migrate(t.Context()); err != nil {
		t.Fatalf("Migrate again: %v", err)
	}
	if _, err := g.Do(t.Context(), key, "fp", func(context.Context, pgx.Tx) ([]byte, error) { return []byte("x"), nil }); err != nil {
		t.Fatalf("Do after Migrate: %v", err)
	}
}

func TestResultTooLarge(t *testing.T) {
	pool, _ := pgtest.Pool(t)
	ms, _ := memstore.New()
	e, _ := idem.New(ms, idem.WithMaxResultSize(10))
	g, _ := pggate.New(e, pool, pggate.WithRelayInterval(0))
	defer g.Close()
	g.Migrate(t.Context())
	pool.Exec(t.Context(), `CREATE TABLE effects (key text NOT NULL, fence bigint NOT NULL)`)
	key := idem.Key{Scope: "t", ID: "big"}
	_, err := g.Do(t.Context(), key, "fp", func(ctx context.Context, tx pgx.Tx) ([]byte, error) {
		effect("big", "")(ctx, tx)
		return make([]byte, 11), nil
	})
	if !errors.Is(err, idem.ErrResultTooLarge) {
		t.Fatalf("Do: got %v, want ErrResultTooLarge", err)
	}
	var n int
	pool.QueryRow(t.Context(), `SELECT count(*) FROM effects`).Scan(&n)
	if n != 0 {
		t.Fatalf("effects: got %d, want 0 (rolled back)", n)
	}
}

func TestSweepDeletesExpiredRows(t *testing.T) {
	pool, _ := pgtest.Pool(t)
	ms, _ := memstore.New()
	e, _ := idem.New(ms, idem.WithLease(time.Second), idem.WithRetention(time.Second)) // a lease the commit outlasts on a loaded machine
	g, _ := pggate.New(e, pool, pggate.WithRelayInterval(0), pggate.WithBatchSize(2))
	defer g.Close()
	if err := g.Migrate(t.Context()); err != nil {
		t.Fatal(err)
	}
	for _, id := range []string{"a", "b", "c", "d", "e"} {
		if _, err := g.Do(t.Context(), idem.Key{Scope: "t", ID: id}, "fp", func(context.Context, pgx.Tx) ([]byte, error) { return []byte("x"), nil }); err != nil {
			t.Fatal(err)
		}
	}
	deadline := time.Now().Add(10 * time.Second)
	total := 0
	for total < 5 {
		if time.Now().After(deadline) {
			t.Fatalf("Sweep deleted %d rows in 10s, want 5", total)
		}
		n, err := g.Sweep(t.Context())
		if err != nil {
			t.Fatal(err)
		}
		total += n
		time.Sleep(10 * time.Millisecond)
	}
	var left int
	pool.QueryRow(t.Context(), `SELECT count(*) FROM idem_completions`).Scan(&left)
	if left != 0 {
		t.Fatalf("rows left: got %d, want 0", left)
	}
}

// TestDatabaseSQL runs the gate with *sql.Tx: a commit, then a conflict
// after the record was lost.
func TestDatabaseSQL(t *testing.T) {
	url := pgtest.Schema(t)
	db, err := sql.Open("pgx", url)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	ms, _ := memstore.New()
	e, _ := idem.New(ms)
	g, err := pggate.NewSQL(e, db, pggate.WithRelayInterval(0))
	if err != nil {
		t.Fatal(err)
	}
	defer g.Close()
	if err := g.Migrate(t.Context()); err != nil {
		t.Fatal(err)
	}
	if _, err := db.ExecContext(t.Context(), `CREATE TABLE effects (key text NOT NULL)`); err != nil {
		t.Fatal(err)
	}
	fn := func(ctx context.Context, tx *sql.Tx) ([]byte, error) {
		_, err := tx.ExecContext(ctx, `INSERT INTO effects (key) VALUES ('k')`)
		return []byte("done"), err
	}
	key := idem.Key{Scope: "t", ID: "sql"}
	if res, err := g.Do(t.Context(), key, "fp", fn); err != nil || res.Replayed {
		t.Fatalf("Do: got %+v, %v", res, err)
	}
	ms.Delete(t.Context(), key.Digest())
	if res, err := g.Do(t.Context(), key, "fp", fn); err != nil || !res.Replayed || string(res.Value) != "done" {
		t.Fatalf("Do after the record was lost: got %+v, %v, want the replay", res, err)
	}
	var n int
	db.QueryRowContext(t.Context(), `SELECT count(*) FROM effects`).Scan(&n)
	if n != 1 {
		t.Fatalf("effects: got %d, want 1", n)
	}
	_, err = g.Do(t.Context(), idem.Key{Scope: "t", ID: "sql-commit"}, "fp", func(ctx context.Context, tx *sql.Tx) ([]byte, error) {
		return nil, tx.Commit()
	})
	if !errors.Is(err, pggate.ErrTxDone) {
		t.Fatalf("commit inside the function: got %v, want ErrTxDone", err)
	}
}

// noRelayer hides the memstore's optional methods.
type noRelayer struct{ idem.Store }

func TestNewNeedsARelayer(t *testing.T) {
	pool, _ := pgtest.Pool(t)
	ms, _ := memstore.New()
	e, _ := idem.New(noRelayer{ms})
	if _, err := pggate.New(e, pool); !errors.Is(err, pggate.ErrNoRelayer) {
		t.Fatalf("New on a store without Relayer: got %v, want ErrNoRelayer", err)
	}
	if _, err := pggate.New(e, nil); !errors.Is(err, idem.ErrInvalid) {
		t.Fatalf("New with a nil pool: got %v, want ErrInvalid", err)
	}
}

// TestBinaryFingerprint: fingerprints are any bytes (idemhttp's are a
// hash); the completion row keeps them exactly.
func TestBinaryFingerprint(t *testing.T) {
	v := newEnv(t)
	key := idem.Key{Scope: "t", ID: "bin"}
	fp := "\xc0\xe5\x00\xff"
	if _, err := v.gate.Do(t.Context(), key, fp, effect("bin", "x")); err != nil {
		t.Fatalf("Do with a binary fingerprint: %v", err)
	}
	v.store.Delete(t.Context(), key.Digest())
	if res, err := v.gate.Do(t.Context(), key, fp, effect("bin", "y")); err != nil || !res.Replayed || string(res.Value) != "x" {
		t.Fatalf("after the record was lost: got %+v, %v, want the replay of x", res, err)
	}
	v.store.Delete(t.Context(), key.Digest())
	if _, err := v.gate.Do(t.Context(), key, "\xc0\xe5\x00\xfe", effect("bin", "z")); !errors.Is(err, idem.ErrMismatch) {
		t.Fatalf("another binary fingerprint: got %v, want ErrMismatch", err)
	}
	if n := v.effects(t, "bin"); n != 1 {
		t.Fatalf("effects: got %d, want 1", n)
	}
}

// TestExpiredRowReplaced: a completion row past its retention that the
// janitor has not deleted yet does not make a new run of its key a
// replay: the new completion replaces it, in the same round trip as the
// commit.
func TestExpiredRowReplaced(t *testing.T) {
	pool, _ := pgtest.Pool(t)
	ms, _ := memstore.New()
	e, _ := idem.New(ms, idem.WithLease(time.Second), idem.WithRetention(time.Second)) // a lease the commit outlasts on a loaded machine
	g, _ := pggate.New(e, pool, pggate.WithRelayInterval(0), pggate.WithSweepInterval(0))
	defer g.Close()
	if err := g.Migrate(t.Context()); err != nil {
		t.Fatal(err)
	}
	key := idem.Key{Scope: "t", ID: "k"}
	runs := 0
	fn := func(context.Context, pgx.Tx) ([]byte, error) { runs++; return []byte("run " + strconv.Itoa(runs)), nil }
	if _, err := g.Do(t.Context(), key, "fp", fn); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(10 * time.Second)
	for { // until the row's retention ended, by the database's clock
		var expired bool
		if err := pool.QueryRow(t.Context(), `SELECT expires_at <= now() FROM idem_completions WHERE digest = $1`, key.Digest()).Scan(&expired); err != nil {
			t.Fatal(err)
		}
		if expired {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the row did not expire")
		}
		time.Sleep(10 * time.Millisecond)
	}
	for { // until the store forgot the record too
		res, err := g.Do(t.Context(), key, "fp", fn)
		if errors.Is(err, idem.ErrInProgress) || (err == nil && res.Replayed && time.Now().Before(deadline)) {
			time.Sleep(10 * time.Millisecond)
			continue
		}
		if err != nil || res.Replayed || string(res.Value) != "run 2" {
			t.Fatalf("after the retention: got %+v, %v; want run 2, not replayed", res, err)
		}
		break
	}
	var n int
	pool.QueryRow(t.Context(), `SELECT count(*) FROM idem_completions WHERE expires_at > now()`).Scan(&n)
	if n != 1 {
		t.Fatalf("live completion rows: got %d, want 1", n)
	}
}

// TestAbortedTransaction: a function that ignores the error of one of its
// statements leaves the transaction aborted; nothing commits, the key is
// released and the error does not claim the effect may have committed.
func TestAbortedTransaction(t *testing.T) {
	v := newEnv(t)
	key := idem.Key{Scope: "t", ID: "k"}
	_, err := v.gate.Do(t.Context(), key, "fp", func(ctx context.Context, tx pgx.Tx) ([]byte, error) {
		_, _ = tx.Exec(ctx, `INSERT INTO effects (key, fence) VALUES ('k', 1)`)
		_, _ = tx.Exec(ctx, `SELECT 1/0`) // error ignored
		return []byte("x"), nil
	})
	if err == nil || strings.Contains(err.Error(), "may have committed") {
		t.Fatalf("got %v, want an error that does not say the effect may have committed", err)
	}
	if n := v.effects(t, "k"); n != 0 {
		t.Fatalf("effects: got %d, want 0", n)
	}
	if res, err := v.gate.Do(t.Context(), key, "fp", effect("k", "ok")); err != nil || res.Replayed {
		t.Fatalf("retry: got %+v, %v, want a run (the key was released)", res, err)
	}
}

// TestObserverOutcomes checks that the Executor's Observer sees the gate's
// outcomes once each: executed for a committed operation, replayed for a
// key the store holds, and replayed again when only Postgres holds the
// completion (the insert conflicts) — not "abandoned", although the gate
// ends its attempts without a store call.
func TestObserverOutcomes(t *testing.T) {
	pool, _ := pgtest.Pool(t)
	ms, err := memstore.New()
	if err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	var seen []string
	e, err := idem.New(ms, idem.WithObserver(func(_ context.Context, o observe.Observation) {
		mu.Lock()
		defer mu.Unlock()
		seen = append(seen, o.Outcome.String())
	}))
	if err != nil {
		t.Fatal(err)
	}
	g, err := pggate.New(e, pool, pggate.WithRelayInterval(0))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { g.Close() })
	if err := g.Migrate(t.Context()); err != nil {
		t.Fatal(err)
	}
	key := idem.Key{Scope: "t", ID: "observed"}
	op := func(context.Context, pgx.Tx) ([]byte, error) { return []byte("v"), nil }
	for range 2 {
		if _, err := g.Do(t.Context(), key, "fp", op); err != nil {
			t.Fatal(err)
		}
	}
	if err := ms.Delete(t.Context(), key.Digest()); err != nil {
		t.Fatal(err)
	}
	if res, err := g.Do(t.Context(), key, "fp", op); err != nil || !res.Replayed {
		t.Fatalf("after the store lost the record: got %+v, %v, want a replay from Postgres", res, err)
	}
	mu.Lock()
	defer mu.Unlock()
	if want := []string{"executed", "replayed", "replayed"}; !slices.Equal(seen, want) {
		t.Errorf("got %v, want %v", seen, want)
	}
}

// TestQueryExecModes: the completion and the COMMIT go in one pipeline in
// whatever query mode the caller's pool uses (prepared statements by
// default; a simple-protocol query for poolers that cannot keep prepared
// statements); in each, a commit records once and a conflict rolls back.
func TestQueryExecModes(t *testing.T) {
	for _, mode := range []pgx.QueryExecMode{pgx.QueryExecModeCacheStatement, pgx.QueryExecModeCacheDescribe,
		pgx.QueryExecModeDescribeExec, pgx.QueryExecModeExec, pgx.QueryExecModeSimpleProtocol} {
		t.Run(mode.String(), func(t *testing.T) {
			url := pgtest.Schema(t)
			cfg, err := pgxpool.ParseConfig(url)
			if err != nil {
				t.Fatal(err)
			}
			cfg.ConnConfig.DefaultQueryExecMode = mode
			pool, err := pgxpool.NewWithConfig(t.Context(), cfg)
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(pool.Close)
			v := newEnvOn(t, pool, url)
			g, ms := v.gate, v.store
			key := idem.Key{Scope: "t", ID: "k"}
			for i, want := range []string{"first", "first"} {
				res, err := g.Do(t.Context(), key, "fp", effect("k", []string{"first", "second"}[i]))
				if err != nil || string(res.Value) != want || res.Replayed != (i == 1) {
					t.Fatalf("Do %d: got %+v, %v, want %s (replayed %v)", i, res, err, want, i == 1)
				}
				// The store forgets the record: the second Do runs, and its
				// insert conflicts with the committed completion.
				if err := ms.Delete(t.Context(), key.Digest()); err != nil {
					t.Fatal(err)
				}
			}
			if n := v.effects(t, "k"); n != 1 {
				t.Fatalf("effects: got %d, want 1", n)
			}
		})
	}
}
