package pgeffects

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/signal"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/idemgo/idem"
	"github.com/idemgo/idem/adapterkit"
	"github.com/idemgo/idem/chaos/chaostest"
	"github.com/idemgo/idem/postgres/pggate"
	"github.com/idemgo/idem/postgres/pgtest"
	"github.com/idemgo/idem/redisstore"
	"github.com/idemgo/idem/storekit"
	"github.com/idemgo/idem/testkit/redistest"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/redis/go-redis/v9"
)

// lease is the owners' lease: short, so that takeovers come quickly.
const lease = time.Second

const waitTimeout = 60 * time.Second

func TestMain(m *testing.M) {
	if role := chaostest.Role(); role != "" {
		os.Exit(runChild(role))
	}
	os.Exit(m.Run())
}

// mode is how an operation makes its effect.
type mode string

const (
	gated   mode = "gate"    // in the gate's transaction
	control mode = "control" // plain redisstore, the effect committed on its own
)

// rig is one scenario's Redis, Postgres schema, executor and gate.
type rig struct {
	srv  *redistest.Server
	rdb  *redis.Client
	pool *pgxpool.Pool
	url  string
	exec *idem.Executor
	gate *pggate.Gate[pgx.Tx]
}

// newRig starts a redis-server and makes a schema with the completion table
// and the effect table (no unique key: every duplicate is a row).
func newRig(t *testing.T, opts ...pggate.Option) *rig {
	t.Helper()
	srv := redistest.Start(t)
	rdb := srv.GoRedis(t)
	pool, url := pgtest.Pool(t)
	r := &rig{srv: srv, rdb: rdb, pool: pool, url: url}
	var err error
	r.exec, r.gate, err = build(rdb, pool, nil, append([]pggate.Option{pggate.WithRelayInterval(0)}, opts...))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { r.gate.Close() })
	if err := r.gate.Migrate(t.Context()); err != nil {
		t.Fatal(err)
	}
	if _, err := pool.Exec(t.Context(), `CREATE TABLE effects (key text NOT NULL, fence bigint NOT NULL, at timestamptz NOT NULL DEFAULT clock_timestamp())`); err != nil {
		t.Fatal(err)
	}
	return r
}

// build makes an Executor on a redisstore of rdb (wrapped by wrap, if not
// nil) and a gate on it.
func build(rdb *redis.Client, pool *pgxpool.Pool, wrap func(idem.Store) idem.Store, opts []pggate.Option) (*idem.Executor, *pggate.Gate[pgx.Tx], error) {
	rs, err := redisstore.New(rdb)
	if err != nil {
		return nil, nil, err
	}
	var s idem.Store = rs
	if wrap != nil {
		s = wrap(rs)
	}
	e, err := idem.New(s, idem.WithLease(lease))
	if err != nil {
		return nil, nil, err
	}
	g, err := pggate.New(e, pool, opts...)
	return e, g, err
}

// do runs the effect for id in mode m; hold, if not nil, runs after the
// effect and before the operation returns.
func do(ctx context.Context, e *idem.Executor, g *pggate.Gate[pgx.Tx], pool *pgxpool.Pool, m mode, id string, executed *int64, hold func()) (idem.Result, error) {
	key := idem.Key{Scope: "pay", ID: id}
	result := []byte("paid " + id)
	if m == gated {
		return g.Do(ctx, key, "fp", func(ctx context.Context, tx pgx.Tx) ([]byte, error) {
			if executed != nil {
				*executed++
			}
			fence, _ := idem.FenceFrom(ctx)
			if _, err := tx.Exec(ctx, `INSERT INTO effects (key, fence) VALUES ($1, $2)`, id, fence); err != nil {
				return nil, err
			}
			if hold != nil {
				hold()
			}
			return result, nil
		})
	}
	return e.Do(ctx, key, "fp", func(ctx context.Context) ([]byte, error) {
		if executed != nil {
			*executed++
		}
		fence, _ := idem.FenceFrom(ctx)
		if _, err := pool.Exec(ctx, `INSERT INTO effects (key, fence) VALUES ($1, $2)`, id, fence); err != nil {
			return nil, err
		}
		if hold != nil {
			hold()
		}
		return result, nil
	})
}

// doUntilDone repeats do while the key is in progress (waiting with Await)
// or the store errs, until it returns a result.
func doUntilDone(t testing.TB, ctx context.Context, r *rig, m mode, id string, executed *int64) idem.Result {
	t.Helper()
	deadline := time.Now().Add(waitTimeout)
	for {
		res, err := do(ctx, r.exec, r.gate, r.pool, m, id, executed, nil)
		if err == nil {
			return res
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: no result within %v: %v", id, waitTimeout, err)
		}
		if errors.Is(err, idem.ErrInProgress) {
			r.exec.Await(ctx, idem.Key{Scope: "pay", ID: id})
		}
	}
}

// effects returns the number of effect rows and of keys with more than one.
func effects(t testing.TB, pool *pgxpool.Pool) (rows, duplicated int64) {
	t.Helper()
	if err := pool.QueryRow(context.Background(), `SELECT count(*), count(*) - count(DISTINCT key) FROM effects`).Scan(&rows, &duplicated); err != nil {
		t.Fatal(err)
	}
	return rows, duplicated
}

// report counts the effects and reports the scenario; the gate must show
// no duplicate and the control at least one.
func report(t *testing.T, scenario string, m mode, c *chaostest.Counters, keys int, pool *pgxpool.Pool, figures map[string]string) {
	t.Helper()
	rows, dup := effects(t, pool)
	c.Effects.Store(rows)
	c.Duplicated.Store(dup)
	var missing int64
	pool.QueryRow(context.Background(), `SELECT $1::int - count(DISTINCT key) FROM effects`, keys).Scan(&missing)
	c.Lost.Store(missing)
	name := scenario + " (gate)"
	if m == control {
		name = scenario + " (unfenced control, no gate)"
	}
	chaostest.Report(t, name, "make chaos RUN=PG", c, figures)
	switch {
	case m == gated && (dup != 0 || missing != 0):
		t.Errorf("with the gate: %d duplicate effects, %d keys without an effect; want 0 and 0", dup, missing)
	case m == control && dup == 0:
		t.Errorf("control without the gate: no duplicate effect; the scenario does not show what the gate prevents")
	}
}

// resume receives SIGUSR1, which the parent sends after SIGCONT.
var resume = make(chan os.Signal, 1)

// stopSelf stops the calling process (SIGSTOP): a child's controlled pause
// at an exact point, which the parent then kills or resumes. The stop of a
// multi-threaded process is not immediate (a run showed a child completing
// its record after sending itself SIGSTOP), so the child then also waits
// for the parent's SIGUSR1, sent after SIGCONT: it never passes this point
// before the parent lets it.
func stopSelf() {
	syscall.Kill(os.Getpid(), syscall.SIGSTOP)
	<-resume
}

// stalling wraps a store so that RelayCompletion (the Redis completion
// after the commit) says "committed" and stops the process first.
type stalling struct{ idem.Store }

func (s stalling) Unwrap() idem.Store { return s.Store }

func (s stalling) RelayCompletion(ctx context.Context, key string, c storekit.Completion) error {
	chaostest.Say("committed")
	stopSelf()
	return s.Store.(storekit.Relayer).RelayCompletion(ctx, key, c)
}

// runChild runs an owner: CHILD_MODE gate or control, CHILD_KEY,
// CHILD_WINDOW after-commit (stop between the commit and the Redis
// completion; control: after the effect) or in-tx (stop after the effect,
// before the commit), or storm.
func runChild(role string) int {
	signal.Notify(resume, syscall.SIGUSR1)
	ctx := context.Background()
	rdb := redis.NewClient(&redis.Options{Addr: os.Getenv("CHILD_REDIS")})
	defer rdb.Close()
	pool, err := pgxpool.New(ctx, os.Getenv("CHILD_PG"))
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	defer pool.Close()
	m := mode(os.Getenv("CHILD_MODE"))
	var wrap func(idem.Store) idem.Store
	if role == "after-commit" && m == gated {
		wrap = func(s idem.Store) idem.Store { return stalling{s} }
	}
	e, g, err := build(rdb, pool, wrap, []pggate.Option{pggate.WithRelayInterval(0)})
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	defer g.Close()
	switch role {
	case "after-commit", "in-tx":
		var hold func()
		if role == "in-tx" || m == control {
			hold = func() { chaostest.Say("effect"); stopSelf() }
		}
		res, err := do(ctx, e, g, pool, m, os.Getenv("CHILD_KEY"), nil, hold)
		chaostest.Say("outcome replayed=%v err=%v", res.Replayed, err)
		return 0
	case "storm":
		return storm(ctx, e, g, pool, m)
	}
	fmt.Fprintf(os.Stderr, "unknown role %q\n", role)
	return 2
}

func childEnv(r *rig, m mode, key string) []string {
	return []string{"CHILD_REDIS=" + r.srv.Addr(), "CHILD_PG=" + r.url, "CHILD_MODE=" + string(m), "CHILD_KEY=" + key}
}

func modes(t *testing.T, fn func(t *testing.T, m mode)) {
	for _, m := range []mode{gated, control} {
		t.Run(string(m), func(t *testing.T) { fn(t, m) })
	}
}

// TestPGOwnerKilledAfterCommit: the owner commits its transaction and is
// killed before Redis hears of it.
func TestPGOwnerKilledAfterCommit(t *testing.T) {
	keys := chaostest.Size(3, 20)
	modes(t, func(t *testing.T, m mode) {
		r := newRig(t, pggate.WithRelayDelay(0))
		var c chaostest.Counters
		var executed int64
		repairedByRelay := 0
		for i := range keys {
			id := "k" + strconv.Itoa(i)
			c.Attempted.Add(1)
			p := chaostest.StartChild(t, "after-commit", childEnv(r, m, id)...)
			if m == gated {
				p.Expect("committed", waitTimeout)
			} else {
				p.Expect("effect", waitTimeout)
			}
			p.Kill()
			c.Executed.Add(1)
			if m == gated && i%2 == 0 {
				// The relay repairs Redis: the retry replays from Redis.
				n, err := r.gate.Relay(t.Context())
				if err != nil || n < 1 { // earlier keys' rows may not be marked yet
					t.Fatalf("relay after the crash: got %d, %v, want at least 1", n, err)
				}
				repairedByRelay++
				rec, err := adapterkit.Store(r.exec).Get(t.Context(), idem.Key{Scope: "pay", ID: id}.Digest())
				if err != nil || rec.State != storekit.StateCompleted {
					t.Fatalf("Redis after the relay: got %v, %v, want COMPLETED", rec.State, err)
				}
			}
			res := doUntilDone(t, t.Context(), r, m, id, &executed)
			c.Attempted.Add(1)
			c.Acknowledged.Add(1)
			if m == gated && (!res.Replayed || string(res.Value) != "paid "+id) {
				t.Errorf("%s: retry got %+v, want the stored result", id, res)
			}
		}
		c.Executed.Add(executed)
		report(t, "PG owner SIGKILL after commit", m, &c, keys, r.pool, map[string]string{"keys": strconv.Itoa(keys), "repaired_by_relay": strconv.Itoa(repairedByRelay)})
	})
}

// TestPGOwnerPausedPastLease: the owner stops in its transaction, after its
// effect, for 2× the lease; a retry takes over and commits; the owner
// resumes.
func TestPGOwnerPausedPastLease(t *testing.T) {
	keys := chaostest.Size(2, 10)
	modes(t, func(t *testing.T, m mode) {
		r := newRig(t)
		var c chaostest.Counters
		var executed int64
		staleRefused := 0
		for i := range keys {
			id := "k" + strconv.Itoa(i)
			c.Attempted.Add(1)
			p := chaostest.StartChild(t, "in-tx", childEnv(r, m, id)...)
			p.Expect("effect", waitTimeout)
			if err := redistest.WaitStopped(p.Pid(), 10*time.Second); err != nil {
				t.Fatal(err)
			}
			c.Executed.Add(1)
			stoppedAt := time.Now()
			// The retry takes over once the stopped owner's lease ended.
			res := doUntilDone(t, t.Context(), r, m, id, &executed)
			c.Attempted.Add(1)
			c.Acknowledged.Add(1)
			if d := time.Since(stoppedAt); d < 2*lease {
				time.Sleep(2*lease - d) // the pause lasts 2× the lease, as the scenario says
			}
			if res.Replayed {
				t.Errorf("%s: the retry replayed; want it to run after the takeover", id)
			}
			p.Signal(syscall.SIGCONT)
			p.Signal(syscall.SIGUSR1)
			out := p.Expect("outcome", waitTimeout)
			if m == gated && !strings.Contains(out, "replayed=true") && strings.Contains(out, "err=<nil>") {
				t.Errorf("%s: the stale owner reported %q: it committed", id, out)
			}
			if !strings.Contains(out, "err=<nil>") || strings.Contains(out, "replayed=true") {
				staleRefused++
			}
			p.Wait(waitTimeout)
		}
		c.Executed.Add(executed)
		report(t, "PG owner SIGSTOP 2x lease", m, &c, keys, r.pool, map[string]string{"keys": strconv.Itoa(keys), "stale_refused": strconv.Itoa(staleRefused)})
	})
}

// TestPGFlushAll: record loss in the middle of a run: every key is done,
// Redis is flushed, every key is retried.
func TestPGFlushAll(t *testing.T) {
	keys := chaostest.Size(200, 5000)
	modes(t, func(t *testing.T, m mode) {
		r := newRig(t)
		var c chaostest.Counters
		var mu sync.Mutex
		var executed int64
		run := func(from, to int) {
			var wg sync.WaitGroup
			ids := make(chan int)
			for range 8 {
				wg.Go(func() {
					var ex int64
					for i := range ids {
						doUntilDone(t, context.Background(), r, m, "k"+strconv.Itoa(i), &ex)
						c.Attempted.Add(1)
						c.Acknowledged.Add(1)
					}
					mu.Lock()
					executed += ex
					mu.Unlock()
				})
			}
			for i := from; i < to; i++ {
				ids <- i
			}
			close(ids)
			wg.Wait()
		}
		run(0, keys/2)
		r.srv.Do(t, "FLUSHALL")
		run(0, keys) // the first half again (retries after the loss), then the rest
		c.Executed.Store(executed)
		report(t, "PG Redis FLUSHALL mid-run", m, &c, keys, r.pool, map[string]string{"keys": strconv.Itoa(keys)})
	})
}

// TestPGRedisOOMAfterCommit: Redis refuses writes (maxmemory reached) after
// the effect, so the completion cannot be written.
func TestPGRedisOOMAfterCommit(t *testing.T) {
	keys := chaostest.Size(3, 20)
	modes(t, func(t *testing.T, m mode) {
		r := newRig(t)
		var c chaostest.Counters
		var executed int64
		for i := range keys {
			id := "k" + strconv.Itoa(i)
			c.Attempted.Add(1)
			oom := func() { r.srv.Do(t, "CONFIG", "SET", "maxmemory", "1") }
			res, err := do(t.Context(), r.exec, r.gate, r.pool, m, id, &executed, oom)
			r.srv.Do(t, "CONFIG", "SET", "maxmemory", "0")
			if err == nil {
				c.Acknowledged.Add(1)
			}
			if m == gated && (err != nil || string(res.Value) != "paid "+id) {
				t.Errorf("%s: with Redis refusing writes after the commit: got %+v, %v, want the result (the effect committed)", id, res, err)
			}
			res = doUntilDone(t, t.Context(), r, m, id, &executed)
			c.Attempted.Add(1)
			c.Acknowledged.Add(1)
			if m == gated && !res.Replayed {
				t.Errorf("%s: the retry ran again (%+v), want the replay", id, res)
			}
		}
		c.Executed.Store(executed)
		report(t, "PG Redis OOM after commit", m, &c, keys, r.pool, map[string]string{"keys": strconv.Itoa(keys)})
	})
}

// storm is a child's part of TestPGStorm: every key of CHILD_KEYS, 5
// concurrent duplicates each, retrying until each has a result.
func storm(ctx context.Context, e *idem.Executor, g *pggate.Gate[pgx.Tx], pool *pgxpool.Pool, m mode) int {
	keys, _ := strconv.Atoi(os.Getenv("CHILD_KEYS"))
	var executed, calls, ok int64
	var mu sync.Mutex
	var wg sync.WaitGroup
	ids := make(chan int)
	for range 5 * 4 {
		wg.Go(func() {
			var ex, n, k int64
			for i := range ids {
				id := "k" + strconv.Itoa(i)
				for {
					n++
					_, err := do(ctx, e, g, pool, m, id, &ex, nil)
					if err == nil {
						k++
						break
					}
					if errors.Is(err, idem.ErrInProgress) {
						e.Await(ctx, idem.Key{Scope: "pay", ID: id})
					}
				}
			}
			mu.Lock()
			executed, calls, ok = executed+ex, calls+n, ok+k
			mu.Unlock()
		})
	}
	for i := range keys {
		for range 5 { // 5 concurrent duplicates of each key in this process
			ids <- i
		}
	}
	close(ids)
	wg.Wait()
	chaostest.Say("done executed=%d calls=%d ok=%d", executed, calls, ok)
	return 0
}

// TestPGStorm: 4 processes send 5 concurrent duplicates of every key each,
// while Redis is flushed every 100ms.
func TestPGStorm(t *testing.T) {
	keys := chaostest.Size(300, 10000)
	modes(t, func(t *testing.T, m mode) {
		r := newRig(t)
		var c chaostest.Counters
		var procs []*chaostest.Proc
		for range 4 {
			procs = append(procs, chaostest.StartChild(t, "storm", append(childEnv(r, m, ""), "CHILD_KEYS="+strconv.Itoa(keys))...))
		}
		stop := make(chan struct{})
		flushes := 0
		var fw sync.WaitGroup
		fw.Go(func() {
			tick := time.NewTicker(100 * time.Millisecond)
			defer tick.Stop()
			for {
				select {
				case <-stop:
					return
				case <-tick.C:
					r.rdb.FlushAll(context.Background())
					flushes++
				}
			}
		})
		for _, p := range procs {
			line := p.Expect("done", 20*time.Minute)
			var ex, calls, ok int64
			fmt.Sscanf(line, "done executed=%d calls=%d ok=%d", &ex, &calls, &ok)
			c.Executed.Add(ex)
			c.Attempted.Add(calls)
			c.Acknowledged.Add(ok)
		}
		close(stop)
		fw.Wait()
		report(t, "PG 4 processes x 5 duplicates, FLUSHALL every 100ms", m, &c, keys, r.pool, map[string]string{
			"keys": strconv.Itoa(keys), "flushes": strconv.Itoa(flushes), "duplicates_per_key": "20",
		})
	})
}
