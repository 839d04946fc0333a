package pggate_test

import (
	"context"
	"errors"
	"os"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idemgo/idem"
	"github.com/idemgo/idem/memstore"
	"github.com/idemgo/idem/postgres/pggate"
	"github.com/idemgo/idem/postgres/pgtest"
	"github.com/idemgo/idem/storekit"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// ok is an operation that writes nothing and returns "ok".
func ok(context.Context, pgx.Tx) ([]byte, error) { return []byte("ok"), nil }

// TestRelayCursor: the relay walks the rows in the order they were
// written, rows with nothing to relay (the store got them in the
// transaction, a foreign handler's) move its cursor too, and a pass
// copies each completion once.
func TestRelayCursor(t *testing.T) {
	v := newEnv(t, pggate.WithRelayDelay(0), pggate.WithBatchSize(2))
	for i, id := range []string{"a", "b", "c"} {
		if _, err := v.gate.Do(t.Context(), idem.Key{Scope: "t", ID: id}, "", ok); err != nil {
			t.Fatal(err)
		}
		// A row the relay must pass over between two of the gate's.
		if _, err := v.pool.Exec(t.Context(), pggate.ForeignInsert, "foreign"+id, int64(i+1), []byte("x"), 60); err != nil {
			t.Fatal(err)
		}
	}
	// Another process's relay: it did not copy the completions itself.
	other := otherGate(t, v, pggate.WithRelayDelay(0), pggate.WithBatchSize(2))
	if n, err := other.Relay(t.Context()); err != nil || n != 3 {
		t.Fatalf("Relay: got %d, %v, want the 3 completions (in batches of 2 rows of 6)", n, err)
	}
	if n, err := other.Relay(t.Context()); err != nil || n != 0 {
		t.Fatalf("second Relay: got %d, %v, want 0", n, err)
	}
	if _, err := v.store.Get(t.Context(), "foreigna"); !errors.Is(err, storekit.ErrNotFound) {
		t.Fatalf("the foreign row reached the store: %v", err)
	}
}

// otherGate is a second gate on v's Executor, as in another process.
func otherGate(t *testing.T, v *env, opts ...pggate.Option) *pggate.Gate[pgx.Tx] {
	t.Helper()
	g, err := pggate.New(v.exec, v.pool, append([]pggate.Option{pggate.WithRelayInterval(0)}, opts...)...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { g.Close() })
	return g
}

// counting counts the store's RelayCompletion calls.
type counting struct {
	idem.Store
	r storekit.Relayer
	n atomic.Int64
}

func (c *counting) RelayCompletion(ctx context.Context, key string, x storekit.Completion) error {
	c.n.Add(1)
	return c.r.RelayCompletion(ctx, key, x)
}

// TestRelaySkipsOwnCopies: a gate's relay does not copy again the
// completions the gate wrote into the store right after their commit;
// another process's relay does (it cannot know).
func TestRelaySkipsOwnCopies(t *testing.T) {
	pool, _ := pgtest.Pool(t)
	ms, _ := memstore.New()
	c := &counting{Store: ms, r: ms}
	g, e := manualRelayGate(t, pool, c)
	for _, id := range []string{"a", "b", "c"} {
		if _, err := g.Do(t.Context(), idem.Key{Scope: "t", ID: id}, "", ok); err != nil {
			t.Fatal(err)
		}
	}
	if n, err := g.Relay(t.Context()); err != nil || n != 0 || c.n.Load() != 3 {
		t.Fatalf("the gate's relay: got %d, %v, %d store calls, want 0 copies and the gate's 3 calls", n, err, c.n.Load())
	}
	if _, err := pool.Exec(t.Context(), `UPDATE idem_completions_relay SET created_at = now() - interval '1 hour', digest = ''`); err != nil {
		t.Fatal(err)
	}
	other, _ := pggate.New(e, pool, pggate.WithRelayInterval(0), pggate.WithRelayDelay(0))
	defer other.Close()
	if n, err := other.Relay(t.Context()); err != nil || n != 3 || c.n.Load() != 6 {
		t.Fatalf("another gate's relay: got %d, %v, %d store calls, want 3 copies", n, err, c.n.Load())
	}
}

// TestRelayLateCommit: a transaction that began before rows that the relay
// has passed, and commits after that pass, is relayed by the next: the
// gate writes created_at with its insert, right before the COMMIT, not at
// the start of the transaction.
func TestRelayLateCommit(t *testing.T) {
	pool, _ := pgtest.Pool(t)
	ms, _ := memstore.New()
	f := &flaky{Store: ms, r: ms}
	g, _ := manualRelayGate(t, pool, f)
	slow, quick := idem.Key{Scope: "t", ID: "slow"}, idem.Key{Scope: "t", ID: "quick"}
	inTx, release := make(chan struct{}), make(chan struct{})
	done := make(chan error, 1)
	go func() {
		_, err := g.Do(context.Background(), slow, "", func(ctx context.Context, tx pgx.Tx) ([]byte, error) {
			if _, err := tx.Exec(ctx, `SELECT 1`); err != nil { // the transaction has begun
				return nil, err
			}
			close(inTx)
			<-release
			return []byte("slow"), nil
		})
		done <- err
	}()
	<-inTx
	f.broken.Store(true) // neither completion reaches the store after its commit
	if _, err := g.Do(t.Context(), quick, "", ok); err != nil {
		t.Fatal(err)
	}
	f.broken.Store(false)
	if n, err := g.Relay(t.Context()); err != nil || n != 1 {
		t.Fatalf("Relay: got %d, %v, want the quick completion", n, err)
	}
	f.broken.Store(true)
	close(release)
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	f.broken.Store(false)
	if n, err := g.Relay(t.Context()); err != nil || n != 1 {
		t.Fatalf("Relay after the slow commit: got %d, %v, want the slow completion", n, err)
	}
	if rec, err := ms.Get(t.Context(), slow.Digest()); err != nil || rec.State != storekit.StateCompleted {
		t.Fatalf("the slow record: %v, %v, want COMPLETED", rec.State, err)
	}
}

// TestRelaySkipsInvalid: a completion the store refuses as invalid (here a
// fence of 0, written by hand) would never be taken: the relay reports it
// and passes on; a completion it cannot copy for now stops the pass there.
func TestRelaySkipsInvalid(t *testing.T) {
	v := newEnv(t, pggate.WithRelayDelay(0))
	if _, err := v.pool.Exec(t.Context(), `INSERT INTO idem_completions (digest, fingerprint, fence, result, created_at, expires_at)
VALUES ('bad', '', 0, 'x', clock_timestamp(), now() + interval '1 hour')`); err != nil {
		t.Fatal(err)
	}
	key := idem.Key{Scope: "t", ID: "after"}
	if _, err := v.gate.Do(t.Context(), key, "", ok); err != nil {
		t.Fatal(err)
	}
	other := otherGate(t, v, pggate.WithRelayDelay(0))
	n, err := other.Relay(t.Context())
	if n != 1 || !errors.Is(err, idem.ErrInvalid) || !strings.Contains(err.Error(), "bad") {
		t.Fatalf("Relay: got %d, %v, want the completion after the invalid row and an error naming it", n, err)
	}
	if n, err := other.Relay(t.Context()); n != 0 || err != nil {
		t.Fatalf("second Relay: got %d, %v, want nothing (the cursor passed the invalid row)", n, err)
	}
}

// TestMigrateFromVersion2: a table made by schema version 2 (the relay
// found the rows not marked relayed through a partial index) is migrated
// by Migrate: the index goes, the cursor starts before its oldest row
// not marked relayed, so the relay copies those and no other; new rows
// are written once and relayed.
func TestMigrateFromVersion2(t *testing.T) {
	pool, _ := pgtest.Pool(t)
	v2, err := os.ReadFile("testdata/schema_v2.sql")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := pool.Exec(t.Context(), string(v2)); err != nil {
		t.Fatal(err)
	}
	// As a version 2 gate left them: one completion relayed, one not (its
	// process died after the commit), the relayed one older.
	for _, r := range []struct {
		digest  string
		relayed bool
		age     string
	}{{"marked", true, "2 minutes"}, {"unmarked", false, "1 minute"}} {
		if _, err := pool.Exec(t.Context(), `INSERT INTO idem_completions (digest, fingerprint, fence, result, created_at, expires_at, relayed)
VALUES ($1, '', 1, 'x', now() - $2::interval, now() + interval '1 hour', $3)`, r.digest, r.age, r.relayed); err != nil {
			t.Fatal(err)
		}
	}
	ms, _ := memstore.New()
	e, _ := idem.New(ms, idem.WithLease(time.Minute))
	g, err := pggate.New(e, pool, pggate.WithRelayInterval(0))
	if err != nil {
		t.Fatal(err)
	}
	defer g.Close()
	for range 2 { // at every start
		if err := g.Migrate(t.Context()); err != nil {
			t.Fatalf("Migrate: %v", err)
		}
	}
	var indexes []string
	if err := pool.QueryRow(t.Context(), `SELECT array_agg(indexname::text ORDER BY indexname) FROM pg_indexes WHERE tablename = 'idem_completions' AND schemaname = current_schema()`).Scan(&indexes); err != nil {
		t.Fatal(err)
	}
	if want := "idem_completions_created_at idem_completions_pkey idem_completions_unfinished"; strings.Join(indexes, " ") != want {
		t.Fatalf("indexes after Migrate: %v, want %s", indexes, want)
	}
	if n, err := g.Relay(t.Context()); err != nil || n != 1 {
		t.Fatalf("Relay: got %d, %v, want the one row not marked relayed", n, err)
	}
	if _, err := ms.Get(t.Context(), "unmarked"); err != nil {
		t.Fatalf("the unmarked completion: %v, want it in the store", err)
	}
	if _, err := ms.Get(t.Context(), "marked"); !errors.Is(err, storekit.ErrNotFound) {
		t.Fatalf("the marked completion: %v, want it left alone", err)
	}
	key := idem.Key{Scope: "t", ID: "new"}
	if _, err := g.Do(t.Context(), key, "", ok); err != nil {
		t.Fatal(err)
	}
	var x0 string
	pool.QueryRow(t.Context(), `SELECT xmin::text FROM idem_completions WHERE digest = $1`, key.Digest()).Scan(&x0)
	g2, _ := pggate.New(e, pool, pggate.WithRelayInterval(0), pggate.WithRelayDelay(0))
	defer g2.Close()
	if n, err := g2.Relay(t.Context()); err != nil || n != 1 {
		t.Fatalf("Relay of the new row: got %d, %v, want 1", n, err)
	}
	var x1 string
	pool.QueryRow(t.Context(), `SELECT xmin::text FROM idem_completions WHERE digest = $1`, key.Digest()).Scan(&x1)
	if x0 != x1 {
		t.Fatalf("the new row was written again (xmin %s, then %s)", x0, x1)
	}
	// A version 2 gate still running beside the new ones: its mark and its
	// relay's query work on the migrated table.
	if _, err := pool.Exec(t.Context(), `UPDATE idem_completions SET relayed = true WHERE digest = ANY($1) AND NOT relayed`, []string{"unmarked"}); err != nil {
		t.Fatalf("a version 2 mark: %v", err)
	}
	rows, err := pool.Query(t.Context(), `SELECT digest FROM idem_completions
WHERE NOT relayed AND created_at < now() - $1 * interval '1 microsecond' AND expires_at > now()
ORDER BY created_at LIMIT $2 FOR UPDATE SKIP LOCKED`, 0, 10)
	if err != nil {
		t.Fatalf("a version 2 relay: %v", err)
	}
	rows.Close()
}

// manualRelayGate is a migrated gate on pool over store, with a one-minute
// lease, whose relay runs only when the test calls Relay (no interval, no
// delay); it is closed when the test ends.
func manualRelayGate(t *testing.T, pool *pgxpool.Pool, store idem.Store) (*pggate.Gate[pgx.Tx], *idem.Executor) {
	t.Helper()
	e, _ := idem.New(store, idem.WithLease(time.Minute))
	g, err := pggate.New(e, pool, pggate.WithRelayInterval(0), pggate.WithRelayDelay(0))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { g.Close() })
	if err := g.Migrate(t.Context()); err != nil {
		t.Fatal(err)
	}
	return g, e
}

// TestMigrateFromVersion3: Migrate drops version 3's index on expires_at
// (the janitor goes through the index on created_at) and keeps the rows;
// Sweep then deletes the expired one.
func TestMigrateFromVersion3(t *testing.T) {
	pool, _ := pgtest.Pool(t)
	v3, err := os.ReadFile("testdata/schema_v3.sql")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := pool.Exec(t.Context(), string(v3)); err != nil {
		t.Fatal(err)
	}
	if _, err := pool.Exec(t.Context(), `INSERT INTO idem_completions (digest, fingerprint, fence, result, created_at, expires_at)
VALUES ('expired', '', 1, 'x', now() - interval '2 hours', now() - interval '1 hour'), ('live', '', 1, 'x', now() - interval '1 hour', now() + interval '1 hour')`); err != nil {
		t.Fatal(err)
	}
	ms, _ := memstore.New()
	g, _ := manualRelayGate(t, pool, ms)
	if err := g.Migrate(t.Context()); err != nil { // at every start
		t.Fatal(err)
	}
	var indexes []string
	if err := pool.QueryRow(t.Context(), `SELECT array_agg(indexname::text ORDER BY indexname) FROM pg_indexes WHERE tablename = 'idem_completions' AND schemaname = current_schema()`).Scan(&indexes); err != nil {
		t.Fatal(err)
	}
	if want := "idem_completions_created_at idem_completions_pkey idem_completions_unfinished"; strings.Join(indexes, " ") != want {
		t.Fatalf("indexes after Migrate: %v, want %s", indexes, want)
	}
	if n, err := g.Sweep(t.Context()); n != 1 || err != nil {
		t.Fatalf("Sweep: got %d, %v, want the expired row", n, err)
	}
	var left []string
	pool.QueryRow(t.Context(), `SELECT array_agg(digest ORDER BY digest) FROM idem_completions`).Scan(&left)
	if strings.Join(left, " ") != "live" {
		t.Fatalf("rows left: %v, want live", left)
	}
}

// TestSweepOrder: the janitor deletes the expired rows written before the
// oldest live row, in batches, and never a live row; an expired row
// written after a live one of a longer retention stays until that one
// expires.
func TestSweepOrder(t *testing.T) {
	pool, _ := pgtest.Pool(t)
	ms, _ := memstore.New()
	e, _ := idem.New(ms, idem.WithLease(time.Minute))
	g, err := pggate.New(e, pool, pggate.WithRelayInterval(0), pggate.WithSweepInterval(0), pggate.WithBatchSize(2))
	if err != nil {
		t.Fatal(err)
	}
	defer g.Close()
	if err := g.Migrate(t.Context()); err != nil {
		t.Fatal(err)
	}
	// Written a minute apart, oldest first; "long" still live.
	rows := []struct {
		digest string
		left   string // of its retention, negative: expired
	}{{"e1", "-5 minutes"}, {"e2", "-4 minutes"}, {"e3", "-3 minutes"}, {"long", "1 hour"}, {"e4", "-1 minute"}, {"short", "1 minute"}}
	for i, r := range rows {
		if _, err := pool.Exec(t.Context(), `INSERT INTO idem_completions (digest, fingerprint, fence, result, created_at, expires_at)
VALUES ($1, '', 1, 'x', now() - interval '10 minutes' + $2 * interval '1 minute', now() + $3::interval)`, r.digest, i, r.left); err != nil {
			t.Fatal(err)
		}
	}
	left := func() string {
		var d []string
		pool.QueryRow(t.Context(), `SELECT array_agg(digest ORDER BY created_at) FROM idem_completions`).Scan(&d)
		return strings.Join(d, " ")
	}
	if n, err := g.Sweep(t.Context()); n != 3 || err != nil {
		t.Fatalf("Sweep: got %d, %v, want the 3 expired rows before the live one", n, err)
	}
	if got, want := left(), "long e4 short"; got != want {
		t.Fatalf("rows left: %s, want %s", got, want)
	}
	// The long row expires: e4 goes with it; the live row stays.
	if _, err := pool.Exec(t.Context(), `UPDATE idem_completions SET expires_at = now() - interval '1 second' WHERE digest = 'long'`); err != nil {
		t.Fatal(err)
	}
	if n, err := g.Sweep(t.Context()); n != 2 || err != nil {
		t.Fatalf("second Sweep: got %d, %v, want 2", n, err)
	}
	if got, want := left(), "short"; got != want {
		t.Fatalf("rows left: %s, want %s", got, want)
	}
	// No live row: every expired row goes.
	if _, err := pool.Exec(t.Context(), `UPDATE idem_completions SET expires_at = now() - interval '1 second'`); err != nil {
		t.Fatal(err)
	}
	if n, err := g.Sweep(t.Context()); n != 1 || err != nil {
		t.Fatalf("third Sweep: got %d, %v, want 1", n, err)
	}
}
