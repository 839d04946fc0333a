package natsconsumer_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/idemgo/idem"
	"github.com/idemgo/idem/consumer"
	natsconsumer "github.com/idemgo/idem/consumer/nats"
	"github.com/idemgo/idem/memstore"
	"github.com/idemgo/idem/storekit"
	"github.com/idemgo/idem/testkit/prooftest"
)

func nopHandler(context.Context, jetstream.Msg) error { return nil }

func TestNewValidation(t *testing.T) {
	_, js := connect(t)
	s := newStream(t, js, nil)
	cons := s.consumer(t, nil)
	noAck, err := js.CreateOrUpdateConsumer(t.Context(), s.name, jetstream.ConsumerConfig{Durable: "noack", AckPolicy: jetstream.AckNonePolicy})
	if err != nil {
		t.Fatal(err)
	}
	exec := prooftest.MemExecutor(t, idem.WithLease(time.Second))
	tests := []struct {
		name string
		js   jetstream.JetStream
		cons jetstream.Consumer
		exec *idem.Executor
		h    natsconsumer.Handler
		opts []natsconsumer.Option
		ok   bool
	}{
		{"defaults", js, cons, exec, nopHandler, nil, true},
		{"all options", js, cons, exec, nopHandler, []natsconsumer.Option{
			natsconsumer.WithKeyHeader("X-Key"), consumer.WithBatchSize(10),
			natsconsumer.WithFetchMaxWait(time.Second), consumer.WithShutdownTimeout(0),
			consumer.WithDeadLetter("dead"), natsconsumer.WithDeadLetterTimeout(time.Second),
			natsconsumer.WithProgressInterval(time.Second),
			natsconsumer.WithFingerprint(func(m jetstream.Msg) string { return "" }),
		}, true},
		{"nil js", nil, cons, exec, nopHandler, nil, false},
		{"nil consumer", js, nil, exec, nopHandler, nil, false},
		{"nil processor", js, cons, nil, nopHandler, nil, false},
		{"nil handler", js, cons, exec, nil, nil, false},
		{"ack none", js, noAck, exec, nopHandler, nil, false},
		{"empty key header", js, cons, exec, nopHandler, []natsconsumer.Option{natsconsumer.WithKeyHeader("")}, false},
		{"nil key func", js, cons, exec, nopHandler, []natsconsumer.Option{natsconsumer.WithKeyFunc(nil)}, false},
		{"batch 0", js, cons, exec, nopHandler, []natsconsumer.Option{consumer.WithBatchSize(0)}, false},
		{"max wait 1ms", js, cons, exec, nopHandler, []natsconsumer.Option{natsconsumer.WithFetchMaxWait(time.Millisecond)}, false},
		{"negative shutdown", js, cons, exec, nopHandler, []natsconsumer.Option{consumer.WithShutdownTimeout(-1)}, false},
		{"zero dlq timeout", js, cons, exec, nopHandler, []natsconsumer.Option{natsconsumer.WithDeadLetterTimeout(0)}, false},
		{"concurrency 2", js, cons, exec, nopHandler, []natsconsumer.Option{consumer.WithConcurrency(2)}, false},
		{"progress over AckWait", js, cons, exec, nopHandler, []natsconsumer.Option{natsconsumer.WithProgressInterval(time.Minute)}, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c, err := natsconsumer.New(tt.js, tt.cons, tt.exec, tt.h, tt.opts...)
			if tt.ok {
				if err != nil || c == nil {
					t.Fatalf("got error %v, want a consumer", err)
				}
				return
			}
			if !errors.Is(err, idem.ErrInvalid) {
				t.Fatalf("got error %v, want one wrapping idem.ErrInvalid", err)
			}
		})
	}
}

// TestOncePerKey: duplicates of a completed key are acked without running
// the handler; the fence is in the handler's context.
func TestOncePerKey(t *testing.T) {
	_, js := connect(t)
	s := newStream(t, js, nil)
	cons := s.consumer(t, nil)
	var mu sync.Mutex
	runs := map[string]int{}
	c, err := natsconsumer.New(js, cons, prooftest.MemExecutor(t, idem.WithLease(5*time.Second)), func(ctx context.Context, m jetstream.Msg) error {
		if _, ok := idem.FenceFrom(ctx); !ok {
			t.Errorf("handler context has no fence")
		}
		mu.Lock()
		runs[string(m.Data())]++
		mu.Unlock()
		return nil
	}, natsconsumer.WithKeyHeader("Idem-Key"), natsconsumer.WithFetchMaxWait(200*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	s.publish(t, "a", "Idem-Key", "k1", []byte("k1"))
	s.publish(t, "a", "Idem-Key", "k2", []byte("k2"))
	s.publish(t, "a", "Idem-Key", "k1", []byte("k1")) // same batch
	stop := runBg(t, c.Run)
	waitDrained(t, cons, 10*time.Second)
	s.publish(t, "a", "Idem-Key", "k2", []byte("k2")) // after completion
	eventually(t, 10*time.Second, "the replay", func() bool { return c.Stats().Replayed == 2 })
	waitDrained(t, cons, 10*time.Second)
	if err := stop(); !errors.Is(err, natsconsumer.ErrStopped) {
		t.Errorf("Run returned %v, want ErrStopped", err)
	}
	mu.Lock()
	defer mu.Unlock()
	if runs["k1"] != 1 || runs["k2"] != 1 {
		t.Errorf("got handler runs %v, want 1 per key", runs)
	}
	if got, want := c.Stats(), (natsconsumer.Stats{Processed: 2, Replayed: 2}); got != want {
		t.Errorf("got stats %+v, want %+v", got, want)
	}
}

// TestDefaultKeyIsMsgID: the default key is the Nats-Msg-Id header, which
// also covers duplicates outside JetStream's own duplicate window.
func TestDefaultKeyIsMsgID(t *testing.T) {
	_, js := connect(t)
	s := newStream(t, js, func(c *jetstream.StreamConfig) { c.Duplicates = 100 * time.Millisecond })
	cons := s.consumer(t, nil)
	var runs atomic.Int32
	c, err := natsconsumer.New(js, cons, prooftest.MemExecutor(t, idem.WithLease(5*time.Second)), func(ctx context.Context, m jetstream.Msg) error {
		runs.Add(1)
		return nil
	}, natsconsumer.WithFetchMaxWait(200*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	s.publish(t, "a", jetstream.MsgIDHeader, "order-1", []byte("x"))
	time.Sleep(300 * time.Millisecond) // past the server's duplicate window
	s.publish(t, "a", jetstream.MsgIDHeader, "order-1", []byte("x"))
	if info, err := s.stream.Info(t.Context()); err != nil || info.State.Msgs != 2 {
		t.Fatalf("stream holds %v messages (err %v), want 2: the server deduplicated", info.State.Msgs, err)
	}
	runBg(t, c.Run)
	waitDrained(t, cons, 10*time.Second)
	if got := runs.Load(); got != 1 {
		t.Errorf("got %d handler runs, want 1", got)
	}
	if got := c.Stats(); got.Processed != 1 || got.Replayed != 1 {
		t.Errorf("got stats %+v, want 1 processed and 1 replayed", got)
	}
}

// TestNoKeyDeadLettered: a message without a key goes to the dead-letter
// subject with a reason, is counted, and the handler never runs.
func TestNoKeyDeadLettered(t *testing.T) {
	_, js := connect(t)
	s := newStream(t, js, nil)
	cons := s.consumer(t, nil)
	c, err := natsconsumer.New(js, cons, prooftest.MemExecutor(t, idem.WithLease(5*time.Second)), func(context.Context, jetstream.Msg) error {
		t.Error("handler ran for a message without a key")
		return nil
	}, natsconsumer.WithFetchMaxWait(200*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	s.publish(t, "orders", "", "", []byte("payload"))
	s.publish(t, "orders", jetstream.MsgIDHeader, strings.Repeat("k", storekit.MaxKeyLen+1), []byte("long"))
	runBg(t, c.Run)
	waitDrained(t, cons, 10*time.Second)
	dl := s.dlqMsgs(t)
	if len(dl) != 2 {
		t.Fatalf("got %d dead letters, want 2", len(dl))
	}
	m := dl[0]
	if m.Subject != "dlq."+s.name+".orders" || string(m.Data) != "payload" {
		t.Errorf("got dead letter %q %q, want the original payload on dlq.<subject>", m.Subject, m.Data)
	}
	if r := m.Header.Get(natsconsumer.HeaderReason); !strings.Contains(r, "no idempotency key") {
		t.Errorf("got reason %q, want one naming the missing key", r)
	}
	if got := m.Header.Get(natsconsumer.HeaderOriginalSequence); got != "1" {
		t.Errorf("got original sequence %q, want 1", got)
	}
	if got := c.Stats(); got.Invalid != 2 || got.DeadLettered != 2 {
		t.Errorf("got stats %+v, want 2 no-key and 2 dead-lettered", got)
	}
}

// TestHandlerErrors: a failing handler is retried with the processor's
// delay; it succeeds on a later delivery once, or is dead-lettered after
// max deliveries and its key FAILED (a later duplicate is dead-lettered
// again without running).
func TestHandlerErrors(t *testing.T) {
	_, js := connect(t)
	s := newStream(t, js, nil)
	cons := s.consumer(t, nil)
	var mu sync.Mutex
	runs := map[string]int{}
	exec := prooftest.MemExecutor(t, idem.WithLease(5*time.Second))
	c, err := natsconsumer.New(js, cons, exec, func(ctx context.Context, m jetstream.Msg) error {
		mu.Lock()
		defer mu.Unlock()
		k := string(m.Data())
		runs[k]++
		if k == "poison" || runs[k] < 2 {
			return errors.New("boom")
		}
		return nil
	}, natsconsumer.WithKeyHeader("Idem-Key"), natsconsumer.WithFetchMaxWait(200*time.Millisecond), consumer.WithMaxDeliveries(3), consumer.WithRetryDelay(20*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	s.publish(t, "a", "Idem-Key", "flaky", []byte("flaky"))
	s.publish(t, "a", "Idem-Key", "poison", []byte("poison"))
	runBg(t, c.Run)
	eventually(t, 10*time.Second, "processing", func() bool {
		st := c.Stats()
		return st.Processed == 1 && st.DeadLettered == 1
	})
	waitDrained(t, cons, 10*time.Second)
	s.publish(t, "a", "Idem-Key", "poison", []byte("poison"))
	eventually(t, 10*time.Second, "the second dead letter", func() bool { return c.Stats().DeadLettered == 2 })
	waitDrained(t, cons, 10*time.Second)
	mu.Lock()
	defer mu.Unlock()
	if runs["flaky"] != 2 || runs["poison"] != 3 {
		t.Errorf("got handler runs %v, want flaky 2 and poison 3", runs)
	}
	dl := s.dlqMsgs(t)
	if len(dl) != 2 {
		t.Fatalf("got %d dead letters, want 2", len(dl))
	}
	if got := dl[0].Header.Get(natsconsumer.HeaderDeliveries); got != "3" {
		t.Errorf("got deliveries header %q, want 3", got)
	}
	if r := dl[1].Header.Get(natsconsumer.HeaderReason); !strings.Contains(r, "failed") {
		t.Errorf("got reason %q for the FAILED key's duplicate, want one saying it failed", r)
	}
	if got := c.Stats(); got.Retried != 3 {
		t.Errorf("got %d retries, want 3 (flaky once, poison twice)", got.Retried)
	}
}

// TestServerMaxDeliver: with a MaxDeliver on the JetStream consumer below
// the processor's limit, the last delivery is dead-lettered instead of
// being dropped by the server.
func TestServerMaxDeliver(t *testing.T) {
	_, js := connect(t)
	s := newStream(t, js, nil)
	cons := s.consumer(t, func(c *jetstream.ConsumerConfig) { c.MaxDeliver = 2 })
	var runs atomic.Int32
	exec := prooftest.MemExecutor(t, idem.WithLease(5*time.Second))
	c, err := natsconsumer.New(js, cons, exec, func(context.Context, jetstream.Msg) error {
		runs.Add(1)
		return errors.New("boom")
	}, natsconsumer.WithFetchMaxWait(200*time.Millisecond), consumer.WithMaxDeliveries(10), consumer.WithRetryDelay(20*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	s.publish(t, "a", jetstream.MsgIDHeader, "k", nil)
	runBg(t, c.Run)
	eventually(t, 10*time.Second, "the dead letter", func() bool { return c.Stats().DeadLettered == 1 })
	waitDrained(t, cons, 10*time.Second)
	if got := runs.Load(); got != 2 {
		t.Errorf("got %d handler runs, want 2", got)
	}
}

// TestInProgressDuplicate: a duplicate delivered while its key is held by
// another consumer is not acked and not run; it is redelivered (NakWithDelay)
// and then acked as a replay.
func TestInProgressDuplicate(t *testing.T) {
	_, js := connect(t)
	s := newStream(t, js, nil)
	cons := s.consumer(t, nil)
	exec := prooftest.MemExecutor(t, idem.WithLease(time.Second)) // the duplicate's nak delay is the remaining lease
	release := make(chan struct{})
	started := make(chan struct{}, 1)
	var runs atomic.Int32
	h := func(ctx context.Context, m jetstream.Msg) error {
		runs.Add(1)
		started <- struct{}{}
		<-release
		return nil
	}
	opts := []natsconsumer.Option{natsconsumer.WithKeyHeader("Idem-Key"), consumer.WithBatchSize(1), natsconsumer.WithFetchMaxWait(200 * time.Millisecond)}
	c1, err := natsconsumer.New(js, cons, exec, h, opts...)
	if err != nil {
		t.Fatal(err)
	}
	c2, err := natsconsumer.New(js, cons, exec, h, opts...)
	if err != nil {
		t.Fatal(err)
	}
	s.publish(t, "a", "Idem-Key", "k", nil)
	runBg(t, c1.Run)
	<-started
	// The duplicate arrives while the key is held by c1's handler.
	s.publish(t, "a", "Idem-Key", "k", nil)
	runBg(t, c2.Run)
	eventually(t, 10*time.Second, "a retry of the in-progress duplicate", func() bool {
		return sum(c1.Stats(), c2.Stats()).Retried >= 1
	})
	close(release)
	waitDrained(t, cons, 15*time.Second)
	if got := runs.Load(); got != 1 {
		t.Errorf("got %d handler runs, want 1", got)
	}
	st := sum(c1.Stats(), c2.Stats())
	if p, r := st.Processed, st.Replayed; p != 1 || r != 1 {
		t.Errorf("got %d processed and %d replayed, want 1 and 1", p, r)
	}
}

// TestLongHandlerInProgress: a handler running for several AckWaits keeps
// its message (msg.InProgress every third of AckWait) and its lease: the
// message is not redelivered and the handler runs once.
func TestLongHandlerInProgress(t *testing.T) {
	_, js := connect(t)
	s := newStream(t, js, nil)
	cons := s.consumer(t, func(c *jetstream.ConsumerConfig) { c.AckWait = 600 * time.Millisecond })
	var runs atomic.Int32
	exec := prooftest.MemExecutor(t, idem.WithLease(600*time.Millisecond))
	h := func(ctx context.Context, m jetstream.Msg) error {
		runs.Add(1)
		select {
		case <-time.After(2 * time.Second):
			return nil
		case <-ctx.Done():
			return context.Cause(ctx)
		}
	}
	opts := []natsconsumer.Option{consumer.WithBatchSize(1), natsconsumer.WithFetchMaxWait(200 * time.Millisecond)}
	c1, err := natsconsumer.New(js, cons, exec, h, opts...)
	if err != nil {
		t.Fatal(err)
	}
	c2, err := natsconsumer.New(js, cons, exec, h, opts...)
	if err != nil {
		t.Fatal(err)
	}
	s.publish(t, "a", jetstream.MsgIDHeader, "slow", nil)
	runBg(t, c1.Run)
	runBg(t, c2.Run) // would receive a redelivery if the AckWait expired
	eventually(t, 10*time.Second, "completion", func() bool { return sum(c1.Stats(), c2.Stats()).Processed == 1 })
	waitDrained(t, cons, 5*time.Second)
	st := sum(c1.Stats(), c2.Stats())
	if got := runs.Load(); got != 1 || st.Retried != 0 || st.Replayed != 0 {
		t.Errorf("got %d runs, stats %+v; want 1 run, no retry, no replay", got, st)
	}
}

// TestShutdown: once Run's context is done, the in-flight handler may
// finish and its message is acked; a handler that outlives the shutdown
// timeout is cancelled, its key released and its message redelivered.
func TestShutdown(t *testing.T) {
	_, js := connect(t)
	s := newStream(t, js, nil)
	cons := s.consumer(t, nil)
	exec := prooftest.MemExecutor(t, idem.WithLease(5*time.Second))
	started := make(chan string, 10)
	var mu sync.Mutex
	runs := map[string]int{}
	h := func(ctx context.Context, m jetstream.Msg) error {
		k := string(m.Data())
		mu.Lock()
		runs[k]++
		n := runs[k]
		mu.Unlock()
		started <- k
		d := 300 * time.Millisecond
		if k == "stuck" && n == 1 {
			d = time.Hour
		}
		select {
		case <-time.After(d):
			return nil
		case <-ctx.Done():
			return context.Cause(ctx)
		}
	}
	c, err := natsconsumer.New(js, cons, exec, h, consumer.WithBatchSize(1),
		natsconsumer.WithFetchMaxWait(200*time.Millisecond), consumer.WithShutdownTimeout(500*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}

	s.publish(t, "a", jetstream.MsgIDHeader, "finish", []byte("finish"))
	stop := runBg(t, c.Run)
	<-started
	if err := stop(); !errors.Is(err, natsconsumer.ErrStopped) {
		t.Fatalf("Run returned %v, want ErrStopped", err)
	}
	if got := c.Stats(); got.Processed != 1 {
		t.Fatalf("got stats %+v after shutdown, want the in-flight message processed", got)
	}

	s.publish(t, "a", jetstream.MsgIDHeader, "stuck", []byte("stuck"))
	stop = runBg(t, c.Run)
	<-started
	begin := time.Now()
	_ = stop()
	if d := time.Since(begin); d > 3*time.Second {
		t.Errorf("shutdown took %v, want about the 500ms timeout", d)
	}
	if got := c.Stats(); got.Retried != 1 {
		t.Fatalf("got stats %+v, want the stuck message retried", got)
	}
	// The released key runs again on the redelivery (after the retry delay).
	runBg(t, c.Run)
	waitDrained(t, cons, 10*time.Second)
	mu.Lock()
	defer mu.Unlock()
	if runs["stuck"] != 2 || runs["finish"] != 1 {
		t.Errorf("got runs %v, want finish 1 and stuck 2", runs)
	}
}

// stallingStore fails Extend (as an unreachable store would) while stall
// is set, so that a test can let a lease expire under a running handler.
type stallingStore struct {
	idem.Store
	stall atomic.Bool
}

func (s *stallingStore) Extend(ctx context.Context, key string, lease idem.Lease, d time.Duration) error {
	if s.stall.Load() {
		return errors.New("store unreachable (test)")
	}
	return s.Store.Extend(ctx, key, lease, d)
}

// TestLeaseLost: when another owner takes the key over, the running
// handler's context is cancelled with idem.ErrLeaseLost and its message is
// not acked; the redelivery replays the new owner's result.
func TestLeaseLost(t *testing.T) {
	_, js := connect(t)
	s := newStream(t, js, nil)
	cons := s.consumer(t, nil)
	ms, err := memstore.New()
	if err != nil {
		t.Fatal(err)
	}
	store := &stallingStore{Store: ms}
	const lease = 300 * time.Millisecond
	exec, err := idem.New(store, idem.WithLease(lease))
	if err != nil {
		t.Fatal(err)
	}
	var runs atomic.Int32
	var cause atomic.Value
	c, err := natsconsumer.New(js, cons, exec, func(ctx context.Context, m jetstream.Msg) error {
		runs.Add(1)
		store.stall.Store(true)
		time.Sleep(2 * lease) // the lease expires
		_, a, err := exec.Begin(context.Background(), idem.Key{Scope: natsconsumer.DefaultScope, ID: "k"}, "")
		if err != nil {
			return fmt.Errorf("takeover: %w", err)
		}
		if _, ok := a.TakenOver(); !ok {
			return errors.New("Begin did not take the key over")
		}
		store.stall.Store(false)
		select {
		case <-ctx.Done():
			cause.Store(context.Cause(ctx))
		case <-time.After(5 * time.Second):
			t.Error("handler context not cancelled 5s after the takeover")
		}
		if err := a.Commit(context.Background(), nil); err != nil {
			t.Errorf("new owner's commit: %v", err)
		}
		return ctx.Err()
	}, natsconsumer.WithFetchMaxWait(200*time.Millisecond), consumer.WithRetryDelay(50*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	s.publish(t, "a", jetstream.MsgIDHeader, "k", nil)
	runBg(t, c.Run)
	eventually(t, 10*time.Second, "the replay", func() bool { return c.Stats().Replayed == 1 })
	waitDrained(t, cons, 5*time.Second)
	if err, _ := cause.Load().(error); !errors.Is(err, idem.ErrLeaseLost) {
		t.Errorf("got handler context cause %v, want idem.ErrLeaseLost", err)
	}
	if got := c.Stats(); got.Processed != 0 || got.Retried != 1 || runs.Load() != 1 {
		t.Errorf("got stats %+v and %d runs, want 1 retry, 1 replay, 1 run", got, runs.Load())
	}
}

// TestFingerprintMismatch: a key reused with another payload is
// dead-lettered with the mismatch as reason, to a configured subject.
func TestFingerprintMismatch(t *testing.T) {
	_, js := connect(t)
	s := newStream(t, js, nil)
	cons := s.consumer(t, nil)
	var runs atomic.Int32
	c, err := natsconsumer.New(js, cons, prooftest.MemExecutor(t, idem.WithLease(5*time.Second)), func(context.Context, jetstream.Msg) error {
		runs.Add(1)
		return nil
	}, natsconsumer.WithKeyHeader("Idem-Key"),
		natsconsumer.WithFingerprint(func(m jetstream.Msg) string { return string(m.Data()) }),
		consumer.WithDeadLetter("dlq."+s.name+".mismatches"),
		natsconsumer.WithFetchMaxWait(200*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	s.publish(t, "a", "Idem-Key", "k", []byte("v1"))
	s.publish(t, "a", "Idem-Key", "k", []byte("v2"))
	runBg(t, c.Run)
	eventually(t, 10*time.Second, "the dead letter", func() bool { return c.Stats().DeadLettered == 1 })
	waitDrained(t, cons, 10*time.Second)
	dl := s.dlqMsgs(t)
	if len(dl) != 1 || dl[0].Subject != "dlq."+s.name+".mismatches" || string(dl[0].Data) != "v2" {
		t.Fatalf("got dead letters %+v, want v2 on the configured subject", dl)
	}
	if r := dl[0].Header.Get(natsconsumer.HeaderReason); !strings.Contains(r, idem.ErrMismatch.Error()) {
		t.Errorf("got reason %q, want the mismatch", r)
	}
	if runs.Load() != 1 {
		t.Errorf("got %d runs, want 1", runs.Load())
	}
}

// TestDeadLetterPublishFails: when no stream takes the dead letter, the
// message is not terminated: it stays with the consumer and is retried.
func TestDeadLetterPublishFails(t *testing.T) {
	_, js := connect(t)
	s := newStream(t, js, nil)
	cons := s.consumer(t, nil)
	var hooked atomic.Value
	c, err := natsconsumer.New(js, cons, prooftest.MemExecutor(t, idem.WithLease(5*time.Second)), nopHandler,
		consumer.WithEventHook(func(e consumer.Event) { hooked.CompareAndSwap(nil, e.Result) }),
		consumer.WithDeadLetter("nowhere."+s.name),
		natsconsumer.WithDeadLetterTimeout(500*time.Millisecond),
		natsconsumer.WithFetchMaxWait(200*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	s.publish(t, "a", "", "", []byte("keyless"))
	runBg(t, c.Run)
	eventually(t, 10*time.Second, "a failed dead-letter publish", func() bool { return c.Stats().Errors > 0 })
	info, err := cons.Info(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	if info.NumAckPending+int(info.NumPending) != 1 || info.AckFloor.Stream != 0 {
		t.Errorf("got ack pending %d, pending %d, ack floor %d; want the message still held", info.NumAckPending, info.NumPending, info.AckFloor.Stream)
	}
	if got := c.Stats(); got.Errors == 0 {
		t.Errorf("got stats %+v, want the failed dead-letter publish counted in Errors", got)
	}
	r, _ := hooked.Load().(consumer.Result)
	if r.Action != consumer.DeadLetter || !errors.Is(r.Err, consumer.ErrNoKey) {
		t.Errorf("event hook got %v %v, want the dead letter of the missing key", r.Action, r.Err)
	}
}

// TestHandlerPanic: a panicking handler is an error: the key is released,
// the message redelivered, and the next delivery runs the handler again.
func TestHandlerPanic(t *testing.T) {
	_, js := connect(t)
	s := newStream(t, js, nil)
	cons := s.consumer(t, nil)
	var runs atomic.Int32
	exec := prooftest.MemExecutor(t, idem.WithLease(5*time.Second))
	c, err := natsconsumer.New(js, cons, exec, func(context.Context, jetstream.Msg) error {
		if runs.Add(1) == 1 {
			panic("boom")
		}
		return nil
	}, natsconsumer.WithFetchMaxWait(200*time.Millisecond), consumer.WithRetryDelay(20*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	s.publish(t, "a", jetstream.MsgIDHeader, "k", nil)
	runBg(t, c.Run)
	eventually(t, 10*time.Second, "processing", func() bool { return c.Stats().Processed == 1 })
	waitDrained(t, cons, 5*time.Second)
	if got := c.Stats(); got.Retried != 1 || runs.Load() != 2 {
		t.Errorf("got stats %+v and %d runs, want 1 retry and 2 runs", got, runs.Load())
	}
}

// sum adds the counters of two consumers.
func sum(a, b consumer.Stats) consumer.Stats {
	return consumer.Stats{
		Processed: a.Processed + b.Processed, Replayed: a.Replayed + b.Replayed, Retried: a.Retried + b.Retried,
		DeadLettered: a.DeadLettered + b.DeadLettered, Invalid: a.Invalid + b.Invalid, Panics: a.Panics + b.Panics,
		Redelivered: a.Redelivered + b.Redelivered, Errors: a.Errors + b.Errors,
	}
}
