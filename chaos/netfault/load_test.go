package netfault

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/idemgo/idem"
	"github.com/idemgo/idem/adapterkit"
	"github.com/idemgo/idem/chaos/chaostest"
	"github.com/idemgo/idem/redisstore"
	"github.com/idemgo/idem/storekit"
	"github.com/idemgo/idem/testkit/prooftest"
	"github.com/idemgo/idem/testkit/redistest"
	"github.com/redis/go-redis/v9"
	"github.com/redis/rueidis"
)

// clientTimeout is the clients' read and write timeout: short, so that a
// swallowed reply turns into an error quickly.
const clientTimeout = 300 * time.Millisecond

// lease is the Executor's lease in the load scenarios: short, so that a key
// whose owner vanished is taken over within the test.
const lease = time.Second

// client is one of the Redis client libraries the store runs on.
type client struct {
	name string
	// store returns a Store whose client connects to addr.
	store func(t *testing.T, addr string) *redisstore.Store
}

var clients = []client{
	{"go-redis", goRedisStore},
	{"rueidis", rueidisStore},
}

func goRedisStore(t *testing.T, addr string) *redisstore.Store {
	t.Helper()
	c := redis.NewClient(&redis.Options{
		Addr:         addr,
		DialTimeout:  clientTimeout,
		ReadTimeout:  clientTimeout,
		WriteTimeout: clientTimeout,
		PoolSize:     64,
	})
	return chaostest.GoRedisStore(t, c)
}

func rueidisStore(t *testing.T, addr string) *redisstore.Store {
	t.Helper()
	s, _ := chaostest.RueidisStore(t, rueidis.ClientOption{
		InitAddress:       []string{addr},
		DisableCache:      true,
		ForceSingleClient: true,
		ConnWriteTimeout:  clientTimeout,
		Dialer:            net.Dialer{Timeout: clientTimeout},
		// One pipeline connection, not 2^n picked at random per keyed
		// command and dialed on first use: rig.warmUp must leave the
		// connection that a fault then hits open, its handshake done.
		// Otherwise a call under a fault may need a new connection, whose
		// handshake the fault swallows, and never reach Redis.
		PipelineMultiplex: -1,
	})
	return s
}

// rig is a redis-server behind a toxiproxy proxy, with a store whose client
// goes through the proxy and one that connects directly (to inspect the
// records, unaffected by the faults).
type rig struct {
	redis  *redistest.Server
	proxy  *chaostest.NetProxy
	store  *redisstore.Store // through the proxy
	direct *redisstore.Store // straight to the server
}

func newRig(t *testing.T, c client) *rig {
	t.Helper()
	srv := redistest.Start(t)
	p := chaostest.StartNetProxy(t, srv.Addr())
	r := &rig{redis: srv, proxy: p, store: c.store(t, p.Addr()), direct: goRedisStore(t, srv.Addr())}
	r.warmUp(t)
	return r
}

// warmUp makes one Acquire and one Complete through the proxy, so that the
// client holds an open connection (its handshake done) and the server has
// the scripts cached: a fault injected next hits the call under test, not a
// connection handshake or the EVALSHA that would fall back to EVAL.
func (r *rig) warmUp(t *testing.T) {
	t.Helper()
	ctx := t.Context()
	key := idem.Key{Scope: "netfault", ID: "warm-up"}.Digest()
	a, err := r.store.Acquire(ctx, key, storekit.AcquireRequest{Fingerprint: "fp", Owner: "warm-up", Lease: time.Minute, Retention: time.Minute})
	if err != nil {
		t.Fatalf("warm-up Acquire through the proxy: %v", err)
	}
	if err := r.store.Complete(ctx, key, a.Lease, nil, time.Minute); err != nil {
		t.Fatalf("warm-up Complete through the proxy: %v", err)
	}
}

// load runs Executor.Do for keys × dups operations from workers goroutines
// and counts what happened. Every operation is retried (a new Do, so a new
// owner) until it is acknowledged: executed or replayed.
type load struct {
	keys, dups, workers int
	// deadline bounds the whole run; an operation not acknowledged by then
	// is counted as lost.
	deadline time.Duration

	counters *chaostest.Counters
	sink     *prooftest.Sink
	// retries counts the Do calls that returned an error and were repeated.
	retries atomic.Int64
	// busy counts the Do calls that found the key in progress elsewhere.
	busy atomic.Int64
	// wrongReplay counts acknowledged results that differ from the key's.
	wrongReplay atomic.Int64

	mu        sync.Mutex
	latencies []time.Duration // per acknowledged operation, retries included
	errSample map[string]int  // errors by kind, for the log
}

func keyName(i int) string { return fmt.Sprintf("order-%05d", i) }

// run drives the load against exec until every operation is acknowledged
// or the deadline passes, and returns the keys' store keys.
func (l *load) run(t *testing.T, exec *idem.Executor) []string {
	t.Helper()
	if l.counters == nil {
		l.counters = &chaostest.Counters{}
	}
	l.sink = prooftest.NewSink()
	l.errSample = map[string]int{}
	tasks := make(chan int, l.keys*l.dups)
	order := make([]int, 0, l.keys*l.dups)
	for k := range l.keys {
		for range l.dups {
			order = append(order, k)
		}
	}
	rand.Shuffle(len(order), func(i, j int) { order[i], order[j] = order[j], order[i] })
	for _, k := range order {
		tasks <- k
	}
	close(tasks)

	ctx, cancel := context.WithTimeout(t.Context(), l.deadline)
	defer cancel()
	var wg sync.WaitGroup
	for range l.workers {
		wg.Go(func() {
			for k := range tasks {
				l.one(ctx, exec, k)
			}
		})
	}
	wg.Wait()
	skeys := make([]string, l.keys)
	for k := range l.keys {
		skeys[k] = idem.Key{Scope: "netfault", ID: keyName(k)}.Digest()
	}
	return skeys
}

// one runs the operation on key k until it is acknowledged.
func (l *load) one(ctx context.Context, exec *idem.Executor, k int) {
	l.counters.Attempted.Add(1)
	name := keyName(k)
	key := idem.Key{Scope: "netfault", ID: name}
	want := "charged " + name
	fn := func(ctx context.Context) ([]byte, error) {
		fence, _ := idem.FenceFrom(ctx)
		l.sink.Run(name)
		l.counters.Executed.Add(1)
		if l.sink.Apply(name, fence) {
			l.counters.Effects.Add(1)
		}
		return []byte(want), nil
	}
	start := time.Now()
	for ctx.Err() == nil {
		cctx, cancel := context.WithTimeout(ctx, 3*time.Second)
		res, err := exec.Do(cctx, key, "fp", fn)
		cancel()
		if err == nil {
			l.counters.Acknowledged.Add(1)
			if string(res.Value) != want {
				l.wrongReplay.Add(1)
			}
			l.mu.Lock()
			l.latencies = append(l.latencies, time.Since(start))
			l.mu.Unlock()
			return
		}
		var busy *idem.InProgressError
		if errors.As(err, &busy) {
			l.busy.Add(1)
			// Another caller holds the key: come back when its lease may
			// have ended, or sooner, as it may complete first.
			wait(ctx, min(busy.RetryAfter, 50*time.Millisecond)+time.Millisecond)
			continue
		}
		l.retries.Add(1)
		l.mu.Lock()
		l.errSample[errKind(err)]++
		l.mu.Unlock()
		wait(ctx, time.Duration(5+rand.IntN(20))*time.Millisecond)
	}
}

// errKind names err's kind: the store call and the network error, without
// addresses.
func errKind(err error) string {
	msg := err.Error()
	call := "other"
	for _, c := range []string{"acquire", "complete", "fail", "release"} {
		if strings.HasPrefix(msg, "idem: "+c) {
			call = c
		}
	}
	var ne net.Error
	switch {
	case errors.Is(err, io.EOF):
		return call + ": EOF"
	case errors.Is(err, syscall.ECONNRESET):
		return call + ": connection reset"
	case errors.Is(err, syscall.ECONNREFUSED):
		return call + ": connection refused"
	case errors.Is(err, context.DeadlineExceeded):
		return call + ": deadline exceeded"
	case errors.As(err, &ne) && ne.Timeout():
		return call + ": i/o timeout"
	}
	return msg
}

// wait pauses the retry loop for d or until ctx is done.
func wait(ctx context.Context, d time.Duration) {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
	case <-ctx.Done():
	}
}

// check counts lost and duplicated effects, asserts exactly one execution
// and one effect per key and a COMPLETED record with the right result for
// every key, read from the store directly.
func (l *load) check(t *testing.T, exec *idem.Executor, direct idem.Store, skeys []string) {
	t.Helper()
	c := l.counters
	for k := range l.keys {
		name := keyName(k)
		applied := l.sink.Applied[name]
		if applied == 0 {
			c.Lost.Add(1)
		}
		if applied > 1 {
			c.Duplicated.Add(int64(applied - 1))
		}
		if n := l.sink.Executed[name]; n != 1 {
			t.Errorf("key %s: executed %d times, want 1", name, n)
		}
	}
	ctx := t.Context()
	notCompleted := 0
	for k, skey := range skeys {
		rec, err := direct.Get(ctx, skey)
		if err != nil || rec.State != storekit.StateCompleted {
			if notCompleted++; notCompleted <= 5 {
				t.Errorf("key %s: record %v, %v; want COMPLETED", keyName(k), rec.State, err)
			}
			continue
		}
		v, err := adapterkit.DecodeResult(exec, skey, rec.Result)
		if err != nil || string(v) != "charged "+keyName(k) {
			t.Errorf("key %s: stored result %q, %v", keyName(k), v, err)
		}
	}
	if notCompleted > 0 {
		t.Errorf("%d of %d keys not COMPLETED in the store", notCompleted, l.keys)
	}
	if got, want := c.Acknowledged.Load(), int64(l.keys*l.dups); got != want {
		t.Errorf("acknowledged %d operations, want %d (deadline %v)", got, want, l.deadline)
	}
	if n := c.Lost.Load(); n != 0 {
		t.Errorf("lost %d keys, want 0", n)
	}
	if n := c.Duplicated.Load(); n != 0 {
		t.Errorf("%d duplicate effects, want 0", n)
	}
	if n := c.Executed.Load(); n != int64(l.keys) {
		t.Errorf("executed %d times for %d keys, want exactly %d", n, l.keys, l.keys)
	}
	if n := l.wrongReplay.Load(); n != 0 {
		t.Errorf("%d operations acknowledged with another key's result", n)
	}
	if len(l.errSample) > 0 {
		t.Logf("errors seen and retried: %v", l.errSample)
	}
}

// figures returns the load's figures for the report.
func (l *load) figures(elapsed time.Duration) map[string]string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return map[string]string{
		"keys":          fmt.Sprint(l.keys),
		"dups_per_key":  fmt.Sprint(l.dups),
		"retried_errs":  fmt.Sprint(l.retries.Load()),
		"in_progress":   fmt.Sprint(l.busy.Load()),
		"stale_refused": fmt.Sprint(l.sink.Stale),
		"ack_p50":       chaostest.Percentile(l.latencies, 50).Round(time.Millisecond).String(),
		"ack_p99":       chaostest.Percentile(l.latencies, 99).Round(time.Millisecond).String(),
		"elapsed":       elapsed.Round(10 * time.Millisecond).String(),
	}
}

// merge adds the counters of b into a.
func merge(a, b *chaostest.Counters) {
	a.Attempted.Add(b.Attempted.Load())
	a.Acknowledged.Add(b.Acknowledged.Load())
	a.Executed.Add(b.Executed.Load())
	a.Effects.Add(b.Effects.Load())
	a.Lost.Add(b.Lost.Load())
	a.Duplicated.Add(b.Duplicated.Load())
}

// command returns the command that reproduces test at the current size.
func command(test string) string {
	if chaostest.Long() {
		return "make chaos-long RUN=" + test
	}
	return "make chaos RUN=" + test
}
