package brokercrash

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"os/signal"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/idemgo/idem"
	"github.com/idemgo/idem/chaos/chaostest"
	"github.com/idemgo/idem/consumer"
	"github.com/idemgo/idem/testkit/redistest"
)

// TestMain runs a consumer role when chaostest.StartChild started this
// binary as a child, and the tests otherwise.
func TestMain(m *testing.M) {
	if role := chaostest.Role(); role != "" {
		os.Exit(runChild(role))
	}
	os.Exit(m.Run())
}

const (
	// lease is the idempotency lease of every consumer: a crashed owner's
	// key can be taken over this long after its last heartbeat.
	lease = 2 * time.Second
	// sinkPrefix is where the fenced sink keeps its hashes, and
	// runsKey counts the handler runs of every process.
	sinkPrefix = "sink:"
	runsKey    = "chaos:runs"
	// Environment of a child (besides the adapter's own, see broker.env).
	envRedis = "IDEM_BC_REDIS" // the test's redis-server: store and sink
	envName  = "IDEM_BC_NAME"  // the child's name
	envCrash = "IDEM_BC_CRASH" // the key whose handler hangs until SIGKILL
	// envEffectFirst=1 makes the hung handler apply its effect first.
	envEffectFirst = "IDEM_BC_EFFECT_FIRST"
)

// How long a scenario waits for what its children do.
const (
	startWait   = 60 * time.Second  // for a child to be ready, or to reach its chosen key
	takeoverMax = 60 * time.Second  // for a chosen key's takeover
	drainWait   = 120 * time.Second // for the whole publication to be done
)

// scene is what a scenario runs on: the test's redis-server (store and
// sink), the adapter's broker and the plan of what is published.
type scene struct {
	a    adapter
	rdb  *redis.Client
	sink *chaostest.RedisSink
	b    broker
	p    plan
	env  []string // every child's environment
}

// newScene prepares a run of a with n messages in rounds chunks; env is
// added to every child's environment.
func newScene(t *testing.T, a adapter, n, rounds int, env ...string) *scene {
	srv := redistest.Start(t)
	rdb := redis.NewClient(&redis.Options{Addr: srv.Addr()})
	t.Cleanup(func() { _ = rdb.Close() })
	b := a.setup(t, srv)
	return &scene{
		a: a, rdb: rdb, sink: chaostest.NewRedisSink(rdb, sinkPrefix), b: b, p: newPlan(n, rounds),
		env: append(append(b.env(), envRedis+"="+srv.Addr()), env...),
	}
}

// startChild starts child i as role, with the plan's chosen key of round
// i in keyEnv, and waits until it is ready.
func (s *scene) startChild(t *testing.T, role string, i int, keyEnv string) *chaostest.Proc {
	t.Helper()
	child := chaostest.StartChild(t, role, append(s.env, envName+"=c"+strconv.Itoa(i), keyEnv+"="+s.p.crash[i])...)
	child.Expect("ready", startWait)
	return child
}

// adapter is one broker adapter under test: how the parent prepares its
// broker, and how a child runs the adapter's consumer.
type adapter struct {
	name string
	// redelivery says how the broker hands a crashed consumer's message
	// to another consumer, for the report.
	redelivery string
	// setup prepares the broker for one test; srv is the test's
	// redis-server (the idempotency store and the sink).
	setup func(t *testing.T, srv *redistest.Server) broker
	// start builds the adapter's consumer in a child, from the child's
	// environment, with opts after the adapter's own, and returns its
	// Run; h is the business handler, given the message's idempotency key.
	start func(rdb *redis.Client, h handlerFunc, opts ...consumer.Option) (run func(ctx context.Context) error, err error)
}

// broker is the parent's side of an adapter's broker.
type broker interface {
	// env is the configuration a child needs to consume (KEY=value).
	env() []string
	// publish publishes msgs, in order, and waits for the broker to
	// accept them.
	publish(t *testing.T, msgs []message)
	// remaining returns how many of the total messages published are not
	// acknowledged (committed, deleted, acked) yet.
	remaining(t *testing.T, total int) int
	// deadLetters returns how many messages are on the dead-letter path.
	deadLetters(t *testing.T) int
}

// message is one published message: its idempotency key and its position
// in the whole publication.
type message struct {
	key string
	seq int
}

// handlerFunc is the business handler a child gives to its adapter.
type handlerFunc func(ctx context.Context, key string) error

// TestOwnerCrashBroker is scenario 2 (owner crash) for every broker adapter.
//
// Injected: M messages (short 200, long 2,000; 30% of them duplicates of
// another message's key, some right after their original, some a chunk
// later) are consumed by child OS processes, one at a time; the handler of
// a chosen key hangs (it prints "in handler <key>" first) and the parent
// SIGKILLs that child while it is inside the handler, after starting its
// successor, at a random point of the hung owner's heartbeat cycle. This
// repeats for several children in a row (short 2 kills, long 10); the last
// child consumes to the end. Every adapter is configured with
// batches of one message, so that every effect applied before a kill was
// also completed (see the package doc of each adapter: a crash between an
// effect and its batch's completion runs the handler again with a higher
// fence, which is a documented limit, not what this scenario measures).
//
// Asserted: every key has exactly one applied effect in a fenced sink
// shared by the processes (0 lost, 0 duplicated); each killed key's
// effect was applied by a later owner with a higher fence; the handlers
// ran exactly once per key plus once per kill; nothing is dead-lettered;
// and every message ends acknowledged on the broker (nothing pending,
// lag 0, queue empty). Measured: the takeover time from the SIGKILL to the
// killed key's effect in the sink, p50/p99 per adapter.
func TestOwnerCrashBroker(t *testing.T) {
	for _, a := range adapters {
		t.Run(a.name, func(t *testing.T) { ownerCrash(t, a, false) })
	}
}

// TestCrashAfterEffect is the negative control of TestOwnerCrashBroker, on
// Redis Streams: the same run, except that the hung handler applies its
// effect to the sink before it hangs, so the owner is killed between the
// effect and the completion. The next owner runs the handler again with a
// higher fence, which the fenced sink accepts: the test must see exactly
// one duplicate effect per kill, each on a killed key, and nothing lost.
// This is the documented limit of every adapter (exactly-once effects
// across such a crash need an effect that records the key, not only a
// fence check), and it proves that TestOwnerCrashBroker can see a duplicate.
func TestCrashAfterEffect(t *testing.T) {
	ownerCrash(t, adapters[0], true)
}

// ownerCrash runs the scenario for a. With effectFirst, the hung handlers
// apply their effect before hanging (the negative control).
func ownerCrash(t *testing.T, a adapter, effectFirst bool) {
	n := chaostest.Size(200, 2000)
	kills := chaostest.Size(2, 10)
	begin := time.Now()
	var env []string
	var before int64 // the killed key's effects before its takeover
	if effectFirst {
		env = append(env, envEffectFirst+"=1")
		before = 1
	}
	sc := newScene(t, a, n, kills+1, env...)
	rdb, sink, b, p := sc.rdb, sc.sink, sc.b, sc.p
	startChild := func(i int) *chaostest.Proc {
		t.Helper()
		return sc.startChild(t, "brokercrash-"+a.name, i, envCrash)
	}

	b.publish(t, p.chunks[0])
	cur := startChild(0)
	var takeovers []time.Duration
	for r := range kills {
		line := cur.Expect("in handler ", startWait)
		var key string
		var fence, handled int64
		if _, err := fmt.Sscanf(line, "in handler %s fence %d handled %d", &key, &fence, &handled); err != nil || key != p.crash[r] {
			t.Fatalf("child %d said %q, want in handler %s fence <n> handled <n> (%v)", r, line, p.crash[r], err)
		}
		if handled == 0 {
			t.Errorf("child %d crashed before handling any message, want it to crash mid-stream", r)
		}
		next := startChild(r + 1)
		// Kill at a random point of the hung owner's heartbeat cycle (it
		// extends its lease every third of it), so that the takeover
		// times cover every lease left at the kill, not one phase.
		time.Sleep(rand.N(lease / 3))
		killed := time.Now()
		cur.Kill()
		st := awaitTakeover(t, sink, next, takeoverMax, key, before)
		takeovers = append(takeovers, time.Since(killed))
		if st.Fence <= fence {
			t.Errorf("key %s: effect applied with fence %d, want above the killed owner's %d", key, st.Fence, fence)
		}
		cur = next
		b.publish(t, p.chunks[r+1])
	}

	drain(t, rdb, b, cur, drainWait, len(p.keys), n)
	elapsed := time.Since(begin)
	v := judge(t, rdb, sink, b, p.keys, n)
	c, stale, dupKeys, runs, remaining, dead := &v.c, v.stale, v.dupKeys, v.runs, v.remaining, v.dead

	figures := map[string]string{
		"takeover_p50": chaostest.Percentile(takeovers, 50).Round(time.Millisecond).String(),
		"takeover_p99": chaostest.Percentile(takeovers, 99).Round(time.Millisecond).String(),
		"messages":     strconv.Itoa(n),
		"keys":         strconv.Itoa(len(p.keys)),
		"kills":        strconv.Itoa(kills),
		"lease":        lease.String(),
		"redelivery":   a.redelivery,
		"stale_writes": strconv.FormatInt(stale, 10),
		"dead_letters": strconv.Itoa(dead),
		"elapsed":      elapsed.Round(time.Millisecond).String(),
	}
	t.Logf("takeover times: %v", takeovers)
	if effectFirst {
		t.Logf("negative control (%s, effect applied before the kill): attempted=%d acknowledged=%d executed=%d effects=%d lost=%d duplicated=%d, duplicated keys %v, killed keys %v",
			a.name, c.Attempted.Load(), c.Acknowledged.Load(), c.Executed.Load(), c.Effects.Load(), c.Lost.Load(), c.Duplicated.Load(), dupKeys, p.crash[:kills])
		if c.Lost.Load() != 0 || c.Duplicated.Load() != int64(kills) || !slices.Equal(dupKeys, p.crash[:kills]) {
			t.Errorf("got %d lost keys and %d duplicate effects on %v, want 0 lost and one duplicate on each killed key %v",
				c.Lost.Load(), c.Duplicated.Load(), dupKeys, p.crash[:kills])
		}
	} else {
		command := "make chaos RUN=TestOwnerCrashBroker/" + a.name
		if chaostest.Long() {
			command = "make chaos-long RUN=TestOwnerCrashBroker/" + a.name
		}
		chaostest.Report(t, "owner crash ("+a.name+")", command, c, figures)
		if c.Lost.Load() != 0 || c.Duplicated.Load() != 0 {
			t.Errorf("got %d lost keys and %d duplicate effects, want 0 and 0", c.Lost.Load(), c.Duplicated.Load())
		}
	}
	if want := int64(len(p.keys) + kills); runs != want {
		t.Errorf("got %d handler runs, want %d: one per key plus one per killed handler", runs, want)
	}
	if remaining != 0 {
		t.Errorf("got %d messages not acknowledged after the last consumer stopped, want 0", remaining)
	}
	if dead != 0 {
		t.Errorf("got %d dead letters, want 0", dead)
	}
}

// awaitTakeover waits, at most d, until the sink holds more than before
// effects of key, which consumer next is to apply, and returns the sink's
// state of key.
func awaitTakeover(t *testing.T, sink *chaostest.RedisSink, next *chaostest.Proc, d time.Duration, key string, before int64) chaostest.SinkState {
	t.Helper()
	var st chaostest.SinkState
	waitFor(t, next, d, time.Millisecond, "the takeover of "+key, func() bool {
		var err error
		st, err = sink.State(t.Context(), key)
		if err != nil {
			t.Fatalf("sink: %v", err)
		}
		return st.Applied > before
	})
	return st
}

// drain waits, at most d, for the effects of all keys and the
// acknowledgement of all n messages, then stops cur, the last consumer.
func drain(t *testing.T, rdb *redis.Client, b broker, cur *chaostest.Proc, d time.Duration, keys, n int) {
	t.Helper()
	waitFor(t, cur, d, 50*time.Millisecond, "every key's effect and every message acknowledged", func() bool {
		applied, err := rdb.SCard(t.Context(), sinkPrefix+"applied").Result()
		if err != nil {
			t.Fatalf("sink: %v", err)
		}
		return int(applied) == keys && b.remaining(t, n) == 0
	})
	cur.Signal(syscall.SIGTERM)
	if err := cur.Wait(60 * time.Second); err != nil {
		t.Errorf("last consumer: %v", err)
	}
}

// verdict is the outcome of a run, from the sink and the broker.
type verdict struct {
	c       chaostest.Counters
	stale   int64    // fenced writes the sink refused
	dupKeys []string // keys with more than one effect
	runs    int64    // handler runs
	// remaining messages not acknowledged, and dead letters.
	remaining, dead int
}

// judge reads the verdict of a run of n messages with keys.
func judge(t *testing.T, rdb *redis.Client, sink *chaostest.RedisSink, b broker, keys []string, n int) *verdict {
	t.Helper()
	v := &verdict{remaining: b.remaining(t, n), dead: b.deadLetters(t)}
	v.c.Attempted.Store(int64(n))
	v.c.Acknowledged.Store(int64(n - v.remaining))
	for _, k := range keys {
		st, err := sink.State(t.Context(), k)
		if err != nil {
			t.Fatalf("sink: %v", err)
		}
		v.c.Effects.Add(st.Applied)
		v.stale += st.Stale
		switch {
		case st.Applied == 0:
			v.c.Lost.Add(1)
		case st.Applied > 1:
			v.c.Duplicated.Add(st.Applied - 1)
			v.dupKeys = append(v.dupKeys, k)
		}
	}
	runs, err := rdb.Get(t.Context(), runsKey).Int64()
	if err != nil {
		t.Fatalf("runs: %v", err)
	}
	v.runs = runs
	v.c.Executed.Store(runs)
	return v
}

// waitFor polls cond every poll until it holds, failing the test after d
// or if the consumer that should make it hold has exited.
func waitFor(t *testing.T, consumer *chaostest.Proc, d, poll time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(d)
	for !cond() {
		if consumer.Exited() {
			t.Fatalf("the consumer exited while waiting for %s; stderr:\n%s", what, consumer.Stderr())
		}
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %v waiting for %s", d, what)
		}
		time.Sleep(poll)
	}
}

// plan is what the test publishes: the unique keys, the messages in rounds
// (chunk i is published when child i is the consumer) and the key whose
// handler hangs in each child ("" for the last one).
type plan struct {
	keys   []string
	chunks [][]message
	crash  []string
}

// newPlan spreads n messages, 70% of them unique keys and 30% duplicates,
// over rounds chunks. Half of the duplicates follow their original at
// once, half come about a chunk later. Each chunk but the last has a crash
// key: the first key that appears for the first time in its second half.
func newPlan(n, rounds int) plan {
	u := n * 7 / 10
	d := n - u
	after := make([][]int, u)
	for j := range d {
		i := j * u / d
		at := i
		if j%2 == 1 {
			at = min(i+u/rounds, u-1)
		}
		after[at] = append(after[at], i)
	}
	var order []int
	for i := range u {
		order = append(order, i)
		order = append(order, after[i]...)
	}
	key := func(i int) string { return "order-" + strconv.Itoa(i) }
	p := plan{crash: make([]string, rounds)}
	for i := range u {
		p.keys = append(p.keys, key(i))
	}
	seen := make([]bool, u)
	for r := range rounds {
		lo, hi := r*len(order)/rounds, (r+1)*len(order)/rounds
		var chunk []message
		for pos := lo; pos < hi; pos++ {
			k := order[pos]
			chunk = append(chunk, message{key: key(k), seq: pos})
			if r < rounds-1 && p.crash[r] == "" && !seen[k] && pos >= (lo+hi)/2 {
				p.crash[r] = key(k)
			}
			seen[k] = true
		}
		p.chunks = append(p.chunks, chunk)
	}
	return p
}

// runChild is a consumer process: it runs the adapter of role with a
// handler that applies each key's effect to the fenced sink, except that
// the handler of the crash key hangs, and every handler after it too,
// until the process is killed. SIGTERM stops it cleanly.
func runChild(role string) int {
	if name, ok := strings.CutPrefix(role, "brokerstuck-"); ok {
		return runStuckChild(role, adapterNamed(name))
	}
	name, ok := strings.CutPrefix(role, "brokercrash-")
	a := adapterNamed(name)
	if !ok || a == nil {
		fmt.Fprintf(os.Stderr, "unknown role %q\n", role)
		return 2
	}
	rdb := redis.NewClient(&redis.Options{Addr: os.Getenv(envRedis)})
	defer rdb.Close()
	sink := chaostest.NewRedisSink(rdb, sinkPrefix)
	crash := os.Getenv(envCrash)
	effectFirst := os.Getenv(envEffectFirst) == "1"
	var hung atomic.Bool
	var handled atomic.Int64    // effects this process applied
	hang := make(chan struct{}) // never closed: the process is killed
	apply := func(ctx context.Context, key string, fence int64) error {
		applied, err := applyEffect(ctx, rdb, sink, key, fence)
		if applied {
			handled.Add(1)
		}
		return err
	}
	h := func(ctx context.Context, key string) error {
		fence, ok := idem.FenceFrom(ctx)
		if !ok {
			return errors.New("no fence in the handler's context")
		}
		if err := rdb.Incr(ctx, runsKey).Err(); err != nil {
			return err
		}
		if key == crash && hung.CompareAndSwap(false, true) {
			if effectFirst {
				if err := apply(ctx, key, fence); err != nil {
					return err
				}
			}
			chaostest.Say("in handler %s fence %d handled %d", key, fence, handled.Load())
		}
		if hung.Load() {
			<-hang
		}
		return apply(ctx, key, fence)
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM)
	defer stop()
	run, err := a.start(rdb, h)
	if err != nil {
		fmt.Fprintf(os.Stderr, "%s: %v\n", os.Getenv(envName), err)
		return 1
	}
	chaostest.Say("ready")
	err = run(ctx)
	if ctx.Err() != nil {
		return 0
	}
	fmt.Fprintf(os.Stderr, "%s: Run: %v\n", os.Getenv(envName), err)
	return 1
}

// adapterNamed returns the adapter called name, or nil.
func adapterNamed(name string) *adapter {
	for i := range adapters {
		if adapters[i].name == name {
			return &adapters[i]
		}
	}
	return nil
}

// applyEffect writes key's effect to the fenced sink, and records the key
// as applied if the sink took it; a stale owner's write is refused by the
// sink (and counted there).
func applyEffect(ctx context.Context, rdb *redis.Client, sink *chaostest.RedisSink, key string, fence int64) (applied bool, err error) {
	applied, err = sink.Apply(ctx, key, fence)
	if err != nil || !applied {
		return false, err
	}
	return true, rdb.SAdd(ctx, sinkPrefix+"applied", key).Err()
}
