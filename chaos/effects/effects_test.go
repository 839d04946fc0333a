package effects

import (
	"context"
	"errors"
	"fmt"
	mrand "math/rand/v2"
	"os"
	"strconv"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/idemgo/idem"
	"github.com/idemgo/idem/chaos/chaostest"
	"github.com/idemgo/idem/redisstore"
	"github.com/idemgo/idem/testkit/redistest"
	"github.com/redis/go-redis/v9"
)

// lease is the owners' lease in the one-key scenarios.
const lease = time.Second

// Bounds of the waits: generous, since the machine may be loaded.
const (
	lineTimeout = 60 * time.Second
	stopTimeout = 10 * time.Second
)

// The data the effect changes; every key carries the store's hash tag.
const (
	tag       = "fx"
	stockKey  = "{fx}stock"
	ordersKey = "{fx}orders"
	eventsKey = "{fx}events"
	stock0    = 1 << 40
)

// applyOrder is the effect: one unit from the stock, one more order, one
// event naming the key. It checks the keys' types before its first write.
//
//	KEYS[1] stock, KEYS[2] orders, KEYS[3] events; ARGV[1] the key's ID
const applyOrder = `
for i, t in ipairs({'string', 'string', 'stream'}) do
  local got = redis.call('TYPE', KEYS[i]).ok
  if got ~= 'none' and got ~= t then
    return redis.error_reply(KEYS[i] .. ' is a ' .. got)
  end
end
redis.call('DECR', KEYS[1])
redis.call('INCR', KEYS[2])
redis.call('XADD', KEYS[3], '*', 'key', ARGV[1], 'fence', FENCE)
`

func TestMain(m *testing.M) {
	if role := chaostest.Role(); role != "" {
		os.Exit(runChild(role))
	}
	os.Exit(m.Run())
}

func runChild(role string) int {
	var err error
	switch role {
	case "owner":
		err = runOwner(os.Getenv("FX_REDIS"), os.Getenv("FX_KEY"), os.Getenv("FX_PLAIN") == "1")
	case "worker":
		keys, _ := strconv.Atoi(os.Getenv("FX_KEYS"))
		rounds, _ := strconv.Atoi(os.Getenv("FX_ROUNDS"))
		err = runWorker(os.Getenv("FX_REDIS"), keys, rounds, os.Getenv("FX_PLAIN") == "1")
	default:
		err = fmt.Errorf("unknown role %q", role)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, role+":", err)
		return 1
	}
	return 0
}

// newStore returns the scenarios' store on rdb: hash tag fx, the effects
// registered.
func newStore(rdb redis.UniversalClient) (*redisstore.Store, error) {
	return redisstore.New(rdb, redisstore.WithHashTag(tag), redisstore.WithEffect("order", applyOrder),
		redisstore.WithEffect("order_then_fail", applyOrderThenFail))
}

func key(id string) idem.Key { return idem.Key{Scope: "effects", ID: id} }

// order is the effect for the key id.
func order(id string) idem.Effect {
	return idem.Effect{Name: "order", Keys: []string{stockKey, ordersKey, eventsKey}, Args: []string{id}}
}

// applyPlain is the control: the same writes as plain commands, sent by
// the handler before the completion.
func applyPlain(ctx context.Context, rdb redis.UniversalClient, id string, fence int64) error {
	_, err := rdb.Pipelined(ctx, func(p redis.Pipeliner) error {
		p.Decr(ctx, stockKey)
		p.Incr(ctx, ordersKey)
		p.XAdd(ctx, &redis.XAddArgs{Stream: eventsKey, Values: []any{"key", id, "fence", fence}})
		return nil
	})
	return err
}

// goList is the list the parent pushes to when a blocked owner may go on.
func goList(id string) string { return "{fx}go:" + id }

// runOwner acquires key id and, in its operation, says "in fn <fence>" and
// waits until the parent pushes to goList (it may be killed or stopped
// before). With the effect it attaches it; with plain it writes the
// effect itself (the control) once it goes on, says "applied" and waits
// for a second push. It then reports what Do returned:
// "result lost=<bool> err=<quoted>".
func runOwner(addr, id string, plain bool) error {
	rdb := redis.NewClient(&redis.Options{Addr: addr})
	defer rdb.Close()
	store, err := newStore(rdb)
	if err != nil {
		return err
	}
	exec, err := idem.New(store, idem.WithLease(lease))
	if err != nil {
		return err
	}
	bg := context.Background()
	var fnErr error
	_, doErr := exec.Do(bg, key(id), "fp", func(ctx context.Context) ([]byte, error) {
		fence, _ := idem.FenceFrom(ctx)
		if !plain {
			if fnErr = idem.SetEffect(ctx, order(id)); fnErr != nil {
				return nil, fnErr
			}
		}
		chaostest.Say("in fn %d", fence)
		// Not ctx: a process that resumes from a pause is past any check of
		// its context, in the middle of its work.
		if fnErr = rdb.BLPop(bg, 0, goList(id)).Err(); fnErr != nil {
			return nil, fnErr
		}
		if plain {
			if fnErr = applyPlain(bg, rdb, id, fence); fnErr != nil {
				return nil, fnErr
			}
			// The work after the writes, which a kill may interrupt.
			chaostest.Say("applied")
			if fnErr = rdb.BLPop(bg, 0, goList(id)).Err(); fnErr != nil {
				return nil, fnErr
			}
		}
		return []byte("stale owner's result"), nil
	})
	if fnErr != nil {
		return fnErr
	}
	chaostest.Say("result lost=%t err=%q", errors.Is(doErr, idem.ErrLeaseLost), fmt.Sprint(doErr))
	return nil
}

// takeOver runs the key id on exec once its owner's lease ended, with the
// effect (or, plain, the control's writes), and returns Do's result.
func takeOver(ctx context.Context, t *testing.T, rdb redis.UniversalClient, exec *idem.Executor, id string, plain bool) idem.Result {
	t.Helper()
	for {
		res, err := exec.Do(ctx, key(id), "fp", func(ctx context.Context) ([]byte, error) {
			if plain {
				fence, _ := idem.FenceFrom(ctx)
				return []byte("B"), applyPlain(ctx, rdb, id, fence)
			}
			return []byte("B"), idem.SetEffect(ctx, order(id))
		})
		if errors.Is(err, idem.ErrInProgress) {
			if err := exec.Await(ctx, key(id)); err != nil {
				t.Fatal(err)
			}
			continue
		}
		if err != nil || res.Replayed {
			t.Fatalf("takeover of %s: got %+v, %v; want an execution", id, res, err)
		}
		return res
	}
}

// tally counts the effects in Redis: the units taken from the stock, the
// orders counted and the events per key, and adds them to c (Effects: the
// events; Duplicated: events beyond the first per key; Lost: keys among ids
// without an event). It fails t unless stock, orders and events agree.
func tally(t *testing.T, rdb redis.UniversalClient, ids []string, c *chaostest.Counters) {
	t.Helper()
	ctx := t.Context()
	stock, err := rdb.Get(ctx, stockKey).Int64()
	if err != nil {
		t.Fatal(err)
	}
	orders, _ := rdb.Get(ctx, ordersKey).Int64()
	per := map[string]int64{}
	var events int64
	for start := "-"; ; {
		batch, err := rdb.XRangeN(ctx, eventsKey, start, "+", 10000).Result()
		if err != nil {
			t.Fatal(err)
		}
		for _, e := range batch {
			per[e.Values["key"].(string)]++
			events++
		}
		if len(batch) < 10000 {
			break
		}
		start = "(" + batch[len(batch)-1].ID
	}
	if stock0-stock != orders || orders != events {
		t.Fatalf("the effect's writes disagree: %d units taken, %d orders, %d events", stock0-stock, orders, events)
	}
	c.Effects.Add(events)
	for _, id := range ids {
		n := per[id]
		if n == 0 {
			c.Lost.Add(1)
		}
		c.Duplicated.Add(max(0, n-1))
	}
}

// startRedis starts a redis-server for a scenario, with the stock set.
func startRedis(t *testing.T) *redis.Client {
	srv := redistest.Start(t)
	rdb := srv.GoRedis(t)
	if err := rdb.Set(t.Context(), stockKey, stock0, 0).Err(); err != nil {
		t.Fatal(err)
	}
	return rdb
}

func newExec(t *testing.T, rdb redis.UniversalClient, l time.Duration) *idem.Executor {
	t.Helper()
	store, err := newStore(rdb)
	if err != nil {
		t.Fatal(err)
	}
	exec, err := idem.New(store, idem.WithLease(l))
	if err != nil {
		t.Fatal(err)
	}
	return exec
}

// command returns the command that reproduces test at the current size.
func command(test string) string {
	if chaostest.Long() {
		return "make chaos-long RUN=" + test
	}
	return "make chaos RUN=" + test
}

// ownerScenario runs k keys, each held by a child owner that is stopped
// with SIGSTOP (pause) or killed with SIGKILL inside its operation, then
// taken over and completed by this process; a paused owner is then
// resumed and goes on. It returns the counters (and the number of stale
// owners whose Do reported ErrLeaseLost).
func ownerScenario(t *testing.T, k int, pause, plain bool) (*chaostest.Counters, int) {
	rdb := startRedis(t)
	exec := newExec(t, rdb, lease)
	ctx := t.Context()
	c := &chaostest.Counters{}
	ids := make([]string, k)
	owners := make([]*chaostest.Proc, k)
	flag := "FX_PLAIN=0"
	if plain {
		flag = "FX_PLAIN=1"
	}
	for i := range k {
		ids[i] = fmt.Sprintf("key-%d", i)
		owners[i] = chaostest.StartChild(t, "owner", "FX_REDIS="+rdb.Options().Addr, "FX_KEY="+ids[i], flag)
		c.Attempted.Add(1)
	}
	for _, o := range owners {
		o.Expect("in fn ", lineTimeout)
		c.Executed.Add(1)
		if pause {
			o.Pause(stopTimeout)
			continue
		}
		if plain {
			// The control's owner writes its effect, then is killed
			// before it completes.
			continue
		}
		o.Kill()
	}
	if !pause && plain {
		for i, o := range owners {
			if err := rdb.RPush(ctx, goList(ids[i]), "go").Err(); err != nil {
				t.Fatal(err)
			}
			o.Expect("applied", lineTimeout)
			o.Kill()
		}
	}
	for _, id := range ids {
		takeOver(ctx, t, rdb, exec, id, plain)
		c.Executed.Add(1)
		c.Acknowledged.Add(1)
	}
	lost := 0
	if pause {
		for i, o := range owners {
			pushes := 1
			if plain {
				pushes = 2 // and the work after the writes
			}
			for range pushes {
				if err := rdb.RPush(ctx, goList(ids[i]), "go").Err(); err != nil {
					t.Fatal(err)
				}
			}
			o.Signal(syscall.SIGCONT)
		}
		for i, o := range owners {
			var gotLost bool
			var msg string
			line := o.Expect("result ", lineTimeout)
			if _, err := fmt.Sscanf(line, "result lost=%t err=%q", &gotLost, &msg); err != nil {
				t.Fatalf("owner %s: line %q: %v", ids[i], line, err)
			}
			if err := o.Wait(lineTimeout); err != nil {
				t.Fatalf("owner %s: %v\n%s", ids[i], err, o.Stderr())
			}
			if gotLost {
				lost++
			} else {
				t.Errorf("%s: the stale owner's Do returned %s, want ErrLeaseLost", ids[i], msg)
			}
		}
	}
	tally(t, rdb, ids, c)
	return c, lost
}

// TestEffectOwnerKill: per key, an owner process attaches the effect and
// is killed with SIGKILL inside its operation; this process takes the key
// over after the lease and completes it with the effect. Every key's
// effect is applied once (0 duplicated, 0 lost). Control: owners that
// write the effect with plain commands and are killed before their
// completion; the takeover writes it again: one duplicate per key.
// K = 5 keys (long: 40).
func TestEffectOwnerKill(t *testing.T) {
	k := chaostest.Size(5, 40)
	c, _ := ownerScenario(t, k, false, false)
	if c.Duplicated.Load() != 0 || c.Lost.Load() != 0 {
		t.Errorf("with the effect: %d duplicated, %d lost, want 0 and 0", c.Duplicated.Load(), c.Lost.Load())
	}
	control, _ := ownerScenario(t, k, false, true)
	if control.Duplicated.Load() != int64(k) {
		t.Errorf("control: %d duplicated, want %d (one per key): the test cannot see a duplicate", control.Duplicated.Load(), k)
	}
	chaostest.Report(t, "effect: owner SIGKILL in its operation", command("TestEffectOwnerKill"), c, map[string]string{
		"control_duplicated": fmt.Sprint(control.Duplicated.Load()),
	})
}

// TestEffectOwnerPause: per key, an owner process attaches the effect and
// is stopped with SIGSTOP inside its operation; this process takes the key
// over once the lease ended and completes it with the effect; the owner is
// resumed and returns from its operation: its completion is refused
// (ErrLeaseLost) and its effect never applied. Control: owners that write
// the effect with plain commands after they resume: one duplicate per key.
// K = 5 keys (long: 40), each paused for at least its lease.
func TestEffectOwnerPause(t *testing.T) {
	k := chaostest.Size(5, 40)
	c, lost := ownerScenario(t, k, true, false)
	if c.Duplicated.Load() != 0 || c.Lost.Load() != 0 || lost != k {
		t.Errorf("with the effect: %d duplicated, %d lost, %d of %d stale owners refused; want 0, 0, all", c.Duplicated.Load(), c.Lost.Load(), lost, k)
	}
	control, _ := ownerScenario(t, k, true, true)
	if control.Duplicated.Load() != int64(k) {
		t.Errorf("control: %d duplicated, want %d (one per key): the test cannot see a duplicate", control.Duplicated.Load(), k)
	}
	chaostest.Report(t, "effect: owner SIGSTOP past its lease", command("TestEffectOwnerPause"), c, map[string]string{
		"stale_completes_refused": fmt.Sprint(lost),
		"control_duplicated":      fmt.Sprint(control.Duplicated.Load()),
	})
}

// TestEffectLostReply: per key, the reply of the completion call (with its
// effect) is swallowed by a TCP proxy (toxiproxy, "timeout" on the
// downstream); the client times out and the Executor repeats the call once
// the proxy heals: the repeated call finds the record COMPLETED by its own
// fence and applies nothing. Control: the effect sent as a plain script
// (EVAL of the same body) whose reply is lost and that is repeated is
// applied twice. K = 5 keys (long: 50).
func TestEffectLostReply(t *testing.T) {
	k := chaostest.Size(5, 50)
	srv := redistest.Start(t)
	direct := srv.GoRedis(t)
	ctx := t.Context()
	if err := direct.Set(ctx, stockKey, stock0, 0).Err(); err != nil {
		t.Fatal(err)
	}
	proxy := chaostest.StartNetProxy(t, srv.Addr())
	rdb := redis.NewClient(&redis.Options{Addr: proxy.Addr(), ReadTimeout: 300 * time.Millisecond, MaxRetries: -1})
	t.Cleanup(func() { rdb.Close() })
	store, err := newStore(rdb)
	if err != nil {
		t.Fatal(err)
	}
	counted := &countingStore{Store: store}
	exec, err := idem.New(counted, idem.WithLease(10*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	c := &chaostest.Counters{}
	ids := make([]string, k)
	heal := func(toxic string) {
		go func() {
			time.Sleep(500 * time.Millisecond) // longer than the read timeout
			proxy.RemoveToxic(t, toxic)
		}()
	}
	for i := range k {
		id := fmt.Sprintf("key-%d", i)
		ids[i] = id
		c.Attempted.Add(1)
		_, err := exec.Do(ctx, key(id), "fp", func(ctx context.Context) ([]byte, error) {
			c.Executed.Add(1)
			if err := idem.SetEffect(ctx, order(id)); err != nil {
				return nil, err
			}
			// Swallow what Redis answers from now on: the completion's
			// reply.
			heal(proxy.AddToxic(t, "timeout", "downstream", map[string]any{"timeout": 0}))
			return []byte("r"), nil
		})
		if err != nil {
			t.Fatalf("Do %s: %v", id, err)
		}
		c.Acknowledged.Add(1)
		// A duplicate request replays.
		res, err := exec.Do(ctx, key(id), "fp", func(context.Context) ([]byte, error) {
			c.Executed.Add(1)
			return nil, errors.New("ran again")
		})
		if err != nil || !res.Replayed {
			t.Fatalf("duplicate of %s: got %+v, %v; want a replay", id, res, err)
		}
	}
	tally(t, direct, ids, c)
	if c.Duplicated.Load() != 0 || c.Lost.Load() != 0 || c.Executed.Load() != int64(k) {
		t.Errorf("with the effect: %d duplicated, %d lost, %d executions of %d keys", c.Duplicated.Load(), c.Lost.Load(), c.Executed.Load(), k)
	}
	repeated := counted.calls.Load() - int64(k)
	if repeated < int64(k) {
		t.Errorf("%d completion calls for %d keys: the replies were not lost", counted.calls.Load(), k)
	}

	// Control: the same body as a plain script, repeated after its lost
	// reply.
	var control chaostest.Counters
	cids := make([]string, k)
	for i := range k {
		cids[i] = fmt.Sprintf("control-%d", i)
		keys := []string{stockKey, ordersKey, eventsKey}
		body := "local FENCE = '0'\n" + applyOrder
		heal(proxy.AddToxic(t, "timeout", "downstream", map[string]any{"timeout": 0}))
		for {
			err := rdb.Eval(ctx, body, keys, cids[i]).Err()
			if err == nil || errors.Is(err, redis.Nil) {
				break
			}
		}
	}
	tally(t, direct, cids, &control)
	if control.Duplicated.Load() < int64(k) {
		t.Errorf("control: %d duplicated, want at least %d: the test cannot see a duplicate", control.Duplicated.Load(), k)
	}
	chaostest.Report(t, "effect: completion reply lost", command("TestEffectLostReply"), c, map[string]string{
		"completions_repeated": fmt.Sprint(repeated),
		"control_duplicated":   fmt.Sprint(control.Duplicated.Load()),
	})
}

// countingStore counts the completion calls with an effect.
type countingStore struct {
	*redisstore.Store
	calls atomic.Int64
}

func (s *countingStore) CompleteEffect(ctx context.Context, key string, lease idem.Lease, result []byte, retention time.Duration, e idem.Effect) error {
	s.calls.Add(1)
	return s.Store.CompleteEffect(ctx, key, lease, result, retention, e)
}

// runWorker runs every key of 0..keys-1 rounds times, in a new random
// order each round, with the effect (or, plain, the control's writes
// before the completion); a key in progress elsewhere is skipped, since
// its owner completes it. It says "started" after its first key and
// "done" at the end, then waits for a push to exitList.
func runWorker(addr string, keys, rounds int, plain bool) error {
	rdb := redis.NewClient(&redis.Options{Addr: addr, PoolSize: 32})
	defer rdb.Close()
	store, err := newStore(rdb)
	if err != nil {
		return err
	}
	exec, err := idem.New(store, idem.WithLease(workerLease))
	if err != nil {
		return err
	}
	ctx := context.Background()
	var started sync.Once
	var executed, acknowledged atomic.Int64
	for range rounds {
		perm := mrand.Perm(keys)
		// workerGoroutines share the round.
		var next atomic.Int64
		errs := make(chan error, workerGoroutines)
		for range workerGoroutines {
			go func() {
				for {
					j := next.Add(1) - 1
					if j >= int64(len(perm)) {
						errs <- nil
						return
					}
					id := "k" + strconv.Itoa(perm[j])
					_, err := exec.Do(ctx, key(id), "fp", func(ctx context.Context) ([]byte, error) {
						executed.Add(1)
						if plain {
							fence, _ := idem.FenceFrom(ctx)
							if err := applyPlain(ctx, rdb, id, fence); err != nil {
								return nil, err
							}
						} else if err := idem.SetEffect(ctx, order(id)); err != nil {
							return nil, err
						}
						time.Sleep(workerWork) // the rest of the work
						return []byte("ok"), nil
					})
					if err != nil && !errors.Is(err, idem.ErrInProgress) && !errors.Is(err, idem.ErrLeaseLost) {
						errs <- fmt.Errorf("%s: %w", id, err)
						return
					}
					if err == nil {
						acknowledged.Add(1)
					}
					started.Do(func() { chaostest.Say("started") })
				}
			}()
		}
		for range workerGoroutines {
			if err := <-errs; err != nil {
				return err
			}
		}
	}
	chaostest.Say("done executed=%d acknowledged=%d", executed.Load(), acknowledged.Load())
	// Stay until the parent is done pausing.
	return rdb.BLPop(ctx, 0, exitList).Err()
}

// Each worker runs its keys on workerGoroutines goroutines, and each
// operation works workerWork after its writes: a round then lasts longer
// than a pause, so that the other workers come back to a paused worker's
// keys after its lease and take them over.
const (
	workerGoroutines = 4
	workerWork       = 5 * time.Millisecond
)

// exitList is the list the parent pushes to when the workers may exit.
const exitList = "{fx}exit"

// workerLease is the lease in TestEffectManyProcesses: short, so that a
// paused worker is taken over within the run.
const workerLease = 300 * time.Millisecond

// maxRuns bounds the runs of TestEffectManyProcesses, and of its control:
// a run that ends before a pause caught worker 0 holding a key proves
// nothing, and the next one is made.
const maxRuns = 3

// manyProcesses runs keys keys × 20 duplicates from 4 worker processes
// (5 rounds each), pausing worker 0 for 10 leases, once every worker
// started and again 1–1.5s after each resume while they run, and returns
// the counters and the number of pauses.
func manyProcesses(t *testing.T, keys int, plain bool) (*chaostest.Counters, int) {
	rdb := startRedis(t)
	flag := "FX_PLAIN=0"
	if plain {
		flag = "FX_PLAIN=1"
	}
	const workers, rounds = 4, 5
	procs := make([]*chaostest.Proc, workers)
	for i := range procs {
		procs[i] = chaostest.StartChild(t, "worker", "FX_REDIS="+rdb.Options().Addr, "FX_KEYS="+strconv.Itoa(keys),
			"FX_ROUNDS="+strconv.Itoa(rounds), flag)
	}
	for _, p := range procs {
		p.Expect("started", lineTimeout)
	}
	c := &chaostest.Counters{}
	done := make(chan struct{})
	go func() {
		defer close(done)
		for i, p := range procs {
			line := p.Expect("done", 20*time.Minute)
			var executed, acknowledged int64
			if _, err := fmt.Sscanf(line, "done executed=%d acknowledged=%d", &executed, &acknowledged); err != nil {
				t.Errorf("worker %d: line %q: %v", i, line, err)
			}
			c.Executed.Add(executed)
			c.Acknowledged.Add(acknowledged)
		}
	}()
	pauses := 0
	for running := true; running; {
		procs[0].Pause(stopTimeout)
		pauses++
		time.Sleep(10 * workerLease) // the pause: two rounds of the others
		procs[0].Signal(syscall.SIGCONT)
		select {
		case <-done:
			running = false
		case <-time.After(time.Second + time.Duration(mrand.Int64N(int64(500*time.Millisecond)))):
		}
	}
	for range procs {
		if err := rdb.RPush(t.Context(), exitList, "exit").Err(); err != nil {
			t.Fatal(err)
		}
	}
	for i, p := range procs {
		if err := p.Wait(lineTimeout); err != nil {
			t.Errorf("worker %d: %v\n%s", i, err, p.Stderr())
		}
	}
	c.Attempted.Store(int64(keys * workers * rounds))
	ids := make([]string, keys)
	for i := range ids {
		ids[i] = "k" + strconv.Itoa(i)
	}
	tally(t, rdb, ids, c)
	return c, pauses
}

// manyProcessesUntil runs manyProcesses up to maxRuns times, until a run
// has what the test waits for (a takeover, a duplicate: want), which done
// tells from the run's counters (it sees every run's), and returns the
// last run's counters and the pauses of all runs.
func manyProcessesUntil(t *testing.T, keys int, plain bool, want string, done func(run int, c *chaostest.Counters) bool) (*chaostest.Counters, int) {
	var c *chaostest.Counters
	pauses := 0
	for run := 1; run <= maxRuns; run++ {
		var p int
		c, p = manyProcesses(t, keys, plain)
		pauses += p
		if done(run, c) {
			break
		}
		t.Logf("run %d (plain %v): no %s in %d pauses", run, plain, want, p)
	}
	return c, pauses
}

// TestEffectManyProcesses: 4 processes each run every one of 1,000 keys
// (long: 10,000) 5 times, 20 runs per key, with the effect, while worker 0
// is paused past its lease now and then: the units taken from the stock,
// the orders counted and the events equal the number of keys, with no key
// twice and none missing. Control: the same run with the writes made by
// plain commands before the completion (1,000 keys in both sizes) has
// duplicates. A pause tests something only if it catches worker 0 holding
// a key, and a run may end after one pause: each side runs again, up to
// maxRuns times, until a run has a takeover (with the effect: every run
// must hold the guarantee) or a duplicate (the control).
func TestEffectManyProcesses(t *testing.T) {
	keys := chaostest.Size(1000, 10000)
	// Executions beyond one per key are takeovers of the paused worker's
	// keys: the case the effect must survive.
	takeovers := func(c *chaostest.Counters) int64 { return c.Executed.Load() - int64(keys) }
	c, pauses := manyProcessesUntil(t, keys, false, "takeover", func(run int, c *chaostest.Counters) bool {
		if c.Duplicated.Load() != 0 || c.Lost.Load() != 0 || c.Effects.Load() != int64(keys) {
			t.Errorf("with the effect, run %d: %d effects, %d duplicated, %d lost; want %d, 0, 0", run, c.Effects.Load(), c.Duplicated.Load(), c.Lost.Load(), keys)
		}
		return takeovers(c) > 0
	})
	if takeovers(c) == 0 {
		t.Errorf("no key of the paused worker was taken over in %d runs, %d pauses: the test did not try a stale owner", maxRuns, pauses)
	}
	control, cpauses := manyProcessesUntil(t, 1000, true, "duplicate", func(_ int, c *chaostest.Counters) bool {
		return c.Duplicated.Load() > 0
	})
	if control.Duplicated.Load() == 0 {
		t.Errorf("control: no duplicate in %d runs, %d pauses: the test cannot see one", maxRuns, cpauses)
	}
	chaostest.Report(t, "effect: 20 duplicates per key from 4 processes, one paused", command("TestEffectManyProcesses"), c, map[string]string{
		"keys":               fmt.Sprint(keys),
		"pauses":             fmt.Sprint(pauses),
		"takeovers":          fmt.Sprint(takeovers(c)),
		"control_duplicated": fmt.Sprint(control.Duplicated.Load()),
		"control_pauses":     fmt.Sprint(cpauses),
	})
}
