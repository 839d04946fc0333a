package pgeffects

import (
	"context"
	"errors"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idemgo/idem"
	"github.com/idemgo/idem/chaos/chaostest"
	"github.com/idemgo/idem/postgres/pggate"
	"github.com/idemgo/idem/postgres/pgtest"
	"github.com/idemgo/idem/testkit/redistest"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	goredis "github.com/redis/go-redis/v9"
)

// TestPGConnectionsCut: Postgres goes away mid-run, as in a restart seen
// from the clients: every connection is cut and new ones are refused for
// 300 ms, every 500 ms, while 8 workers run every key until it succeeds.
// A TCP proxy in front of the shared server does the cutting
// (TestPGRestarted restarts a server of its own). With the gate: one
// effect per key, every acknowledged key has its completion row, the
// workers recover without any manual step. The control counts the
// duplicates that commits whose reply was lost cause when the effect is
// outside the gate.
func TestPGConnectionsCut(t *testing.T) {
	keys := chaostest.Size(300, 3000)
	modes(t, func(t *testing.T, m mode) {
		r := newRig(t)
		proxy := chaostest.StartNetProxy(t, strings.TrimPrefix(mustHost(t, r.url), "//"))
		u, _ := url.Parse(r.url)
		u.Host = proxy.Addr()
		pool := outagePool(t, u.String())
		outage(t, m, r.rdb, pool, r.pool, keys, "PG connections cut (restart seen by clients)", "make chaos RUN=PGConnectionsCut", nil, func(stop <-chan struct{}, _ func() int64) string {
			cuts := 0
			tick := time.NewTicker(500 * time.Millisecond)
			defer tick.Stop()
			for {
				select {
				case <-stop:
					return "cuts=" + strconv.Itoa(cuts)
				case <-tick.C:
					proxy.Disable()
					cuts++
					select {
					case <-stop:
					case <-time.After(300 * time.Millisecond):
					}
					proxy.Enable(t)
				}
			}
		})
	})
}

// TestPGRestarted: a PostgreSQL server of the test's own (pgtest.StartServer:
// initdb and pg_ctl in a temporary directory, on a free port) is restarted
// mid-run four times, alternately as a crash (pg_ctl stop -m immediate:
// the start recovers from the WAL) and a fast shutdown (open transactions
// rolled back), down for 200 ms each time, by the operations of the keys
// at 10, 30, 50 and 70% of the run, between their effect and their next
// statement, while 8 workers run every key until it succeeds (the other
// workers' operations fail while the server is down). With the gate: one
// effect per key, no committed completion lost (every acknowledged key
// has its row after the restarts), errors that say what failed, and
// recovery without any manual step (the pool reconnects). The negative
// control (each statement committed on its own) duplicates each of the 4
// restarted keys, and any other key whose commit reply a restart cut.
func TestPGRestarted(t *testing.T) {
	keys := chaostest.Size(300, 3000)
	modes(t, func(t *testing.T, m mode) {
		srv := pgtest.StartServer(t)
		redis := redistest.Start(t)
		rdb := goredis.NewClient(&goredis.Options{Addr: redis.Addr()})
		t.Cleanup(func() { rdb.Close() })
		check, err := pgxpool.New(t.Context(), srv.URL())
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(check.Close)
		_, g, err := build(rdb, check, nil, []pggate.Option{pggate.WithRelayInterval(0)})
		if err != nil {
			t.Fatal(err)
		}
		if err := g.Migrate(t.Context()); err != nil {
			t.Fatal(err)
		}
		g.Close()
		if _, err := check.Exec(t.Context(), `CREATE TABLE effects (key text NOT NULL, fence bigint NOT NULL, at timestamptz NOT NULL DEFAULT clock_timestamp())`); err != nil {
			t.Fatal(err)
		}
		pool := outagePool(t, srv.URL())
		// The restarts: the first run of each of four keys restarts the
		// server after its effect and before its transaction's next
		// statement (in the control, the next statement on the same
		// connection). Through the gate the transaction rolls back with
		// the effect; in the control the effect committed on its own and
		// the operation fails, so its retry repeats it: 4 duplicates.
		at := map[string]string{}
		for k, pct := range []int{10, 30, 50, 70} {
			at["k"+strconv.Itoa(keys*pct/100)] = map[bool]string{true: "immediate", false: "fast"}[k%2 == 0]
		}
		var restarts atomic.Int64
		var held sync.Map
		op := func(ctx context.Context, e *idem.Executor, g *pggate.Gate[pgx.Tx], id string, ex *int64) error {
			restart := func() {
				if mode, ok := at[id]; ok {
					if _, again := held.LoadOrStore(id, true); !again {
						srv.Restart(t, mode, 200*time.Millisecond)
						restarts.Add(1)
					}
				}
			}
			key := idem.Key{Scope: "pay", ID: id}
			if m == gated {
				_, err := g.Do(ctx, key, "fp", func(ctx context.Context, tx pgx.Tx) ([]byte, error) {
					*ex++
					if _, err := tx.Exec(ctx, `INSERT INTO effects (key, fence) VALUES ($1, 0)`, id); err != nil {
						return nil, err
					}
					restart()
					_, err := tx.Exec(ctx, `SELECT 1`)
					return []byte("paid"), err
				})
				return err
			}
			_, err := e.Do(ctx, key, "fp", func(ctx context.Context) ([]byte, error) {
				*ex++
				conn, err := pool.Acquire(ctx)
				if err != nil {
					return nil, err
				}
				defer conn.Release()
				if _, err := conn.Exec(ctx, `INSERT INTO effects (key, fence) VALUES ($1, 0)`, id); err != nil {
					return nil, err
				}
				restart()
				_, err = conn.Exec(ctx, `SELECT 1`)
				return []byte("paid"), err
			})
			return err
		}
		dup := outage(t, m, rdb, pool, check, keys, "PG server restarted (crash and fast, own server)", "make chaos RUN=PGRestarted", op, func(stop <-chan struct{}, _ func() int64) string {
			<-stop
			return "restarts=" + strconv.FormatInt(restarts.Load(), 10)
		})
		if restarts.Load() != 4 {
			t.Errorf("%d restarts, want 4", restarts.Load())
		}
		if m == control && dup < 4 {
			t.Errorf("negative control: %d duplicated keys, want at least 4 (one per restart; a commit whose reply a restart cut adds one): the test must see them", dup)
		}
	})
}

// outagePool returns a pool on rawURL whose connection attempts give up
// after a second, so that workers see a server that is down quickly.
func outagePool(t *testing.T, rawURL string) *pgxpool.Pool {
	t.Helper()
	cfg, err := pgxpool.ParseConfig(rawURL)
	if err != nil {
		t.Fatal(err)
	}
	cfg.ConnConfig.ConnectTimeout = time.Second
	pool, err := pgxpool.NewWithConfig(t.Context(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	return pool
}

// outage runs every key, with 8 workers that retry each until it
// succeeds, on a gate over pool while faults (until stop is closed)
// makes Postgres go away; it returns a summary of what faults did for the
// report. check (a pool that the faults do not touch, or that recovered)
// counts the effect rows and the completion rows.
func outage(t *testing.T, m mode, rdb *goredis.Client, pool, check *pgxpool.Pool, keys int, name, repro string, op func(ctx context.Context, e *idem.Executor, g *pggate.Gate[pgx.Tx], id string, ex *int64) error, faults func(stop <-chan struct{}, acked func() int64) string) (duplicated int64) {
	e, g, err := build(rdb, pool, nil, []pggate.Option{pggate.WithRelayInterval(100 * time.Millisecond), pggate.WithRelayDelay(0)})
	if err != nil {
		t.Fatal(err)
	}
	defer g.Close()
	var c chaostest.Counters
	var errs atomic.Int64
	var mu sync.Mutex
	samples := map[string]bool{}
	var executed int64
	stop := make(chan struct{})
	var summary string
	var cw sync.WaitGroup
	cw.Go(func() { summary = faults(stop, c.Acknowledged.Load) })
	ids := make(chan int)
	var wg sync.WaitGroup
	for range 8 {
		wg.Go(func() {
			var ex int64
			for i := range ids {
				id := "k" + strconv.Itoa(i)
				deadline := time.Now().Add(waitTimeout)
				for {
					c.Attempted.Add(1)
					ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
					var err error
					if op != nil {
						err = op(ctx, e, g, id, &ex)
					} else {
						_, err = do(ctx, e, g, pool, m, id, &ex, nil)
					}
					cancel()
					if err == nil {
						c.Acknowledged.Add(1)
						break
					}
					if errors.Is(err, idem.ErrInProgress) {
						e.Await(context.Background(), idem.Key{Scope: "pay", ID: id})
					} else {
						errs.Add(1)
						msg := err.Error()
						if len(msg) > 90 {
							msg = msg[:90]
						}
						mu.Lock()
						if len(samples) < 3 {
							samples[msg] = true
						}
						mu.Unlock()
						time.Sleep(20 * time.Millisecond) // a client's back-off before its retry
					}
					if time.Now().After(deadline) {
						t.Errorf("%s: no success within %v: %v", id, waitTimeout, err)
						break
					}
				}
			}
			mu.Lock()
			executed += ex
			mu.Unlock()
		})
	}
	for i := range keys {
		ids <- i
	}
	close(ids)
	wg.Wait()
	close(stop)
	cw.Wait()
	c.Executed.Store(executed)
	var missingRows int64
	if m == gated {
		// No committed completion lost: every key has its row.
		if err := check.QueryRow(context.Background(), `SELECT $1::int - count(*) FROM idem_completions`, keys).Scan(&missingRows); err != nil {
			t.Fatal(err)
		}
		if missingRows != 0 {
			t.Errorf("%d keys acknowledged without a completion row", missingRows)
		}
	}
	var sample []string
	for s := range samples {
		sample = append(sample, strconv.Quote(s))
	}
	k, v, _ := strings.Cut(summary, "=")
	figures := map[string]string{"keys": strconv.Itoa(keys), k: v, "errors": strconv.FormatInt(errs.Load(), 10),
		"missing_completions": strconv.FormatInt(missingRows, 10)}
	t.Logf("%s; error samples: %s", summary, strings.Join(sample, "; "))
	rows, dup := effects(t, check)
	c.Effects.Store(rows)
	c.Duplicated.Store(dup)
	if m == gated {
		name += " (gate)"
		if dup != 0 {
			t.Errorf("with the gate: %d duplicate effects, want 0", dup)
		}
	} else {
		name += " (unfenced control, no gate)"
	}
	chaostest.Report(t, name, repro, &c, figures)
	return dup
}

func mustHost(t *testing.T, raw string) string {
	t.Helper()
	u, err := url.Parse(raw)
	if err != nil {
		t.Fatal(err)
	}
	return u.Host
}
