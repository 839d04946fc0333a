package pggate_test

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/idemgo/idem"
	"github.com/idemgo/idem/consumer"
	"github.com/idemgo/idem/consumer/redisstream"
	"github.com/idemgo/idem/postgres/pggate"
	"github.com/idemgo/idem/postgres/pgstore"
	"github.com/idemgo/idem/postgres/pgtest"
	"github.com/idemgo/idem/redisstore"
	"github.com/idemgo/idem/testkit/redistest"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/redis/go-redis/v9"
)

// redisEnv is a gate on redisstore (a throwaway redis-server) and a fresh
// schema with an effects table that has no unique key.
type redisEnv struct {
	srv  *redistest.Server
	rdb  *redis.Client
	rs   *redisstore.Store
	pool *pgxpool.Pool
	gate *pggate.Gate[pgx.Tx]
}

func newRedisEnv(t *testing.T, lease time.Duration) *redisEnv {
	t.Helper()
	srv := redistest.Start(t)
	rdb := srv.GoRedis(t)
	rs, err := redisstore.New(rdb)
	if err != nil {
		t.Fatal(err)
	}
	e, err := idem.New(rs, idem.WithLease(lease))
	if err != nil {
		t.Fatal(err)
	}
	pool, _ := pgtest.Pool(t)
	g, err := pggate.New(e, pool, pggate.WithRelayInterval(0))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { g.Close() })
	if err := g.Migrate(t.Context()); err != nil {
		t.Fatal(err)
	}
	if _, err := pool.Exec(t.Context(), `CREATE TABLE effects (key text NOT NULL)`); err != nil {
		t.Fatal(err)
	}
	return &redisEnv{srv: srv, rdb: rdb, rs: rs, pool: pool, gate: g}
}

// counts returns the effect rows and the keys with more than one.
func (v *redisEnv) counts(t *testing.T) (rows, duplicated int) {
	t.Helper()
	err := v.pool.QueryRow(t.Context(), `SELECT count(*), count(*) FILTER (WHERE n > 1)
FROM (SELECT key, count(*) AS n FROM effects GROUP BY key) k`).Scan(&rows, &duplicated)
	if err != nil {
		t.Fatal(err)
	}
	// rows counts keys here; add the extra rows of duplicated keys.
	var extra int
	if err := v.pool.QueryRow(t.Context(), `SELECT count(*) FROM effects`).Scan(&extra); err != nil {
		t.Fatal(err)
	}
	return extra, duplicated
}

// handler returns a consumer handler whose effect is one row in effects:
// through the gate, or (the negative control) committed on its own.
func (v *redisEnv) handler(gated bool) func(ctx context.Context, key string) error {
	if gated {
		return func(ctx context.Context, key string) error {
			return v.gate.Handle(ctx, func(ctx context.Context, tx pgx.Tx) error {
				_, err := tx.Exec(ctx, `INSERT INTO effects (key) VALUES ($1)`, key)
				return err
			})
		}
	}
	return func(ctx context.Context, key string) error {
		_, err := v.pool.Exec(ctx, `INSERT INTO effects (key) VALUES ($1)`, key)
		return err
	}
}

// TestHandleProcessorCrashWindow: a consumer.Processor whose handlers
// commit their effect, then the process "crashes" before the completion
// (Batch.Abandon: the records stay IN_PROGRESS, the messages are not
// acknowledged). The messages come back, three copies each in every batch,
// after the lease; half the keys also lose their Redis record (DEL, as in
// a failover) so they are redelivered at once. Through the gate every key
// has 1 effect row although its handler ran twice; the negative control
// (the effect committed outside the gate) shows a duplicate for every key.
func TestHandleProcessorCrashWindow(t *testing.T) {
	const keys = 40
	for _, gated := range []bool{true, false} {
		t.Run(map[bool]string{true: "gate", false: "control"}[gated], func(t *testing.T) {
			v := newRedisEnv(t, 300*time.Millisecond)
			e := v.gate.Executor()
			p, err := consumer.New(e, consumer.WithScope("pay"), consumer.WithRetryDelay(10*time.Millisecond))
			if err != nil {
				t.Fatal(err)
			}
			var msgs []consumer.Message
			for i := range keys {
				msgs = append(msgs, consumer.Message{Key: "k" + strconv.Itoa(i), Fingerprint: "fp"})
			}
			var mu sync.Mutex
			runs := map[string]int{}
			h := v.handler(gated)
			handle := func(batch []consumer.Message) consumer.Handler {
				return func(ctx context.Context, i int) error {
					mu.Lock()
					runs[batch[i].Key]++
					mu.Unlock()
					return h(ctx, batch[i].Key)
				}
			}
			// The crash window: effects committed, completions never sent.
			// A key whose lease ended before its handler started (a
			// loaded machine runs the 40 transactions one after another
			// for longer than the lease) was not in the window: it is
			// acquired again, until every key's handler ran once.
			crashed := map[string]bool{}
			for round := 0; len(crashed) < keys; round++ {
				if round == 50 {
					t.Fatalf("after %d rounds, %d of %d keys ran in the crash window", round, len(crashed), keys)
				}
				var left []consumer.Message
				for _, m := range msgs {
					if !crashed[m.Key] {
						left = append(left, m)
					}
				}
				b := p.Acquire(t.Context(), left)
				inner := handle(left)
				b.Handle(func(ctx context.Context, i int) error {
					crashed[left[i].Key] = true // one at a time: no parallel handlers
					return inner(ctx, i)
				})
				b.Abandon()
			}
			for i := range keys / 2 {
				if err := v.rdb.Del(t.Context(), v.rs.Key(p.Key(msgs[i].Key).Digest())).Err(); err != nil {
					t.Fatal(err)
				}
			}
			// Redeliveries, with duplicates, until every message is acked.
			var dup []consumer.Message
			for _, m := range msgs {
				dup = append(dup, m, m, m)
			}
			acked := map[string]bool{}
			deadline := time.Now().Add(20 * time.Second)
			for len(acked) < keys {
				if time.Now().After(deadline) {
					t.Fatalf("only %d of %d keys acknowledged", len(acked), keys)
				}
				var left []consumer.Message
				for _, m := range dup {
					if !acked[m.Key] {
						left = append(left, m)
					}
				}
				delay := time.Duration(0)
				for i, r := range p.Process(t.Context(), left, handle(left)) {
					switch r.Action {
					case consumer.Ack:
						acked[left[i].Key] = true
					case consumer.Retry:
						delay = max(delay, r.Delay)
					default:
						t.Fatalf("message %s: %v %v", left[i].Key, r.Action, r.Err)
					}
				}
				time.Sleep(delay) // the redelivery delay the Processor asked for
			}
			rows, duplicated := v.counts(t)
			for k, n := range runs {
				if n < 2 {
					t.Fatalf("key %s: the handler ran %d times, want 2 (the redelivery must run it)", k, n)
				}
			}
			t.Logf("gated=%v: %d keys, handler runs %d, effect rows %d, duplicated keys %d", gated, keys, sum(runs), rows, duplicated)
			if gated && (rows != keys || duplicated != 0) {
				t.Fatalf("through the gate: %d effect rows, %d keys duplicated; want %d rows, none duplicated", rows, duplicated, keys)
			}
			if !gated && duplicated != keys {
				t.Fatalf("negative control: %d of %d keys duplicated; want all (the test must see duplicates)", duplicated, keys)
			}
			if gated {
				// Every record is COMPLETED in Redis: duplicates now get
				// the fast path, without the handler.
				before := sum(runs)
				for _, r := range p.Process(t.Context(), dup, handle(dup)) {
					if r.Action != consumer.Ack || !r.Replayed {
						t.Fatalf("late duplicate: got %+v, want a replayed ack", r)
					}
				}
				if sum(runs) != before {
					t.Fatal("a late duplicate ran the handler")
				}
				// The relay marks the rows (the store has them already).
				n, err := v.gate.Relay(t.Context())
				if err != nil {
					t.Fatal(err)
				}
				t.Logf("relayed %d rows", n)
			}
		})
	}
}

func sum(m map[string]int) int {
	n := 0
	for _, v := range m {
		n += v
	}
	return n
}

// TestHandleRedisStream runs gated handlers through the Redis Streams
// adapter: every key is added three times, and the first run of each key
// fails after its transaction committed (the completion never reaches
// Redis: the key is released and the entry redelivered, the window of a
// crash between the commit and the completion). Through the gate: 1 effect
// row per key and every entry acknowledged; the negative control (the
// effect committed outside the gate) has a duplicate for every key.
func TestHandleRedisStream(t *testing.T) {
	const keys = 30
	for _, gated := range []bool{true, false} {
		t.Run(map[bool]string{true: "gate", false: "control"}[gated], func(t *testing.T) {
			v := newRedisEnv(t, 2*time.Second)
			errWindow := errors.New("crash window: committed, completion lost")
			var mu sync.Mutex
			runs := map[string]int{}
			h := v.handler(gated)
			streamExec, err := idem.New(v.rs)
			if err != nil {
				t.Fatal(err)
			}
			c, err := redisstream.New(v.rdb, "payments", "g", "c1", streamExec,
				func(ctx context.Context, msg redis.XMessage) error {
					key := fmt.Sprint(msg.Values["key"])
					if err := h(ctx, key); err != nil {
						return err
					}
					mu.Lock()
					defer mu.Unlock()
					if runs[key]++; runs[key] == 1 {
						return errWindow
					}
					return nil
				},
				redisstream.WithKeyFunc(redisstream.KeyField("key")),
				consumer.WithRetryDelay(5*time.Millisecond), redisstream.WithClaimIdle(30*time.Millisecond),
				consumer.WithMaxDeliveries(0), redisstream.WithBlock(20*time.Millisecond))
			if err != nil {
				t.Fatal(err)
			}
			for range 3 {
				for i := range keys {
					if err := v.rdb.XAdd(t.Context(), &redis.XAddArgs{Stream: "payments", Values: []string{"key", "k" + strconv.Itoa(i)}}).Err(); err != nil {
						t.Fatal(err)
					}
				}
			}
			ctx, cancel := context.WithCancel(t.Context())
			done := make(chan error, 1)
			go func() { done <- c.Run(ctx) }()
			deadline := time.Now().Add(30 * time.Second)
			for {
				pending, err := v.rdb.XPending(t.Context(), "payments", "g").Result()
				if err != nil && !errors.Is(err, redis.Nil) && !redis.HasErrorPrefix(err, "NOGROUP") {
					t.Fatal(err) // NOGROUP: Run has not created the group yet
				}
				st := c.Stats()
				if st.Processed+st.Replayed >= 3*keys && (pending == nil || pending.Count == 0) {
					break
				}
				if time.Now().After(deadline) {
					t.Fatalf("not done: %+v", st)
				}
				time.Sleep(20 * time.Millisecond) // polling the adapter's counters
			}
			cancel()
			if err := <-done; err != nil {
				t.Fatal(err)
			}
			rows, duplicated := v.counts(t)
			t.Logf("gated=%v: %d keys × 3 entries, handler runs %d, effect rows %d, duplicated keys %d, stats %+v", gated, keys, sum(runs), rows, duplicated, c.Stats())
			if gated && (rows != keys || duplicated != 0) {
				t.Fatalf("through the gate: %d effect rows, %d keys duplicated; want %d rows, none duplicated", rows, duplicated, keys)
			}
			if !gated && duplicated != keys {
				t.Fatalf("negative control: %d of %d keys duplicated; want all", duplicated, keys)
			}
		})
	}
}

// TestHandleErrors: outside an attempt, an error of fn (rolled back), and
// a function that commits the transaction itself (ErrTxDone, terminal).
func TestHandleErrors(t *testing.T) {
	v := newRedisEnv(t, 5*time.Second)
	if err := v.gate.Handle(t.Context(), func(context.Context, pgx.Tx) error { return nil }); !errors.Is(err, pggate.ErrNoAttempt) {
		t.Fatalf("outside an attempt: got %v, want ErrNoAttempt", err)
	}
	p, err := consumer.New(v.gate.Executor(), consumer.WithMaxDeliveries(1))
	if err != nil {
		t.Fatal(err)
	}
	boom := errors.New("boom")
	rs := p.Process(t.Context(), []consumer.Message{{Key: "a"}, {Key: "b"}}, func(ctx context.Context, i int) error {
		return v.gate.Handle(ctx, func(ctx context.Context, tx pgx.Tx) error {
			if _, err := tx.Exec(ctx, `INSERT INTO effects (key) VALUES ('x')`); err != nil {
				return err
			}
			if i == 0 {
				return boom
			}
			return tx.Commit(ctx)
		})
	})
	if !errors.Is(rs[0].Err, boom) {
		t.Fatalf("fn's error: got %+v, want boom", rs[0])
	}
	if rs[1].Action != consumer.DeadLetter || !errors.Is(rs[1].Err, pggate.ErrTxDone) {
		t.Fatalf("fn committed itself: got %+v, want dead-lettered with ErrTxDone", rs[1])
	}
	var n int
	v.pool.QueryRow(t.Context(), `SELECT count(*) FROM effects`).Scan(&n)
	if n != 1 {
		t.Fatalf("effects: got %d, want 1 (the self-committed one only)", n)
	}
}

// TestHandleOnPgstore: on pgstore the gate completes the record inside the
// handler's transaction; the Processor's completion then repeats it (same
// lease, same result) and acknowledges. A crash after the handlers (the
// batch abandoned) leaves nothing to redo: the redelivery is a replay.
func TestHandleOnPgstore(t *testing.T) {
	pool, _ := pgtest.Pool(t)
	ps, err := pgstore.New(pool, pgstore.WithNotify(false))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ps.Close() })
	if err := ps.Migrate(t.Context()); err != nil {
		t.Fatal(err)
	}
	e, err := idem.New(ps)
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
	if _, err := pool.Exec(t.Context(), `CREATE TABLE effects (key text NOT NULL)`); err != nil {
		t.Fatal(err)
	}
	p, err := consumer.New(e, consumer.WithScope("pay"))
	if err != nil {
		t.Fatal(err)
	}
	msgs := []consumer.Message{{Key: "a", Fingerprint: "fp"}, {Key: "b", Fingerprint: "fp"}, {Key: "c", Fingerprint: "fp"}}
	h := func(ctx context.Context, i int) error {
		return g.Handle(ctx, func(ctx context.Context, tx pgx.Tx) error {
			_, err := tx.Exec(ctx, `INSERT INTO effects (key) VALUES ($1)`, msgs[i].Key)
			return err
		})
	}
	for i, r := range p.Process(t.Context(), msgs[:2], h) {
		if r.Action != consumer.Ack || r.Replayed {
			t.Fatalf("message %d: got %+v, want a processed ack", i, r)
		}
	}
	b := p.Acquire(t.Context(), msgs[2:])
	b.Handle(func(ctx context.Context, _ int) error { return h(ctx, 2) })
	b.Abandon() // crash after the commit
	for i, r := range p.Process(t.Context(), msgs, h) {
		if r.Action != consumer.Ack || !r.Replayed {
			t.Fatalf("redelivery %d: got %+v, want a replayed ack", i, r)
		}
	}
	var n int
	pool.QueryRow(t.Context(), `SELECT count(*) FROM effects`).Scan(&n)
	if n != 3 {
		t.Fatalf("effects: got %d, want 3", n)
	}
}
