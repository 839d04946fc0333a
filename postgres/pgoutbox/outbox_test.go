package pgoutbox_test

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/idemgo/idem"
	"github.com/idemgo/idem/memstore"
	"github.com/idemgo/idem/postgres/pggate"
	"github.com/idemgo/idem/postgres/pgoutbox"
	"github.com/idemgo/idem/postgres/pgtest"
	"github.com/idemgo/idem/storekit"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	_ "github.com/jackc/pgx/v5/stdlib"
)

// sent is one call of a recorder's Send.
type sent struct {
	key     string
	payload string
	headers map[string]string
	err     error
}

// recorder is a Sender that records every call; fail, if set, decides a
// call's error. It reports two calls in flight at once for one key.
type recorder struct {
	mu       sync.Mutex
	calls    []sent
	inflight map[string]bool
	overlaps int
	fail     func(key, payload string, n int) error // n: earlier calls with this payload
	hold     func(key, payload string)              // runs inside Send, before it returns
}

func newRecorder() *recorder { return &recorder{inflight: make(map[string]bool)} }

func (r *recorder) Send(ctx context.Context, key string, payload []byte, headers map[string]string) error {
	r.mu.Lock()
	if r.inflight[key] {
		r.overlaps++
	}
	r.inflight[key] = true
	n := 0
	for _, c := range r.calls {
		if c.payload == string(payload) {
			n++
		}
	}
	fail := r.fail
	r.mu.Unlock()
	var err error
	if fail != nil {
		err = fail(key, string(payload), n)
	}
	if r.hold != nil {
		r.hold(key, string(payload))
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	delete(r.inflight, key)
	r.calls = append(r.calls, sent{key: key, payload: string(payload), headers: headers, err: err})
	return err
}

// confirmed returns the payloads whose Send returned nil, in order.
func (r *recorder) confirmed() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	var out []string
	for _, c := range r.calls {
		if c.err == nil {
			out = append(out, c.payload)
		}
	}
	return out
}

func (r *recorder) snapshot() []sent {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]sent(nil), r.calls...)
}

// newPool returns a pool on a new schema with the outbox table.
func newPool(t *testing.T) (*pgxpool.Pool, string) {
	t.Helper()
	pool, url := pgtest.Pool(t)
	if err := pgoutbox.Migrate(t.Context(), pool); err != nil {
		t.Fatalf("Migrate: %v", err)
	}
	return pool, url
}

// publish writes one message in a transaction of its own.
func publish(t testing.TB, pool *pgxpool.Pool, dest, key, payload string, headers map[string]string) {
	t.Helper()
	err := pgx.BeginFunc(context.Background(), pool, func(tx pgx.Tx) error {
		return pgoutbox.Publish(context.Background(), tx, dest, key, []byte(payload), headers)
	})
	if err != nil {
		t.Fatal(err)
	}
}

func newRelay(t testing.TB, pool *pgxpool.Pool, routes map[string]pgoutbox.Sender, opts ...pgoutbox.Option) *pgoutbox.Relay {
	t.Helper()
	r, err := pgoutbox.New(pool, routes, opts...)
	if err != nil {
		t.Fatal(err)
	}
	return r
}

// unsent returns the number of unsent rows.
func unsent(t testing.TB, pool *pgxpool.Pool) int {
	t.Helper()
	var n int
	if err := pool.QueryRow(context.Background(), `SELECT count(*) FROM idem_outbox WHERE sent_at IS NULL`).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

func TestPublishCommitsWithTheTransaction(t *testing.T) {
	pool, _ := newPool(t)
	ctx := t.Context()
	err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		if err := pgoutbox.Publish(ctx, tx, "orders", "k1", []byte("one"), map[string]string{"traceparent": "00-1", "type": "created"}); err != nil {
			return err
		}
		return pgoutbox.Publish(ctx, tx, "orders", "k2", []byte("two"), nil)
	})
	if err != nil {
		t.Fatal(err)
	}
	tx, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := pgoutbox.Publish(ctx, tx, "orders", "k3", []byte("rolled back"), nil); err != nil {
		t.Fatal(err)
	}
	tx.Rollback(ctx)

	rec := newRecorder()
	r := newRelay(t, pool, map[string]pgoutbox.Sender{"orders": rec})
	n, err := r.Send(ctx)
	if err != nil || n != 2 {
		t.Fatalf("Send: got %d, %v, want 2, nil", n, err)
	}
	calls := rec.snapshot() // two keys: sent at the same time, in any order
	slices.SortFunc(calls, func(a, b sent) int { return strings.Compare(a.key, b.key) })
	if len(calls) != 2 || calls[0].key != "k1" || calls[0].payload != "one" || calls[1].key != "k2" || calls[1].payload != "two" {
		t.Fatalf("sent: got %+v, want k1/one then k2/two", calls)
	}
	if h := calls[0].headers; len(h) != 2 || h["traceparent"] != "00-1" || h["type"] != "created" {
		t.Fatalf("headers of k1: got %v, want traceparent and type", h)
	}
	if len(calls[1].headers) != 0 {
		t.Fatalf("headers of k2: got %v, want none", calls[1].headers)
	}
	if u := unsent(t, pool); u != 0 {
		t.Fatalf("unsent rows after Send: got %d, want 0", u)
	}
	if n, err := r.Send(ctx); err != nil || n != 0 {
		t.Fatalf("second Send: got %d, %v, want 0, nil (sent rows are marked)", n, err)
	}
}

func TestPublishSQL(t *testing.T) {
	pool, url := newPool(t)
	db, err := sql.Open("pgx", url)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	tx, err := db.BeginTx(t.Context(), nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := pgoutbox.PublishSQL(t.Context(), tx, "orders", "k", []byte("sql"), map[string]string{"a": "b"}); err != nil {
		t.Fatal(err)
	}
	if err := tx.Commit(); err != nil {
		t.Fatal(err)
	}
	rec := newRecorder()
	if n, err := newRelay(t, pool, map[string]pgoutbox.Sender{"orders": rec}).Send(t.Context()); err != nil || n != 1 {
		t.Fatalf("Send: got %d, %v, want 1, nil", n, err)
	}
	if c := rec.snapshot(); c[0].key != "k" || c[0].payload != "sql" || c[0].headers["a"] != "b" {
		t.Fatalf("sent: got %+v", c)
	}
}

func TestPublishInvalid(t *testing.T) {
	pool, _ := newPool(t)
	long := strings.Repeat("k", storekit.MaxKeyLen+1)
	tests := []struct {
		name, dest, key string
		headers         map[string]string
	}{
		{"empty destination", "", "k", nil},
		{"long destination", strings.Repeat("d", pgoutbox.MaxDestinationLen+1), "k", nil},
		{"control in destination", "a\nb", "k", nil},
		{"empty key", "d", "", nil},
		{"long key", "d", long, nil},
		{"control in key", "d", "k\r\n", nil},
		{"key not UTF-8", "d", "k\xff", nil},
		{"empty header name", "d", "k", map[string]string{"": "v"}},
		{"control in header value", "d", "k", map[string]string{"h": "a\nb"}},
		{"reserved Idempotency-Key", "d", "k", map[string]string{"idempotency-key": "other"}},
		{"reserved Nats-Msg-Id", "d", "k", map[string]string{"Nats-Msg-Id": "x"}},
		{"reserved key", "d", "k", map[string]string{"KEY": "x"}},
		{"reserved payload", "d", "k", map[string]string{"payload": "x"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := pgx.BeginFunc(t.Context(), pool, func(tx pgx.Tx) error {
				return pgoutbox.Publish(t.Context(), tx, tt.dest, tt.key, []byte("p"), tt.headers)
			})
			if !errors.Is(err, idem.ErrInvalid) {
				t.Fatalf("got %v, want idem.ErrInvalid", err)
			}
		})
	}
	var n int
	pool.QueryRow(t.Context(), `SELECT count(*) FROM idem_outbox`).Scan(&n)
	if n != 0 {
		t.Fatalf("rows: got %d, want 0", n)
	}
}

func TestNoTable(t *testing.T) {
	pool, _ := pgtest.Pool(t)
	err := pgx.BeginFunc(t.Context(), pool, func(tx pgx.Tx) error {
		return pgoutbox.Publish(t.Context(), tx, "d", "k", nil, nil)
	})
	if !errors.Is(err, pgoutbox.ErrNoTable) {
		t.Fatalf("Publish: got %v, want ErrNoTable", err)
	}
	r := newRelay(t, pool, map[string]pgoutbox.Sender{"d": newRecorder()})
	if _, err := r.Send(t.Context()); !errors.Is(err, pgoutbox.ErrNoTable) {
		t.Fatalf("Send: got %v, want ErrNoTable", err)
	}
	if _, err := r.Sweep(t.Context()); !errors.Is(err, pgoutbox.ErrNoTable) {
		t.Fatalf("Sweep: got %v, want ErrNoTable", err)
	}
	// Migrate twice, from two goroutines: both succeed.
	var wg sync.WaitGroup
	errs := make([]error, 2)
	for i := range errs {
		wg.Go(func() { errs[i] = pgoutbox.Migrate(t.Context(), pool) })
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		t.Fatalf("Migrate: %v", err)
	}
}

func TestNewValidates(t *testing.T) {
	pool, _ := pgtest.Pool(t)
	rec := newRecorder()
	tests := []struct {
		name   string
		pool   *pgxpool.Pool
		routes map[string]pgoutbox.Sender
		opts   []pgoutbox.Option
	}{
		{"nil pool", nil, map[string]pgoutbox.Sender{"d": rec}, nil},
		{"no route", pool, nil, nil},
		{"empty name", pool, map[string]pgoutbox.Sender{"": rec}, nil},
		{"nil sender", pool, map[string]pgoutbox.Sender{"d": nil}, nil},
		{"zero interval", pool, map[string]pgoutbox.Sender{"d": rec}, []pgoutbox.Option{pgoutbox.WithInterval(0)}},
		{"backoff max below min", pool, map[string]pgoutbox.Sender{"d": rec}, []pgoutbox.Option{pgoutbox.WithBackoff(time.Second, time.Millisecond)}},
		{"zero batch", pool, map[string]pgoutbox.Sender{"d": rec}, []pgoutbox.Option{pgoutbox.WithBatchSize(0)}},
		{"zero concurrency", pool, map[string]pgoutbox.Sender{"d": rec}, []pgoutbox.Option{pgoutbox.WithConcurrency(0)}},
		{"nil logger", pool, map[string]pgoutbox.Sender{"d": rec}, []pgoutbox.Option{pgoutbox.WithLogger(nil)}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if _, err := pgoutbox.New(tt.pool, tt.routes, tt.opts...); !errors.Is(err, idem.ErrInvalid) {
				t.Fatalf("got %v, want idem.ErrInvalid", err)
			}
		})
	}
}

// TestPublishThroughGate: a message published in a gated operation's
// transaction is written once per key, whatever the store says: a replay
// does not run the function, a retry after the record was lost rolls its
// row back with its effect, and a failed function writes nothing.
func TestPublishThroughGate(t *testing.T) {
	pool, _ := newPool(t)
	ctx := t.Context()
	ms, err := memstore.New()
	if err != nil {
		t.Fatal(err)
	}
	e, err := idem.New(ms)
	if err != nil {
		t.Fatal(err)
	}
	g, err := pggate.New(e, pool, pggate.WithRelayInterval(0))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { g.Close() })
	if err := g.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	runs := 0
	order := func(fail bool) func(ctx context.Context, tx pgx.Tx) ([]byte, error) {
		return func(ctx context.Context, tx pgx.Tx) ([]byte, error) {
			runs++
			if err := pgoutbox.Publish(ctx, tx, "orders", fmt.Sprintf("order-42:paid:%d", runs), []byte("paid"), nil); err != nil {
				return nil, err
			}
			if fail {
				return nil, errors.New("card declined")
			}
			return []byte("ok"), nil
		}
	}
	key := idem.Key{Scope: "checkout", ID: "order-42"}
	if _, err := g.Do(ctx, key, "fp", order(true)); err == nil {
		t.Fatal("failing function: got nil error")
	}
	if _, err := g.Do(ctx, key, "fp", order(false)); err != nil {
		t.Fatal(err)
	}
	if res, err := g.Do(ctx, key, "fp", order(false)); err != nil || !res.Replayed {
		t.Fatalf("duplicate: got %+v, %v, want a replay", res, err)
	}
	if err := ms.Delete(ctx, key.Digest()); err != nil { // the store loses the record
		t.Fatal(err)
	}
	if res, err := g.Do(ctx, key, "fp", order(false)); err != nil || !res.Replayed {
		t.Fatalf("retry after the record was lost: got %+v, %v, want a replay", res, err)
	}
	var keys []string
	rows, err := pool.Query(ctx, `SELECT key FROM idem_outbox ORDER BY id`)
	if err != nil {
		t.Fatal(err)
	}
	keys, err = pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		t.Fatal(err)
	}
	if runs != 3 || len(keys) != 1 || keys[0] != "order-42:paid:2" {
		t.Fatalf("got %d runs and outbox rows %v, want 3 runs and the one row of the committed run, order-42:paid:2", runs, keys)
	}
}
