package brokercrash

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/signal"
	"strconv"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/idemgo/idem"
	"github.com/idemgo/idem/chaos/chaostest"
	"github.com/idemgo/idem/consumer"
)

const (
	// envStuck is the key whose handler ignores its context until the
	// child gets SIGUSR1; envShutdown the consumer's shutdown timeout.
	envStuck    = "IDEM_BC_STUCK"
	envShutdown = "IDEM_BC_SHUTDOWN"
	// stuckShutdown is the shutdown timeout of the stuck-handler scenario.
	stuckShutdown = time.Second
	// runReturnMax is how long the parent waits for Run to return after
	// SIGTERM: 30 times the shutdown timeout. Before handlers could be
	// abandoned, Run did not return within it (the negative control).
	runReturnMax = 30 * stuckShutdown
)

// TestStuckHandlerBroker is scenario 16 (a handler that ignores its context
// at shutdown) for every broker adapter.
//
// Injected: M messages (short 60, long 600; 30% duplicates, as in
// TestOwnerCrashBroker) are consumed by child OS processes, one at a time,
// with a shutdown timeout of 1s; the handler of a chosen key blocks until
// the child gets SIGUSR1, ignoring its context. The parent sends SIGTERM to
// that child while the handler blocks, waits for Run to return, starts the
// next child, waits for it to take the key over, and only then releases
// the blocked handler, which writes its effect with its own (now stale)
// fence and returns success. This repeats for several children (short 2,
// long 5); the last one consumes to the end.
//
// Asserted: each child's Run returns while its handler still blocks (the
// parent waits at most 30 times the shutdown timeout: the negative control
// is the code before the fix, whose Run did not return within that); the
// next child takes the key over with a higher fence (the key was left to
// its lease and the heartbeat stopped; the message was not acknowledged);
// the late write is refused by the fence and the late return has no other
// effect (every key has exactly one effect, nothing is lost, nothing is
// dead-lettered, every message ends acknowledged). Measured: the time from
// SIGTERM to Run's return, and from Run's return to the takeover's effect.
func TestStuckHandlerBroker(t *testing.T) {
	for _, a := range adapters {
		t.Run(a.name, func(t *testing.T) { stuckHandler(t, a) })
	}
}

func stuckHandler(t *testing.T, a adapter) {
	n := chaostest.Size(60, 600)
	rounds := chaostest.Size(2, 5)
	begin := time.Now()
	sc := newScene(t, a, n, rounds+1, envShutdown+"="+stuckShutdown.String())
	rdb, sink, b, p := sc.rdb, sc.sink, sc.b, sc.p
	startChild := func(i int) *chaostest.Proc {
		t.Helper()
		return sc.startChild(t, "brokerstuck-"+a.name, i, envStuck)
	}

	b.publish(t, p.chunks[0])
	cur := startChild(0)
	var returns, takeovers []time.Duration
	for r := range rounds {
		line := cur.Expect("in handler ", startWait)
		var key string
		var fence int64
		if _, err := fmt.Sscanf(line, "in handler %s fence %d", &key, &fence); err != nil || key != p.crash[r] {
			t.Fatalf("child %d said %q, want in handler %s fence <n> (%v)", r, line, p.crash[r], err)
		}
		cur.Signal(syscall.SIGTERM)
		line = cur.Expect("run returned ", runReturnMax)
		var took time.Duration
		var runErr string
		if _, err := fmt.Sscanf(line, "run returned after %d ns, err %s", &took, &runErr); err != nil || runErr != "<nil>" {
			t.Fatalf("child %d said %q, want run returned after <ns> ns, err <nil> (%v)", r, line, err)
		}
		returns = append(returns, took)
		returned := time.Now()

		next := startChild(r + 1)
		st := awaitTakeover(t, sink, next, takeoverMax, key, 0)
		takeovers = append(takeovers, time.Since(returned))
		if st.Fence <= fence {
			t.Errorf("key %s: effect applied with fence %d, want above the stuck handler's %d", key, st.Fence, fence)
		}
		// Now the stuck handler returns, after its Run did: its write
		// carries its stale fence.
		cur.Signal(syscall.SIGUSR1)
		if line := cur.Expect("late return ", 30*time.Second); line != "late return applied false err <nil>" {
			t.Errorf("child %d said %q, want its late write refused by the fence (late return applied false err <nil>)", r, line)
		}
		if err := cur.Wait(30 * time.Second); err != nil {
			t.Errorf("child %d after its late return: %v; stderr:\n%s", r, err, cur.Stderr())
		}
		cur = next
		b.publish(t, p.chunks[r+1])
	}

	drain(t, rdb, b, cur, drainWait, len(p.keys), n)
	elapsed := time.Since(begin)
	v := judge(t, rdb, sink, b, p.keys, n)
	c, stale, runs, remaining, dead := &v.c, v.stale, v.runs, v.remaining, v.dead
	command := "make chaos RUN=TestStuckHandlerBroker/" + a.name
	if chaostest.Long() {
		command = "make chaos-long RUN=TestStuckHandlerBroker/" + a.name
	}
	chaostest.Report(t, "stuck handler at shutdown ("+a.name+")", command, c, map[string]string{
		"shutdown_timeout":    stuckShutdown.String(),
		"run_return_p50":      chaostest.Percentile(returns, 50).Round(time.Millisecond).String(),
		"run_return_max":      chaostest.Percentile(returns, 100).Round(time.Millisecond).String(),
		"takeover_p50":        chaostest.Percentile(takeovers, 50).Round(time.Millisecond).String(),
		"takeover_max":        chaostest.Percentile(takeovers, 100).Round(time.Millisecond).String(),
		"stuck_handlers":      strconv.Itoa(rounds),
		"late_writes_refused": strconv.FormatInt(stale, 10),
		"lease":               lease.String(),
		"messages":            strconv.Itoa(n),
		"keys":                strconv.Itoa(len(p.keys)),
		"dead_letters":        strconv.Itoa(dead),
		"elapsed":             elapsed.Round(time.Millisecond).String(),
	})
	t.Logf("Run returned after %v; takeovers after %v", returns, takeovers)
	if c.Lost.Load() != 0 || c.Duplicated.Load() != 0 {
		t.Errorf("got %d lost keys and %d duplicate effects, want 0 and 0", c.Lost.Load(), c.Duplicated.Load())
	}
	if stale != int64(rounds) {
		t.Errorf("got %d late writes refused by the fence, want %d (one per stuck handler)", stale, rounds)
	}
	if want := int64(len(p.keys) + rounds); runs != want {
		t.Errorf("got %d handler runs, want %d: one per key plus one per stuck handler", runs, want)
	}
	if remaining != 0 {
		t.Errorf("got %d messages not acknowledged after the last consumer stopped, want 0", remaining)
	}
	if dead != 0 {
		t.Errorf("got %d dead letters, want 0", dead)
	}
}

// runStuckChild is a consumer process of TestStuckHandlerBroker: it runs a
// with a handler that applies each key's effect to the fenced sink, except
// that the handler of the stuck key blocks, ignoring its context, until
// SIGUSR1, then writes its effect and returns. SIGTERM stops Run; the
// child says when Run returned, then waits for the stuck handler's late
// return and says what its write did.
func runStuckChild(role string, a *adapter) int {
	if a == nil {
		fmt.Fprintf(os.Stderr, "unknown role %q\n", role)
		return 2
	}
	shutdown, err := time.ParseDuration(os.Getenv(envShutdown))
	if err != nil {
		fmt.Fprintf(os.Stderr, "%s: %v\n", envShutdown, err)
		return 2
	}
	rdb := redis.NewClient(&redis.Options{Addr: os.Getenv(envRedis)})
	defer rdb.Close()
	sink := chaostest.NewRedisSink(rdb, sinkPrefix)
	stuck := os.Getenv(envStuck)
	release := make(chan os.Signal, 1)
	signal.Notify(release, syscall.SIGUSR1)
	late := make(chan string, 1)
	var hung atomic.Bool
	h := func(ctx context.Context, key string) error {
		fence, ok := idem.FenceFrom(ctx)
		if !ok {
			return errors.New("no fence in the handler's context")
		}
		if err := rdb.Incr(ctx, runsKey).Err(); err != nil {
			return err
		}
		if key != stuck || !hung.CompareAndSwap(false, true) {
			_, err := applyEffect(ctx, rdb, sink, key, fence)
			return err
		}
		chaostest.Say("in handler %s fence %d", key, fence)
		<-release // ignores ctx, as a call without a context does
		// Its own context is cancelled by now: the write uses another, as
		// a handler that ignores its context would.
		applied, err := applyEffect(context.Background(), rdb, sink, key, fence)
		late <- fmt.Sprintf("late return applied %t err %v", applied, err)
		return err
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM)
	defer stop()
	var stopped atomic.Int64
	context.AfterFunc(ctx, func() { stopped.Store(time.Now().UnixNano()) })
	run, err := a.start(rdb, h, consumer.WithShutdownTimeout(shutdown))
	if err != nil {
		fmt.Fprintf(os.Stderr, "%s: %v\n", os.Getenv(envName), err)
		return 1
	}
	chaostest.Say("ready")
	err = run(ctx)
	if ctx.Err() == nil {
		fmt.Fprintf(os.Stderr, "%s: Run: %v\n", os.Getenv(envName), err)
		return 1
	}
	chaostest.Say("run returned after %d ns, err %v", time.Now().UnixNano()-stopped.Load(), err)
	if hung.Load() {
		select {
		case line := <-late:
			chaostest.Say("%s", line)
		case <-time.After(2 * time.Minute):
			fmt.Fprintf(os.Stderr, "%s: the stuck handler was not released\n", os.Getenv(envName))
			return 1
		}
	}
	if err != nil {
		return 1
	}
	return 0
}
