package redisstore_test

import (
	"context"
	"errors"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/idemgo/idem/redisstore"
	"github.com/idemgo/idem/storekit"
	"github.com/idemgo/idem/testkit/redistest"
	"github.com/redis/go-redis/v9"
	"github.com/redis/rueidis"
)

// gate holds the script calls that are not in a pipeline until opened,
// and records what the client sends: single calls and pipelines, with the
// keys of their EVALSHA and EVAL calls. Its go-redis hooks and its rueidis
// client (gatedRueidis) report to it.
type gate struct {
	roundTrips
	hold   chan struct{} // closed: commands go through
	held   chan struct{} // a command is held
	mu     sync.Mutex
	keys   []string // keys of every script call sent
	piped  int      // calls sent in pipelines of two or more
	single int      // script calls sent alone
	// script calls sent alone on a dedicated connection (rueidis's lone
	// calls)
	dedicated int
	// only, if set before the first call, holds the calls on these keys
	// alone; the others go through at once.
	only map[string]bool
}

func newGate() *gate { return &gate{hold: make(chan struct{}), held: make(chan struct{}, 100)} }

// scriptArgs returns the key of a script call's arguments (EVALSHA sha
// numkeys key …), and whether they are a script call's.
func scriptArgs(name string, args func(int) string) (string, bool) {
	switch strings.ToLower(name) {
	case "evalsha", "eval", "fcall", "fcall_ro":
		return args(3), true
	}
	return "", false
}

func scriptKey(cmd redis.Cmder) (string, bool) {
	return scriptArgs(cmd.Name(), func(i int) string { return cmd.Args()[i].(string) })
}

// sent records a script call sent alone, and holds it until the gate
// opens (if it is on a key of g.only, when that is set).
func (g *gate) sent(key string) {
	g.mu.Lock()
	g.keys = append(g.keys, key)
	g.single++
	g.mu.Unlock()
	if g.only != nil && !g.only[key] {
		return
	}
	select {
	case <-g.hold:
	default:
		g.held <- struct{}{}
		<-g.hold
	}
}

// sentPipeline records the script calls of a pipeline of n commands.
func (g *gate) sentPipeline(keys []string, n int) {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.keys = append(g.keys, keys...)
	if n > 1 {
		g.piped += len(keys)
	}
}

func (g *gate) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		if k, ok := scriptKey(cmd); ok {
			g.sent(k)
		}
		return next(ctx, cmd)
	}
}

func (g *gate) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		var keys []string
		for _, c := range cmds {
			if k, ok := scriptKey(c); ok {
				keys = append(keys, k)
			}
		}
		g.sentPipeline(keys, len(cmds))
		return next(ctx, cmds)
	}
}

// gatedRueidis is a rueidis client whose Do and DoMulti report to g.
type gatedRueidis struct {
	rueidis.Client
	g *gate
}

func rueidisScriptKey(cmd rueidis.Completed) (string, bool) {
	args := cmd.Commands()
	return scriptArgs(args[0], func(i int) string { return args[i] })
}

func (c gatedRueidis) Do(ctx context.Context, cmd rueidis.Completed) rueidis.RedisResult {
	if k, ok := rueidisScriptKey(cmd); ok {
		c.g.sent(k)
	}
	return c.Client.Do(ctx, cmd)
}

// Dedicate returns a dedicated connection whose Do reports to g too: the
// store sends a lone call on one.
func (c gatedRueidis) Dedicate() (rueidis.DedicatedClient, func()) {
	dc, release := c.Client.Dedicate()
	return gatedDedicated{dc, c.g}, release
}

type gatedDedicated struct {
	rueidis.DedicatedClient
	g *gate
}

func (c gatedDedicated) Do(ctx context.Context, cmd rueidis.Completed) rueidis.RedisResult {
	if k, ok := rueidisScriptKey(cmd); ok {
		c.g.mu.Lock()
		c.g.dedicated++
		c.g.mu.Unlock()
		c.g.sent(k)
	}
	return c.DedicatedClient.Do(ctx, cmd)
}

func (c gatedRueidis) DoMulti(ctx context.Context, cmds ...rueidis.Completed) []rueidis.RedisResult {
	var keys []string
	for _, cmd := range cmds {
		if k, ok := rueidisScriptKey(cmd); ok {
			keys = append(keys, k)
		}
	}
	c.g.sentPipeline(keys, len(cmds))
	return c.Client.DoMulti(ctx, cmds...)
}

func acquireKey(ctx context.Context, s *redisstore.Store, i int) (storekit.Acquisition, error) {
	return s.Acquire(ctx, "k"+strconv.Itoa(i), storekit.AcquireRequest{Fingerprint: "fp", Owner: "o" + strconv.Itoa(i), Lease: time.Minute, Retention: time.Hour})
}

// acquireEach acquires the keys from to to-1, each on a goroutine of wg,
// and sends to errs what did not acquire.
func acquireEach(ctx context.Context, s *redisstore.Store, wg *sync.WaitGroup, errs chan<- error, from, to int) {
	for i := from; i < to; i++ {
		wg.Go(func() {
			if a, err := acquireKey(ctx, s, i); err != nil || a.Outcome != storekit.Acquired {
				errs <- errors.Join(err, errors.New("acquire "+strconv.Itoa(i)+": "+a.Outcome.String()))
			}
		})
	}
}

// gatedStore returns a store of the named client ("go-redis" or
// "rueidis"), without a replay cache, on a new server, its client's
// commands passing through g; flush flushes the server's scripts.
func gatedStore(t *testing.T, client string) (s *redisstore.Store, flush func(), g *gate) {
	t.Helper()
	srv := redistest.Start(t)
	g = newGate()
	var err error
	if client == "rueidis" {
		s, err = redisstore.NewRueidis(gatedRueidis{srv.Rueidis(t), g}, redisstore.WithReplayCache(false))
	} else {
		c := goRedisClient(t, srv.Addr())
		c.AddHook(g)
		s, err = redisstore.New(c, redisstore.WithReplayCache(false))
	}
	if err != nil {
		t.Fatal(err)
	}
	return s, func() { srv.Do(t, "SCRIPT", "FLUSH") }, g
}

// eachGatedClient runs f as a subtest per client.
func eachGatedClient(t *testing.T, f func(t *testing.T, client string)) {
	for _, client := range []string{"go-redis", "rueidis"} {
		t.Run(client, func(t *testing.T) { f(t, client) })
	}
}

// TestCoalescedCalls: with either client, calls made while the store's
// senders are busy go out together in one pipeline, after the scripts were flushed
// from the server too (NOSCRIPT, then EVAL); a lone caller's calls go out
// alone (with rueidis, on a dedicated connection); a queued call whose
// context ended is not sent.
func TestCoalescedCalls(t *testing.T) {
	redisstore.SetMaxQueueWait(t, time.Hour) // queued calls wait for the held ones
	eachGatedClient(t, testCoalescedCalls)
}

func testCoalescedCalls(t *testing.T, client string) {
	s, flush, g := gatedStore(t, client)
	ctx := t.Context()
	flush()
	// Two reads (another script than the acquires below, which their EVAL
	// after NOSCRIPT does not load) take the two senders and are held;
	// 20 acquires queue.
	var wg sync.WaitGroup
	errs := make(chan error, 30)
	for i := range 2 {
		wg.Go(func() {
			if _, err := s.Get(ctx, "k"+strconv.Itoa(i)); err != nil && !errors.Is(err, storekit.ErrNotFound) {
				errs <- err
			}
		})
		<-g.held
	}
	cancelled, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { _, err := acquireKey(cancelled, s, 99); done <- err }()
	acquireEach(ctx, s, &wg, errs, 2, 22)
	waitFor(t, "21 calls queued", func() bool { return redisstore.Queued(s) == 21 })
	cancel()
	if err := <-done; !errors.Is(err, context.Canceled) {
		t.Fatalf("the cancelled queued call: got %v, want context.Canceled", err)
	}
	close(g.hold)
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	g.mu.Lock()
	piped, keys := g.piped, g.keys
	g.mu.Unlock()
	if piped < 20 {
		t.Fatalf("%d calls went in pipelines of two or more, want the 20 queued ones (and their EVAL after NOSCRIPT)", piped)
	}
	for _, k := range keys {
		if k == s.Key("k99") {
			t.Fatal("the queued call whose context ended was sent")
		}
	}
	// A lone caller: every call alone, and with rueidis on a dedicated
	// connection, which the caller writes and reads itself: on the shared
	// one, rueidis hands each call to a writer and a reader goroutine
	// (about 100 µs of a new key's p50 through idemhttp at one connection).
	g.mu.Lock()
	g.piped, g.single, g.dedicated = 0, 0, 0
	g.mu.Unlock()
	for i := 100; i < 110; i++ {
		if a, err := acquireKey(ctx, s, i); err != nil || a.Outcome != storekit.Acquired {
			t.Fatalf("lone acquire: %v, %v", a.Outcome, err)
		}
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.piped != 0 || g.single != 10 {
		t.Fatalf("a lone caller's 10 calls: %d alone, %d in pipelines; want 10 alone", g.single, g.piped)
	}
	if want := map[string]int{"rueidis": 10}[client]; g.dedicated != want {
		t.Fatalf("a lone caller's 10 calls: %d on a dedicated connection, want %d", g.dedicated, want)
	}
}

// TestQueuedCallsDoNotWaitForSlowOnes: when the calls in flight are slow
// (held here, as on a slow network), the queued calls are sent after
// maxQueueWait instead of a whole round trip of the slow ones later.
func TestQueuedCallsDoNotWaitForSlowOnes(t *testing.T) {
	redisstore.SetMaxQueueWait(t, time.Millisecond)
	eachGatedClient(t, testQueuedCallsDoNotWaitForSlowOnes)
}

func testQueuedCallsDoNotWaitForSlowOnes(t *testing.T, client string) {
	s, _, g := gatedStore(t, client)
	// Only the two slow calls are held. A queue sent late may hold a
	// single call, sent alone, when its callers come more than
	// maxQueueWait apart (a loaded machine): held too, it never returned.
	g.only = map[string]bool{s.Key("k0"): true, s.Key("k1"): true}
	ctx := t.Context()
	var held sync.WaitGroup
	for i := range 2 {
		held.Go(func() { _, _ = s.Get(ctx, "k"+strconv.Itoa(i)) })
		<-g.held
	}
	defer func() { close(g.hold); held.Wait() }()
	var wg sync.WaitGroup
	errs := make(chan error, 20)
	acquireEach(ctx, s, &wg, errs, 2, 22)
	done := make(chan struct{})
	go func() { wg.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		t.Fatal("the queued calls waited for the held ones")
	}
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
}

// TestQueuedCallsGetTheirOwnReplies: under many concurrent callers, some
// of whose contexts end while their calls are queued or in flight, every
// call that returns a record returns its own key's: a queued call is its
// caller's alone until its sender has set the reply (a call handed to a
// new caller once its first one left, as a pool of calls might, panics
// here or returns another key's record).
func TestQueuedCallsGetTheirOwnReplies(t *testing.T) {
	eachGatedClient(t, testQueuedCallsGetTheirOwnReplies)
}

func testQueuedCallsGetTheirOwnReplies(t *testing.T, client string) {
	s, _, g := gatedStore(t, client)
	close(g.hold)
	ctx := t.Context()
	const keys = 200
	for i := range keys {
		a, err := acquireKey(ctx, s, i)
		if err != nil || a.Outcome != storekit.Acquired {
			t.Fatalf("acquire %d: %v, %v", i, a.Outcome, err)
		}
		if err := s.Complete(ctx, "k"+strconv.Itoa(i), a.Lease, []byte("result "+strconv.Itoa(i)), time.Hour); err != nil {
			t.Fatal(err)
		}
	}
	var wg sync.WaitGroup
	var mu sync.Mutex
	var got, ended int
	for g := range 64 {
		wg.Go(func() {
			for n := range 200 {
				i := (g*200 + n*7) % keys
				// One in five contexts has ended before its call, three end
				// after 100, 200 or 300 µs, one does not end.
				cctx, cancel := context.WithCancel(ctx)
				if d := n % 5; d < 4 {
					cctx, cancel = context.WithTimeout(ctx, time.Duration(d)*100*time.Microsecond)
				}
				rec, err := s.Get(cctx, "k"+strconv.Itoa(i))
				cancel()
				mu.Lock()
				switch {
				case err == nil:
					got++
					if want := "result " + strconv.Itoa(i); string(rec.Result) != want {
						t.Errorf("Get k%d returned %q, want %q", i, rec.Result, want)
					}
				case errors.Is(err, context.DeadlineExceeded) || errors.Is(err, context.Canceled):
					ended++
				default:
					t.Errorf("Get k%d: %v", i, err)
				}
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	t.Logf("%d replies, %d calls whose context ended", got, ended)
	if got == 0 || ended == 0 {
		t.Fatalf("%d replies and %d ended calls: the test needs both", got, ended)
	}
}
