package redisstream

import (
	"context"
	"crypto/aes"
	"crypto/cipher"
	"errors"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idemgo/idem"
	"github.com/idemgo/idem/adapterkit"
	"github.com/idemgo/idem/consumer"
	"github.com/idemgo/idem/redisstore"
	"github.com/idemgo/idem/storekit"
	"github.com/idemgo/idem/testkit/redistest"
	"github.com/redis/go-redis/v9"
)

// env is one consumer on a real Redis, with a client for the test's own
// commands.
type env struct {
	t      *testing.T
	rdb    redis.UniversalClient
	store  *redisstore.Store
	exec   *idem.Executor
	stream string
	group  string
	lease  time.Duration
}

func newEnv(t *testing.T, rdb redis.UniversalClient, tag string, lease time.Duration) *env {
	t.Helper()
	var opts []redisstore.Option
	stream := "orders"
	if tag != "" {
		opts = append(opts, redisstore.WithHashTag(tag))
		stream = "{" + tag + "}:orders"
	}
	store, err := redisstore.New(rdb, opts...)
	if err != nil {
		t.Fatal(err)
	}
	exec, err := idem.New(store, idem.WithLease(lease), idem.WithRetention(time.Hour))
	if err != nil {
		t.Fatal(err)
	}
	return &env{t: t, rdb: rdb, store: store, exec: exec, stream: stream, group: "g", lease: lease}
}

func standalone(t *testing.T) redis.UniversalClient {
	t.Helper()
	return redistest.Start(t).GoRedis(t)
}

func (e *env) consumer(name string, opts ...Option) *Consumer {
	e.t.Helper()
	return e.consumerOn(name, nil, opts...)
}

// consumerOn is consumer with more options for its executor.
func (e *env) consumerOn(name string, execOpts []idem.Option, opts ...Option) *Consumer {
	e.t.Helper()
	opts = append([]Option{WithBlock(20 * time.Millisecond)}, opts...)
	exec := executorOn(e.store, append([]idem.Option{idem.WithLease(e.lease), idem.WithRetention(time.Hour)}, execOpts...)...)
	c, err := New(e.rdb, e.stream, e.group, name, exec, nopHandler, opts...)
	if err != nil {
		e.t.Fatal(err)
	}
	return c
}

func (e *env) add(values ...any) string {
	e.t.Helper()
	id, err := e.rdb.XAdd(e.t.Context(), &redis.XAddArgs{Stream: e.stream, Values: values}).Result()
	if err != nil {
		e.t.Fatal(err)
	}
	return id
}

// run runs c until cond holds (checked every 10ms, at most 10s), then stops
// it and returns Run's error.
func (e *env) run(c *Consumer, h Handler, cond func() bool) error {
	e.t.Helper()
	ctx, cancel := context.WithCancel(e.t.Context())
	done := make(chan error, 1)
	go func() { done <- runWith(ctx, c, h) }()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			cancel()
			<-done
			e.t.Fatalf("condition not met in time; stats %+v", c.Stats())
		}
		time.Sleep(10 * time.Millisecond)
	}
	cancel()
	return <-done
}

func (e *env) pending() int64 {
	p, err := e.rdb.XPending(e.t.Context(), e.stream, e.group).Result()
	if err != nil {
		e.t.Fatal(err)
	}
	return p.Count
}

func (e *env) dlq() []redis.XMessage {
	msgs, err := e.rdb.XRange(e.t.Context(), e.stream+":dlq", "-", "+").Result()
	if err != nil {
		e.t.Fatal(err)
	}
	return msgs
}

func TestProcessReplayAndNoKey(t *testing.T) {
	e := newEnv(t, standalone(t), "", time.Second)
	e.add("key", "a", "n", "1")
	e.add("key", "b")
	e.add("key", "a", "n", "2") // duplicate
	e.add("body", "no key here")
	var mu sync.Mutex
	seen := map[string]int{}
	c := e.consumer("c1")
	err := e.run(c, func(ctx context.Context, m redis.XMessage) error {
		if _, ok := idem.FenceFrom(ctx); !ok {
			t.Error("no fence in the handler's context")
		}
		mu.Lock()
		seen[m.Values["key"].(string)]++
		mu.Unlock()
		return nil
	}, func() bool { s := c.Stats(); return s.Processed+s.Replayed+s.DeadLettered == 4 })
	if err != nil {
		t.Fatal(err)
	}
	if seen["a"] != 1 || seen["b"] != 1 {
		t.Errorf("handler runs %v, want a:1 b:1", seen)
	}
	want := consumer.Stats{Processed: 2, Replayed: 1, DeadLettered: 1, Invalid: 1}
	if got := c.Stats(); got != want {
		t.Errorf("stats %+v, want %+v", got, want)
	}
	if p := e.pending(); p != 0 {
		t.Errorf("pending %d, want 0", p)
	}
	d := e.dlq()
	if len(d) != 1 || !strings.Contains(d[0].Values["dlq-error"].(string), "no idempotency key") || d[0].Values["body"] != "no key here" {
		t.Errorf("dead-letter stream %v, want the keyless entry with its error", d)
	}
}

// TestDuplicateInNextBatchIsReplayed: a batch's completion overlaps the
// next batch, but a duplicate in the next batch still finds its key
// completed (a replay), not in progress (a retry).
func TestDuplicateInNextBatchIsReplayed(t *testing.T) {
	e := newEnv(t, standalone(t), "", 10*time.Second)
	const batch, batches = 10, 20
	for b := range batches {
		for j := range batch {
			e.add("key", "k"+strconv.Itoa(b/2*batch+j)) // batch 2m+1 repeats batch 2m
		}
	}
	var mu sync.Mutex
	seen := map[string]int{}
	c := e.consumer("c1", consumer.WithBatchSize(batch))
	err := e.run(c, func(ctx context.Context, m redis.XMessage) error {
		mu.Lock()
		seen[m.Values["key"].(string)]++
		mu.Unlock()
		return nil
	}, func() bool { s := c.Stats(); return s.Processed+s.Replayed+s.Retried >= batch*batches })
	if err != nil {
		t.Fatal(err)
	}
	want := consumer.Stats{Processed: batch * batches / 2, Replayed: batch * batches / 2}
	if got := c.Stats(); got != want {
		t.Errorf("stats %+v, want %+v", got, want)
	}
	for k, n := range seen {
		if n != 1 {
			t.Errorf("key %s handled %d times", k, n)
		}
	}
	if p := e.pending(); p != 0 {
		t.Errorf("pending %d, want 0", p)
	}
}

func TestRetryThenDeadLetter(t *testing.T) {
	// The lease outlasts a stalled scheduler: with 30ms, a lease lost
	// before the handler started (two busy processes on the two cores)
	// made a delivery retry without a run, 8 failures in 60.
	e := newEnv(t, standalone(t), "", time.Second)
	e.add("key", "bad")
	var runs atomic.Int32
	c := e.consumer("c1", consumer.WithMaxDeliveries(3), WithClaimIdle(30*time.Millisecond))
	err := e.run(c, func(ctx context.Context, m redis.XMessage) error {
		runs.Add(1)
		return errors.New("downstream refused")
	}, func() bool { return c.Stats().DeadLettered == 1 })
	if err != nil {
		t.Fatal(err)
	}
	if got := runs.Load(); got != 3 {
		t.Errorf("handler ran %d times, want 3 (max deliveries)", got)
	}
	s := c.Stats()
	if s.Retried != 2 || s.Redelivered != 2 {
		t.Errorf("stats %+v, want 2 retries and 2 claims", s)
	}
	d := e.dlq()
	if len(d) != 1 || d[0].Values["dlq-deliveries"] != "3" || !strings.Contains(d[0].Values["dlq-error"].(string), "downstream refused") {
		t.Errorf("dead-letter stream %v", d)
	}
	rec, err := e.store.Get(t.Context(), idem.Key{Scope: e.stream, ID: "bad"}.Digest())
	if err != nil || rec.State != storekit.StateFailed {
		t.Errorf("record %v %v, want FAILED", rec.State, err)
	}
	// A later duplicate of the failed key is dead-lettered without a run.
	e.add("key", "bad")
	if err := e.run(c, func(context.Context, redis.XMessage) error { runs.Add(1); return nil },
		func() bool { return c.Stats().DeadLettered == 2 }); err != nil {
		t.Fatal(err)
	}
	if got := runs.Load(); got != 3 {
		t.Errorf("handler ran %d times, want still 3", got)
	}
	if p := e.pending(); p != 0 {
		t.Errorf("pending %d, want 0", p)
	}
}

func TestTerminalErrorDeadLettersAtOnce(t *testing.T) {
	e := newEnv(t, standalone(t), "", time.Second)
	e.add("key", "x")
	c := e.consumer("c1")
	if err := e.run(c, func(context.Context, redis.XMessage) error {
		return idem.Terminal(errors.New("invalid order"))
	}, func() bool { return c.Stats().DeadLettered == 1 }); err != nil {
		t.Fatal(err)
	}
	if n := len(e.dlq()); n != 1 {
		t.Errorf("dead-letter stream has %d entries, want 1", n)
	}
}

// TestInProgressDuplicateIsNotAcked holds a key with another owner: the
// entry stays pending, unacknowledged, until the key is completed; then it
// is claimed and replayed.
func TestInProgressDuplicateIsNotAcked(t *testing.T) {
	e := newEnv(t, standalone(t), "", 200*time.Millisecond)
	_, other, err := e.exec.Begin(t.Context(), idem.Key{Scope: e.stream, ID: "k"}, "")
	if err != nil {
		t.Fatal(err)
	}
	e.add("key", "k")
	var runs atomic.Int32
	c := e.consumer("c1", WithClaimIdle(30*time.Millisecond))
	h := func(context.Context, redis.XMessage) error { runs.Add(1); return nil }
	if err := e.run(c, h, func() bool { return c.Stats().Retried >= 2 }); err != nil {
		t.Fatal(err)
	}
	if p := e.pending(); p != 1 {
		t.Fatalf("pending %d while the key is held elsewhere, want 1", p)
	}
	if err := other.Commit(t.Context(), nil); err != nil {
		t.Fatal(err)
	}
	if err := e.run(c, h, func() bool { return c.Stats().Replayed == 1 }); err != nil {
		t.Fatal(err)
	}
	if runs.Load() != 0 || e.pending() != 0 {
		t.Errorf("runs %d, pending %d; want 0 and 0", runs.Load(), e.pending())
	}
}

// TestLongHandlerKeepsEntry runs a handler for several claim idle times:
// the lease heartbeat and the XCLAIM touch keep a second consumer from
// claiming the entry, and it is processed once.
func TestLongHandlerKeepsEntry(t *testing.T) {
	// Generous margins: ticks every third of 400ms on a loaded machine.
	e := newEnv(t, standalone(t), "", 400*time.Millisecond)
	e.add("key", "slow")
	var runs atomic.Int32
	h := func(ctx context.Context, m redis.XMessage) error {
		runs.Add(1)
		select {
		case <-time.After(1500 * time.Millisecond):
			return nil
		case <-ctx.Done():
			return context.Cause(ctx)
		}
	}
	c1 := e.consumer("c1")
	c2 := e.consumer("c2")
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	go runWith(ctx, c2, h) //nolint:errcheck // stopped by cancel
	if err := e.run(c1, h, func() bool { return c1.Stats().Processed+c2.Stats().Processed == 1 }); err != nil {
		t.Fatal(err)
	}
	if got := runs.Load(); got != 1 {
		t.Errorf("handler ran %d times, want 1", got)
	}
	if s := c2.Stats(); s.Redelivered != 0 {
		t.Errorf("second consumer claimed %d entries, want 0", s.Redelivered)
	}
}

// slowDeadLetter is a go-redis hook that holds the first dead-letter
// script call (a command naming dlq) until an XAUTOCLAIM has returned the
// entry id, or a second has passed: the tail of a batch outlasting the
// claim idle time.
type slowDeadLetter struct {
	dlq, id string
	held    atomic.Bool
	claimed chan struct{} // closed when an XAUTOCLAIM returned id
	once    sync.Once
	calls   atomic.Int32 // dead-letter calls that returned
}

func (h *slowDeadLetter) names(cmd redis.Cmder) (dl, claim bool) {
	for _, a := range cmd.Args() {
		if s, ok := a.(string); ok && s == h.dlq {
			dl = true
		}
	}
	return dl, cmd.Name() == "xautoclaim"
}

func (h *slowDeadLetter) hold() {
	if h.held.CompareAndSwap(false, true) {
		select {
		case <-h.claimed:
		case <-time.After(time.Second):
		}
	}
}

func (h *slowDeadLetter) DialHook(next redis.DialHook) redis.DialHook { return next }

func (h *slowDeadLetter) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		dl, claim := h.names(cmd)
		if dl {
			h.hold()
			defer h.calls.Add(1)
		}
		err := next(ctx, cmd)
		if c, ok := cmd.(*redis.XAutoClaimCmd); ok && claim {
			if msgs, _ := c.Val(); slicesContainID(msgs, h.id) {
				h.once.Do(func() { close(h.claimed) })
			}
		}
		return err
	}
}

func (h *slowDeadLetter) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		for _, cmd := range cmds {
			if dl, _ := h.names(cmd); dl {
				h.hold()
				defer h.calls.Add(1)
				break
			}
		}
		return next(ctx, cmds)
	}
}

func slicesContainID(msgs []redis.XMessage, id string) bool {
	for _, m := range msgs {
		if m.ID == id {
			return true
		}
	}
	return false
}

// TestSlowTailNotClaimedBack holds a batch's dead letter (its tail, which
// runs while the next batch is read) past the claim idle time: the loop's
// next XAUTOCLAIM must not take the entry back and dead-letter it a second
// time. Before the claim waited for the tail, the entry came back with a
// delivery count of 2 and was counted invalid twice (the conformance
// suite's InvalidDeadLetteredAtOnce failed so under load).
func TestSlowTailNotClaimedBack(t *testing.T) {
	rdb := standalone(t)
	e := newEnv(t, rdb, "", time.Second)
	id := e.add("body", "no key")
	hook := &slowDeadLetter{dlq: e.stream + ":dlq", id: id, claimed: make(chan struct{})}
	rdb.AddHook(hook)
	c := e.consumer("c1", WithClaimIdle(30*time.Millisecond))
	err := e.run(c, nopHandler, func() bool {
		return hook.calls.Load() >= 1 && e.pending() == 0
	})
	if err != nil {
		t.Fatal(err)
	}
	if st := c.Stats(); st.Invalid != 1 || st.DeadLettered != 1 {
		t.Errorf("stats %+v: the entry was dead-lettered %d times, want once", st, st.DeadLettered)
	}
	if n := len(e.dlq()); n != 1 {
		t.Errorf("%d dead letters, want 1", n)
	}
}

// TestLeaseLostIsNotAcked deletes the record while the handler runs (as a
// takeover would): the handler's context is cancelled, the entry is not
// acknowledged.
func TestLeaseLostIsNotAcked(t *testing.T) {
	e := newEnv(t, standalone(t), "", 60*time.Millisecond)
	e.add("key", "k")
	var cause atomic.Value
	c := e.consumer("c1", WithClaimIdle(time.Minute))
	err := e.run(c, func(ctx context.Context, m redis.XMessage) error {
		if err := e.store.Delete(ctx, idem.Key{Scope: e.stream, ID: "k"}.Digest()); err != nil {
			return err
		}
		<-ctx.Done()
		cause.Store(context.Cause(ctx))
		return nil // even a nil error must not lead to an ack
	}, func() bool { return c.Stats().Retried == 1 })
	if err != nil {
		t.Fatal(err)
	}
	if err, _ := cause.Load().(error); !errors.Is(err, idem.ErrLeaseLost) {
		t.Errorf("handler context cause %v, want ErrLeaseLost", err)
	}
	if p := e.pending(); p != 1 {
		t.Errorf("pending %d, want 1", p)
	}
}

// TestShutdownReleasesInFlight cancels Run while a handler blocks: after
// the shutdown timeout the handler's context is cancelled, the key is
// released and the entry stays pending for another consumer.
func TestShutdownReleasesInFlight(t *testing.T) {
	e := newEnv(t, standalone(t), "", time.Second)
	e.add("key", "k")
	started := make(chan struct{})
	c := e.consumer("c1", consumer.WithShutdownTimeout(50*time.Millisecond))
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan error, 1)
	go func() {
		done <- runWith(ctx, c, func(ctx context.Context, m redis.XMessage) error {
			close(started)
			<-ctx.Done()
			return ctx.Err()
		})
	}()
	<-started
	cancel()
	select {
	case err := <-done:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("Run did not return after the shutdown timeout")
	}
	rec, err := e.store.Get(t.Context(), idem.Key{Scope: e.stream, ID: "k"}.Digest())
	if err != nil || rec.State != storekit.StateReleased {
		t.Errorf("record %v %v, want RELEASED", rec.State, err)
	}
	if p := e.pending(); p != 1 {
		t.Errorf("pending %d, want 1", p)
	}
}

func TestCluster(t *testing.T) {
	cl := redistest.StartCluster(t, 3)
	rdb := redis.NewClusterClient(&redis.ClusterOptions{Addrs: cl.Addrs()})
	t.Cleanup(func() { rdb.Close() })

	// Without a hash tag the consumer refuses to start.
	plain := newEnv(t, rdb, "", time.Second)
	if _, err := New(rdb, "orders", "g", "c", executorOn(plain.store), nopHandler); !errors.Is(err, idem.ErrInvalid) {
		t.Errorf("New on a Cluster without hash tag: %v, want ErrInvalid", err)
	}

	e := newEnv(t, rdb, "orders", 500*time.Millisecond)
	for _, k := range []string{"a", "b", "a", "c", "b"} {
		e.add("key", k)
	}
	e.add("x", "no key")
	var runs atomic.Int32
	c1 := e.consumer("c1", consumer.WithBatchSize(3))
	c2 := e.consumer("c2", consumer.WithBatchSize(3))
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	go runWith(ctx, c2, func(context.Context, redis.XMessage) error { runs.Add(1); return nil }) //nolint:errcheck
	done := func() bool {
		s1, s2 := c1.Stats(), c2.Stats()
		return s1.Processed+s2.Processed == 3 && s1.Replayed+s2.Replayed == 2 && s1.DeadLettered+s2.DeadLettered == 1 && e.pending() == 0
	}
	if err := e.run(c1, func(context.Context, redis.XMessage) error { runs.Add(1); return nil }, done); err != nil {
		t.Fatal(err)
	}
	if got := runs.Load(); got != 3 {
		t.Errorf("handler ran %d times, want 3", got)
	}
	if n := len(e.dlq()); n != 1 {
		t.Errorf("dead-letter stream has %d entries, want 1", n)
	}
}

func TestNewValidates(t *testing.T) {
	// redisstore.New checks the server; New itself sends nothing.
	rdb := redis.NewClient(&redis.Options{Addr: redistest.Start(t).Addr()})
	t.Cleanup(func() { rdb.Close() })
	store, err := redisstore.New(rdb)
	if err != nil {
		t.Fatal(err)
	}
	tagged, err := redisstore.New(rdb, redisstore.WithHashTag("t"))
	if err != nil {
		t.Fatal(err)
	}
	cases := []struct {
		name  string
		store *redisstore.Store
		strm  string
		opts  []Option
	}{
		{"nil store", nil, "s", nil},
		{"empty stream", store, "", nil},
		{"batch 0", store, "s", []Option{consumer.WithBatchSize(0)}},
		{"block 0", store, "s", []Option{WithBlock(0)}},
		{"nil key", store, "s", []Option{WithKeyFunc(nil)}},
		{"negative deliveries", store, "s", []Option{consumer.WithMaxDeliveries(-1)}},
		{"negative retry", store, "s", []Option{consumer.WithRetryDelay(-1)}},
		{"claim idle", store, "s", []Option{WithClaimIdle(time.Millisecond)}},
		{"dlq is stream", store, "s", []Option{consumer.WithDeadLetter("s")}},
		{"group start", store, "s", []Option{WithGroupStart("")}},
		{"bare Processor option", store, "s", []Option{consumer.WithConcurrency(2)}},
		{"tag mismatch", tagged, "{u}:s", nil},
		{"dlq tag mismatch", tagged, "{t}:s", []Option{consumer.WithDeadLetter("dlq")}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			if _, err := New(rdb, tc.strm, "g", "c", executorOn(tc.store), nopHandler, tc.opts...); !errors.Is(err, idem.ErrInvalid) {
				t.Errorf("got %v, want ErrInvalid", err)
			}
		})
	}
	if _, err := New(rdb, "{t}:s", "g", "c", executorOn(tagged), nopHandler); err != nil {
		t.Errorf("valid tagged consumer: %v", err)
	}
}

func TestKeyHash(t *testing.T) {
	f := KeyHash("order", "line")
	a := f(redis.XMessage{Values: map[string]any{"order": "1", "line": "2", "ts": "x"}})
	b := f(redis.XMessage{Values: map[string]any{"order": "1", "line": "2", "ts": "y"}})
	c := f(redis.XMessage{Values: map[string]any{"order": "12", "line": ""}})
	if a == "" || a != b || a == c {
		t.Errorf("KeyHash: %q %q %q; want equal for equal fields, different otherwise", a, b, c)
	}
	if got := f(redis.XMessage{Values: map[string]any{"other": "1"}}); got != "" {
		t.Errorf("KeyHash without the fields = %q, want no key", got)
	}
}

// TestRueidisStore runs the consumer with the store on a rueidis client
// (the stream is still read with go-redis).
func TestRueidisStore(t *testing.T) {
	srv := redistest.Start(t)
	rdb := srv.GoRedis(t)
	rc := srv.Rueidis(t)
	store, err := redisstore.NewRueidis(rc, redisstore.WithHashTag("r"))
	if err != nil {
		t.Fatal(err)
	}
	e := &env{t: t, rdb: rdb, store: store, stream: "{r}:orders", group: "g", lease: time.Second}
	for _, k := range []string{"a", "b", "a", "c"} {
		e.add("key", k)
	}
	var runs atomic.Int32
	c := e.consumer("c1")
	if err := e.run(c, func(context.Context, redis.XMessage) error { runs.Add(1); return nil },
		func() bool { s := c.Stats(); return s.Processed == 3 && s.Replayed == 1 }); err != nil {
		t.Fatal(err)
	}
	if runs.Load() != 3 || e.pending() != 0 {
		t.Errorf("runs %d, pending %d; want 3 and 0", runs.Load(), e.pending())
	}
}

// TestEncryptedResults runs the consumer with WithEncryption: its results
// are written by the Executor (sealed), so another Executor with the key
// replays them, and a duplicate entry is acknowledged as a replay. (Before,
// the consumer wrote a plain result of its own, which an Executor with a
// key must refuse.)
func TestEncryptedResults(t *testing.T) {
	block, _ := aes.NewCipher(make([]byte, 32))
	aead, _ := cipher.NewGCM(block)
	e := newEnv(t, standalone(t), "", time.Second)
	e.add("key", "a")
	ran := atomic.Int32{}
	h := func(context.Context, redis.XMessage) error { ran.Add(1); return nil }
	c := e.consumerOn("c1", []idem.Option{idem.WithEncryption(aead)})
	if err := e.run(c, h, func() bool { return c.Stats().Processed == 1 }); err != nil {
		t.Fatal(err)
	}
	rec, err := e.store.Get(t.Context(), idem.Key{Scope: e.stream, ID: "a"}.Digest())
	if err != nil || rec.State != storekit.StateCompleted {
		t.Fatalf("record %v %v, want COMPLETED", rec.State, err)
	}
	sealed, err := idem.New(e.store, idem.WithEncryption(aead))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := adapterkit.DecodeResult(sealed, idem.Key{Scope: e.stream, ID: "a"}.Digest(), rec.Result); err != nil {
		t.Fatalf("the stored result is not sealed by the Executor: %v", err)
	}
	e.add("key", "a")
	if err := e.run(c, h, func() bool { return c.Stats().Replayed == 1 }); err != nil {
		t.Fatal(err)
	}
	if ran.Load() != 1 || e.pending() != 0 {
		t.Fatalf("handler ran %d times, pending %d; want 1 and 0", ran.Load(), e.pending())
	}
}

// TestEventHook: the processor's per-message event hook, passed with
// consumer.WithEventHook, sees every entry's outcome under its key digest.
func TestEventHook(t *testing.T) {
	e := newEnv(t, standalone(t), "", time.Second)
	e.add("key", "a")
	e.add("key", "a")
	e.add("body", "no key")
	var mu sync.Mutex
	var events []consumer.Event
	c := e.consumer("c1", consumer.WithEventHook(func(ev consumer.Event) {
		mu.Lock()
		events = append(events, ev)
		mu.Unlock()
	}))
	if err := e.run(c, func(context.Context, redis.XMessage) error { return nil }, func() bool {
		mu.Lock()
		defer mu.Unlock()
		return len(events) == 3
	}); err != nil {
		t.Fatal(err)
	}
	digest := idem.Key{Scope: e.stream, ID: "a"}.Digest()
	if events[0].KeyDigest != digest || events[0].Result.Action != consumer.Ack || events[0].Result.Replayed ||
		!events[1].Result.Replayed || events[2].Result.Action != consumer.DeadLetter || events[2].KeyDigest != "" {
		t.Fatalf("events %+v, want processed and replayed under the key's digest, then a dead letter without one", events)
	}
}

// nopHandler is the handler of consumers created before their test's
// handler; runWith replaces it.
func nopHandler(context.Context, redis.XMessage) error { return nil }

// runWith runs c with h as its handler: tests create their consumers
// before their handlers.
func runWith(ctx context.Context, c *Consumer, h Handler) error {
	c.h = h
	return c.Run(ctx)
}

// executorOn returns an Executor on store, or nil if store is nil or opts
// are invalid (for New's validation).
func executorOn(store *redisstore.Store, opts ...idem.Option) *idem.Executor {
	if store == nil {
		return nil
	}
	exec, err := idem.New(store, opts...)
	if err != nil {
		return nil
	}
	return exec
}
