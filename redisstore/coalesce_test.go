package redisstore_test

import (
	"context"
	"errors"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/idemgo/idem"
	"github.com/idemgo/idem/internal/redistest"
	"github.com/idemgo/idem/redisstore"
	"github.com/redis/go-redis/v9"
)

// gate holds the go-redis commands that are not in a pipeline until
// opened, and records what the client sends: single commands and
// pipelines, with the keys of their EVALSHA and EVAL calls.
type gate struct {
	roundTrips
	hold   chan struct{} // closed: commands go through
	held   chan struct{} // a command is held
	mu     sync.Mutex
	keys   []string // keys of every script call sent
	piped  int      // calls sent in pipelines of two or more
	single int      // script calls sent alone
}

func newGate() *gate { return &gate{hold: make(chan struct{}), held: make(chan struct{}, 100)} }

func scriptKey(cmd redis.Cmder) (string, bool) {
	switch cmd.Name() {
	case "evalsha", "eval", "fcall", "fcall_ro":
		return cmd.Args()[3].(string), true
	}
	return "", false
}

func (g *gate) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		if k, ok := scriptKey(cmd); ok {
			g.mu.Lock()
			g.keys = append(g.keys, k)
			g.single++
			g.mu.Unlock()
			select {
			case <-g.hold:
			default:
				g.held <- struct{}{}
				<-g.hold
			}
		}
		return next(ctx, cmd)
	}
}

func (g *gate) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		g.mu.Lock()
		for _, c := range cmds {
			if k, ok := scriptKey(c); ok {
				g.keys = append(g.keys, k)
				if len(cmds) > 1 {
					g.piped++
				}
			}
		}
		g.mu.Unlock()
		return next(ctx, cmds)
	}
}

func acquireKey(ctx context.Context, s *redisstore.Store, i int) (idem.Acquisition, error) {
	return s.Acquire(ctx, "k"+strconv.Itoa(i), idem.AcquireRequest{Fingerprint: "fp", Owner: "o" + strconv.Itoa(i), Lease: time.Minute, Retention: time.Hour})
}

// acquireEach acquires the keys from to to-1, each on a goroutine of wg,
// and sends to errs what did not acquire.
func acquireEach(ctx context.Context, s *redisstore.Store, wg *sync.WaitGroup, errs chan<- error, from, to int) {
	for i := from; i < to; i++ {
		wg.Go(func() {
			if a, err := acquireKey(ctx, s, i); err != nil || a.Outcome != idem.Acquired {
				errs <- errors.Join(err, errors.New("acquire "+strconv.Itoa(i)+": "+a.Outcome.String()))
			}
		})
	}
}

// gatedStore returns a go-redis store, without a replay cache, on a new
// server, its client's commands passing through g.
func gatedStore(t *testing.T) (s *redisstore.Store, c *redis.Client, g *gate) {
	t.Helper()
	srv := redistest.Start(t)
	c = goRedisClient(t, srv.Addr())
	g = newGate()
	c.AddHook(g)
	s, err := redisstore.New(c, redisstore.WithReplayCache(false))
	if err != nil {
		t.Fatal(err)
	}
	return s, c, g
}

// TestCoalescedCalls: with go-redis, calls made while the store's senders
// are busy go out together in one pipeline, after the scripts were flushed
// from the server too (NOSCRIPT, then EVAL); a lone caller's calls go out
// alone; a queued call whose context ended is not sent.
func TestCoalescedCalls(t *testing.T) {
	redisstore.SetMaxQueueWait(t, time.Hour) // queued calls wait for the held ones
	s, c, g := gatedStore(t)
	ctx := t.Context()
	if err := c.ScriptFlush(ctx).Err(); err != nil {
		t.Fatal(err)
	}
	// Two reads (another script than the acquires below, which their EVAL
	// after NOSCRIPT does not load) take the two senders and are held;
	// 20 acquires queue.
	var wg sync.WaitGroup
	errs := make(chan error, 30)
	for i := range 2 {
		wg.Go(func() {
			if _, err := s.Get(ctx, "k"+strconv.Itoa(i)); err != nil && !errors.Is(err, idem.ErrNotFound) {
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
	// A lone caller: every call alone.
	g.mu.Lock()
	g.piped, g.single = 0, 0
	g.mu.Unlock()
	for i := 100; i < 110; i++ {
		if a, err := acquireKey(ctx, s, i); err != nil || a.Outcome != idem.Acquired {
			t.Fatalf("lone acquire: %v, %v", a.Outcome, err)
		}
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.piped != 0 || g.single != 10 {
		t.Fatalf("a lone caller's 10 calls: %d alone, %d in pipelines; want 10 alone", g.single, g.piped)
	}
}

// TestQueuedCallsDoNotWaitForSlowOnes: when the calls in flight are slow
// (held here, as on a slow network), the queued calls are sent after
// maxQueueWait instead of a whole round trip of the slow ones later.
func TestQueuedCallsDoNotWaitForSlowOnes(t *testing.T) {
	redisstore.SetMaxQueueWait(t, time.Millisecond)
	s, _, g := gatedStore(t)
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
	srv := redistest.Start(t)
	s, err := redisstore.New(goRedisClient(t, srv.Addr()), redisstore.WithReplayCache(false))
	if err != nil {
		t.Fatal(err)
	}
	ctx := t.Context()
	const keys = 200
	for i := range keys {
		a, err := acquireKey(ctx, s, i)
		if err != nil || a.Outcome != idem.Acquired {
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
