package rabbitmq

import (
	"context"
	"errors"
	"fmt"
	osexec "os/exec"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idemgo/idem"
	"github.com/idemgo/idem/adapterkit"
	"github.com/idemgo/idem/consumer"
	"github.com/idemgo/idem/storekit"
	"github.com/idemgo/idem/testkit/prooftest"
	amqp "github.com/rabbitmq/amqp091-go"
)

func nopHandler(context.Context, *amqp.Delivery) error { return nil }

func TestNewValidation(t *testing.T) {
	exec := prooftest.MemExecutor(t, idem.WithLease(time.Second))
	url := amqpURL()
	tests := []struct {
		name  string
		url   string
		queue string
		exec  *idem.Executor
		h     Handler
		opts  []Option
	}{
		{"empty url", "", "q", exec, nopHandler, nil},
		{"bad url", "http://x", "q", exec, nopHandler, nil},
		{"empty queue", url, "", exec, nopHandler, nil},
		{"nil processor", url, "q", nil, nopHandler, nil},
		{"nil handler", url, "q", exec, nil, nil},
		{"nil key func", url, "q", exec, nopHandler, []Option{WithKeyFunc(nil)}},
		{"empty key header", url, "q", exec, nopHandler, []Option{WithKeyHeader("")}},
		{"batch 0", url, "q", exec, nopHandler, []Option{consumer.WithBatchSize(0)}},
		{"concurrency 0", url, "q", exec, nopHandler, []Option{consumer.WithConcurrency(0)}},
		{"negative wait", url, "q", exec, nopHandler, []Option{WithBatchWait(-1)}},
		{"negative prefetch", url, "q", exec, nopHandler, []Option{WithPrefetch(-1)}},
		{"retry queue is the queue", url, "q", exec, nopHandler, []Option{WithRetryQueue("q")}},
		{"dlq is the retry queue", url, "q", exec, nopHandler, []Option{consumer.WithDeadLetter("q.retry")}},
		{"empty dlx", url, "q", exec, nopHandler, []Option{WithDeadLetterExchange("", "")}},
		{"max delay 0", url, "q", exec, nopHandler, []Option{WithMaxDelay(0)}},
		{"shutdown 0", url, "q", exec, nopHandler, []Option{consumer.WithShutdownTimeout(0)}},
		{"backoff inverted", url, "q", exec, nopHandler, []Option{WithBackoff(time.Second, time.Millisecond)}},
		{"publish timeout 0", url, "q", exec, nopHandler, []Option{WithPublishTimeout(0)}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c, err := New(tt.url, tt.queue, tt.exec, tt.h, tt.opts...)
			if !errors.Is(err, idem.ErrInvalid) {
				t.Fatalf("got %v, %v, want an error wrapping idem.ErrInvalid", c, err)
			}
		})
	}
	if _, err := New(url, "q", exec, nopHandler); err != nil {
		t.Fatalf("defaults: got %v, want nil", err)
	}
}

func TestKeyFuncs(t *testing.T) {
	d := &amqp.Delivery{MessageId: "m", Body: []byte("body"), Headers: amqp.Table{
		"s": "str", "b": []byte("bytes"), "i": int32(7), "f": 1.5,
	}}
	tests := []struct {
		name string
		f    KeyFunc
		want string
	}{
		{"message id", MessageIDKey, "m"},
		{"string header", KeyHeader("s"), "str"},
		{"bytes header", KeyHeader("b"), "bytes"},
		{"int header", KeyHeader("i"), "7"},
		{"float header", KeyHeader("f"), ""},
		{"missing header", KeyHeader("x"), ""},
		{"body hash", BodyHashKey, "230d8358dc8e8890b4c58deeb62912ee2f20357ae92a5cc861b98e68fe31acb5"},
		{"empty body hash", BodyHashKey, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			dd := d
			if tt.name == "empty body hash" {
				dd = &amqp.Delivery{}
			}
			if got := tt.f(dd); got != tt.want {
				t.Errorf("got %q, want %q", got, tt.want)
			}
		})
	}
}

func TestDeliveriesCount(t *testing.T) {
	tests := []struct {
		h    amqp.Table
		want int
	}{
		{nil, 1},
		{amqp.Table{HeaderDeliveries: int64(2)}, 3},
		{amqp.Table{HeaderDeliveries: int32(1), "x-delivery-count": int64(2)}, 4},
	}
	for _, tt := range tests {
		if got := deliveries(&amqp.Delivery{Headers: tt.h}); got != tt.want {
			t.Errorf("deliveries(%v): got %d, want %d", tt.h, got, tt.want)
		}
	}
}

// TestOncePerKey: duplicates, in one batch and after completion, run the
// handler once per key and are all acked.
func TestOncePerKey(t *testing.T) {
	for _, conc := range []int{1, 3} {
		t.Run(fmt.Sprintf("concurrency=%d", conc), func(t *testing.T) { testOncePerKey(t, conc) })
	}
}

func testOncePerKey(t *testing.T, conc int) {
	q := testQueue(t)
	pub := newPublisher(t, q)
	s := newSink()
	exec := prooftest.MemExecutor(t, idem.WithLease(2*time.Second))
	c, err := New(amqpURL(), q, exec, func(ctx context.Context, d *amqp.Delivery) error {
		s.run(ctx, d.MessageId)
		return nil
	}, consumer.WithBatchSize(10), WithBatchWait(20*time.Millisecond), WithMaxDelay(50*time.Millisecond), consumer.WithConcurrency(conc), consumer.WithScope(q))
	if err != nil {
		t.Fatal(err)
	}
	var batch []amqp.Publishing
	for i := range 20 {
		batch = append(batch, msg(fmt.Sprintf("k%d", i), "x"), msg(fmt.Sprintf("k%d", i), "x"))
	}
	pub.publish(q, batch...)
	stop := prooftest.Start(t, c.Run)
	waitFor(t, 20*time.Second, "20 keys", func() bool {
		st := c.Stats()
		return s.keys() == 20 && st.Processed+st.Replayed == 40
	})
	pub.publish(q, msg("k0", "x"), msg("k1", "x")) // after completion
	waitFor(t, 10*time.Second, "replays", func() bool { return c.Stats().Replayed >= 22 })
	stop()
	for i := range 20 {
		k := fmt.Sprintf("k%d", i)
		if n := s.runCount(k); n != 1 {
			t.Errorf("%s: got %d runs, want 1", k, n)
		}
	}
	st := c.Stats()
	if st.Processed != 20 || st.Replayed != 22 || st.DeadLettered != 0 {
		t.Errorf("got %+v, want 20 processed, 22 replayed (in-batch duplicates may be retried first), 0 dead-lettered", st)
	}
	conn := dial(t)
	for _, name := range []string{q, q + ".retry", q + ".dlq"} {
		if n := depth(t, conn, name); n != 0 {
			t.Errorf("%s: got %d messages left, want 0", name, n)
		}
	}
}

// TestRetryThenDeadLetter: a handler that keeps failing runs MaxDeliveries
// times through the retry queue, then the message lands in the dead-letter
// queue with the error, and the key is FAILED.
func TestRetryThenDeadLetter(t *testing.T) {
	q := testQueue(t)
	pub := newPublisher(t, q)
	exec := prooftest.MemExecutor(t, idem.WithLease(2*time.Second))
	var runs atomic.Int32
	boom := errors.New("boom")
	c, err := New(amqpURL(), q, exec, func(ctx context.Context, d *amqp.Delivery) error {
		if d.MessageId == "flaky" && runs.Add(1) > 1 {
			return nil // succeeds at the second delivery
		}
		if d.MessageId == "bad" {
			runs.Add(1)
		}
		return boom
	}, consumer.WithScope(q), consumer.WithMaxDeliveries(3), consumer.WithRetryDelay(20*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	pub.publish(q, msg("bad", "x"))
	stop := prooftest.Start(t, c.Run)
	conn := dial(t)
	waitFor(t, 20*time.Second, "the dead letter", func() bool { return depth(t, conn, q+".dlq") == 1 })
	if n := runs.Load(); n != 3 {
		t.Errorf("bad: got %d runs, want 3", n)
	}
	runs.Store(0)
	pub.publish(q, msg("flaky", "x"))
	waitFor(t, 20*time.Second, "flaky to complete", func() bool { return c.Stats().Processed == 1 })
	stop()
	if n := runs.Load(); n != 2 {
		t.Errorf("flaky: got %d runs, want 2", n)
	}
	st := c.Stats()
	if st.Retried != 3 || st.DeadLettered != 1 || st.Processed != 1 {
		t.Errorf("got %+v, want 3 retried, 1 dead-lettered, 1 processed", st)
	}
	ch, err := conn.Channel()
	if err != nil {
		t.Fatal(err)
	}
	d, ok, err := ch.Get(q+".dlq", true)
	if err != nil || !ok {
		t.Fatalf("get dead letter: %v %v", ok, err)
	}
	if d.MessageId != "bad" || d.Headers[HeaderError] == nil || d.Headers[HeaderQueue] != q {
		t.Errorf("dead letter: got id %q headers %v, want bad with %s and %s", d.MessageId, d.Headers, HeaderError, HeaderQueue)
	}
	if _, _, err := exec.Begin(t.Context(), idem.Key{Scope: q, ID: "bad"}, ""); !errors.As(err, new(*idem.FailedError)) {
		t.Errorf("key bad: got %v, want a *idem.FailedError", err)
	}
}

// TestNoKey: a message without a key (or with one over the limit) is
// dead-lettered and counted.
func TestNoKey(t *testing.T) {
	q := testQueue(t)
	pub := newPublisher(t, q)
	exec := prooftest.MemExecutor(t, idem.WithLease(2*time.Second))
	var runs atomic.Int32
	c, err := New(amqpURL(), q, exec, func(context.Context, *amqp.Delivery) error {
		runs.Add(1)
		return nil
	}, WithKeyHeader("order-id"), consumer.WithScope(q))
	if err != nil {
		t.Fatal(err)
	}
	long := make([]byte, storekit.MaxKeyLen+1)
	for i := range long {
		long[i] = 'a'
	}
	pub.publish(q, msg("has-message-id-but-no-header", "x"),
		amqp.Publishing{Headers: amqp.Table{"order-id": string(long)}},
		amqp.Publishing{Headers: amqp.Table{"order-id": "o1"}})
	stop := prooftest.Start(t, c.Run)
	conn := dial(t)
	waitFor(t, 10*time.Second, "2 dead letters", func() bool { return depth(t, conn, q+".dlq") == 2 })
	waitFor(t, 10*time.Second, "o1", func() bool { return c.Stats().Processed == 1 })
	stop()
	if st := c.Stats(); st.Invalid != 2 || st.DeadLettered != 2 {
		t.Errorf("got %+v, want 2 no-key, 2 dead-lettered", st)
	}
	if n := runs.Load(); n != 1 {
		t.Errorf("got %d runs, want 1", n)
	}
}

// TestInProgressDuplicate: a duplicate delivered to a second consumer while
// the first runs the handler is not acked as done: it goes through the
// retry queue until the key is COMPLETED, then is replayed.
func TestInProgressDuplicate(t *testing.T) {
	q := testQueue(t)
	pub := newPublisher(t, q)
	exec := prooftest.MemExecutor(t, idem.WithLease(2*time.Second))
	s := newSink()
	release := make(chan struct{})
	started := make(chan struct{}, 2)
	h := func(ctx context.Context, d *amqp.Delivery) error {
		started <- struct{}{}
		<-release
		s.run(ctx, d.MessageId)
		return nil
	}
	var cs []*Consumer
	for range 2 {
		c, err := New(amqpURL(), q, exec, h, consumer.WithBatchSize(1), WithPrefetch(1), WithMaxDelay(30*time.Millisecond), consumer.WithScope(q))
		if err != nil {
			t.Fatal(err)
		}
		cs = append(cs, c)
		prooftest.Start(t, c.Run)
	}
	pub.publish(q, msg("k", "x"), msg("k", "x"))
	<-started
	waitFor(t, 10*time.Second, "retries of the duplicate", func() bool {
		return cs[0].Stats().Retried+cs[1].Stats().Retried >= 3
	})
	close(release)
	waitFor(t, 10*time.Second, "the replay", func() bool {
		return cs[0].Stats().Replayed+cs[1].Stats().Replayed == 1
	})
	if n := s.runCount("k"); n != 1 {
		t.Errorf("got %d runs, want 1", n)
	}
}

// TestReconnect cuts the consumer's TCP connection twice while it consumes:
// RabbitMQ requeues the unacked deliveries, the consumer reconnects,
// re-declares and resumes, and every key takes effect once.
func TestReconnect(t *testing.T) {
	q := testQueue(t)
	pub := newPublisher(t, q)
	exec := prooftest.MemExecutor(t, idem.WithLease(2*time.Second))
	s := newSink()
	var k connKiller
	c, err := New(amqpURL(), q, exec, func(ctx context.Context, d *amqp.Delivery) error {
		s.run(ctx, d.MessageId)
		time.Sleep(time.Millisecond)
		return nil
	}, WithAMQPConfig(k.config()), WithBackoff(20*time.Millisecond, 200*time.Millisecond), consumer.WithBatchSize(20), consumer.WithScope(q))
	if err != nil {
		t.Fatal(err)
	}
	const n = 600
	var msgs []amqp.Publishing
	for i := range n {
		msgs = append(msgs, msg(fmt.Sprintf("k%d", i), "x"))
	}
	pub.publish(q, msgs...)
	stop := prooftest.Start(t, c.Run)
	waitFor(t, 20*time.Second, "100 keys", func() bool { return s.keys() >= 100 })
	k.kill()
	waitFor(t, 20*time.Second, "300 keys", func() bool { return s.keys() >= 300 })
	k.kill()
	waitFor(t, 30*time.Second, "all keys", func() bool { return s.keys() == n })
	conn := dial(t)
	waitFor(t, 20*time.Second, "an empty queue", func() bool { return depth(t, conn, q) == 0 && depth(t, conn, q+".retry") == 0 })
	stop()
	if st := c.Stats(); st.Errors < 2 {
		t.Errorf("got %d reconnects, want >= 2", st.Errors)
	}
	for i := range n {
		if a := s.appliedCount(fmt.Sprintf("k%d", i)); a != 1 {
			t.Fatalf("k%d: got %d effects, want 1", i, a)
		}
	}
	if d := depth(t, conn, q); d != 0 {
		t.Errorf("queue: got %d messages after shutdown, want 0", d)
	}
	t.Logf("stats %+v", c.Stats())
}

// TestGracefulShutdown: cancelling Run lets the handler in flight finish
// and acks it; the deliveries prefetched behind it go back to the queue.
func TestGracefulShutdown(t *testing.T) {
	q := testQueue(t)
	pub := newPublisher(t, q)
	exec := prooftest.MemExecutor(t, idem.WithLease(2*time.Second))
	entered := make(chan struct{}, 10)
	var finished atomic.Int32
	c, err := New(amqpURL(), q, exec, func(ctx context.Context, d *amqp.Delivery) error {
		entered <- struct{}{}
		time.Sleep(300 * time.Millisecond)
		finished.Add(1)
		return nil
	}, consumer.WithBatchSize(1), WithPrefetch(5), consumer.WithScope(q))
	if err != nil {
		t.Fatal(err)
	}
	pub.publish(q, msg("a", "x"), msg("b", "x"), msg("c", "x"))
	stop := prooftest.Start(t, c.Run)
	<-entered
	stop()
	if st := c.Stats(); st.Processed != 1 || finished.Load() != 1 {
		t.Errorf("got %+v and %d finished, want 1 processed and acked", st, finished.Load())
	}
	conn := dial(t)
	waitFor(t, 5*time.Second, "2 messages back in the queue", func() bool { return depth(t, conn, q) == 2 })
}

// TestShutdownTimeout: a handler that outlives the shutdown timeout has its
// context cancelled; its key is released and the message goes to the retry
// queue, not lost and not acked as done.
func TestShutdownTimeout(t *testing.T) {
	q := testQueue(t)
	pub := newPublisher(t, q)
	exec := prooftest.MemExecutor(t, idem.WithLease(2*time.Second))
	entered := make(chan struct{}, 1)
	c, err := New(amqpURL(), q, exec, func(ctx context.Context, d *amqp.Delivery) error {
		entered <- struct{}{}
		<-ctx.Done()
		return context.Cause(ctx)
	}, consumer.WithShutdownTimeout(100*time.Millisecond), WithMaxDelay(time.Hour), consumer.WithScope(q), consumer.WithRetryDelay(time.Hour))
	if err != nil {
		t.Fatal(err)
	}
	pub.publish(q, msg("slow", "x"))
	stop := prooftest.Start(t, c.Run)
	<-entered
	stop()
	if st := c.Stats(); st.Retried != 1 {
		t.Errorf("got %+v, want 1 retried", st)
	}
	conn := dial(t)
	if n := depth(t, conn, q) + depth(t, conn, q+".retry"); n != 1 {
		t.Errorf("got %d messages in the queue and the retry queue, want 1", n)
	}
	// The key was released: the next attempt gets it.
	_, a, err := exec.Begin(t.Context(), idem.Key{Scope: q, ID: "slow"}, "")
	if err != nil || a.Replayed() {
		t.Fatalf("begin after shutdown: got %v, want the key free", err)
	}
	_ = a.Release(t.Context())
}

// TestRunTwice: a second concurrent Run is refused.
func TestRunTwice(t *testing.T) {
	q := testQueue(t)
	exec := prooftest.MemExecutor(t, idem.WithLease(2*time.Second))
	c, err := New(amqpURL(), q, exec, nopHandler)
	if err != nil {
		t.Fatal(err)
	}
	prooftest.Start(t, c.Run)
	var wg sync.WaitGroup
	wg.Go(func() {
		time.Sleep(50 * time.Millisecond)
		if err := c.Run(t.Context()); err == nil {
			t.Errorf("second Run: got nil, want an error")
		}
	})
	wg.Wait()
}

// TestLeaseLost: when the lease is lost while the handler runs (here the
// record is deleted, as an operator or a takeover would), the handler's
// context is cancelled with idem.ErrLeaseLost and the message is not acked
// as done: its copy goes through the retry queue and runs again.
func TestLeaseLost(t *testing.T) {
	q := testQueue(t)
	pub := newPublisher(t, q)
	exec := prooftest.MemExecutor(t, idem.WithLease(300*time.Millisecond))
	var runs atomic.Int32
	entered := make(chan struct{}, 1)
	lost := make(chan error, 1)
	c, err := New(amqpURL(), q, exec, func(ctx context.Context, d *amqp.Delivery) error {
		if runs.Add(1) > 1 {
			return nil
		}
		entered <- struct{}{}
		<-ctx.Done()
		lost <- context.Cause(ctx)
		return context.Cause(ctx)
	}, consumer.WithScope(q), consumer.WithRetryDelay(10*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	pub.publish(q, msg("k", "x"))
	prooftest.Start(t, c.Run)
	<-entered
	if err := adapterkit.Store(exec).Delete(t.Context(), idem.Key{Scope: q, ID: "k"}.Digest()); err != nil {
		t.Fatal(err)
	}
	if err := <-lost; !errors.Is(err, idem.ErrLeaseLost) {
		t.Fatalf("handler context cause: got %v, want idem.ErrLeaseLost", err)
	}
	waitFor(t, 10*time.Second, "the second run to complete", func() bool { return c.Stats().Processed == 1 })
	if st := c.Stats(); st.Retried != 1 || runs.Load() != 2 {
		t.Errorf("got %+v and %d runs, want 1 retried and 2 runs", st, runs.Load())
	}
}

// TestReconnectServerClose has RabbitMQ itself close the consumer's
// connection (rabbitmqctl close_connection, a connection.close with
// CONNECTION_FORCED) while a batch is in flight: the consumer reconnects and
// every key takes effect once.
func TestReconnectServerClose(t *testing.T) {
	ctl, err := osexec.LookPath("rabbitmqctl")
	if err != nil {
		// The integration tests run against a local RabbitMQ, which ships
		// rabbitmqctl: its absence is a broken setup, not a reason to skip.
		t.Fatalf("rabbitmqctl not found (install rabbitmq-server): %v", err)
	}
	q := testQueue(t)
	pub := newPublisher(t, q)
	exec := prooftest.MemExecutor(t, idem.WithLease(2*time.Second))
	s := newSink()
	var k connKiller
	gate := make(chan struct{})
	c, err := New(amqpURL(), q, exec, func(ctx context.Context, d *amqp.Delivery) error {
		if s.keys() == 100 {
			<-gate
		}
		s.run(ctx, d.MessageId)
		return nil
	}, WithAMQPConfig(k.config()), WithBackoff(20*time.Millisecond, 200*time.Millisecond), consumer.WithBatchSize(20),
		consumer.WithScope(q))
	if err != nil {
		t.Fatal(err)
	}
	const n = 300
	var msgs []amqp.Publishing
	for i := range n {
		msgs = append(msgs, msg(fmt.Sprintf("k%d", i), "x"))
	}
	pub.publish(q, msgs...)
	prooftest.Start(t, c.Run)
	waitFor(t, 20*time.Second, "100 keys", func() bool { return s.keys() >= 100 })
	k.mu.Lock()
	nc := k.conns[len(k.conns)-1]
	k.mu.Unlock()
	name := nc.LocalAddr().String() + " -> " + nc.RemoteAddr().String()
	ctx, cancel := context.WithTimeout(t.Context(), 45*time.Second)
	defer cancel()
	out, err := osexec.CommandContext(ctx, ctl, "-q", "list_connections", "pid", "name").Output()
	if err != nil {
		close(gate)
		t.Fatalf("rabbitmqctl list_connections: %v", err)
	}
	pid := ""
	for line := range strings.Lines(string(out)) {
		if f := strings.SplitN(strings.TrimSpace(line), "\t", 2); len(f) == 2 && f[1] == name {
			pid = f[0]
		}
	}
	if pid == "" {
		close(gate)
		t.Fatalf("connection %q not in rabbitmqctl list_connections:\n%s", name, out)
	}
	out, err = osexec.CommandContext(ctx, ctl, "close_connection", pid, "idem test").CombinedOutput()
	close(gate)
	if err != nil {
		t.Fatalf("rabbitmqctl close_connection %s: %v\n%s", pid, err, out)
	}
	waitFor(t, 30*time.Second, "all keys", func() bool { return s.keys() == n })
	conn := dial(t)
	waitFor(t, 20*time.Second, "an empty queue", func() bool { return depth(t, conn, q) == 0 && depth(t, conn, q+".retry") == 0 })
	if st := c.Stats(); st.Errors < 1 {
		t.Errorf("got %+v, want a reconnect counted in Errors", st)
	}
	for i := range n {
		if a := s.appliedCount(fmt.Sprintf("k%d", i)); a != 1 {
			t.Fatalf("k%d: got %d effects, want 1", i, a)
		}
	}
}

// TestQueueDeleted: when the queue is deleted under the consumer, the
// broker cancels it; the consumer reconnects, declares the queue again and
// consumes what is published to it.
func TestQueueDeleted(t *testing.T) {
	q := testQueue(t)
	pub := newPublisher(t, q)
	exec := prooftest.MemExecutor(t, idem.WithLease(2*time.Second))
	c, err := New(amqpURL(), q, exec, nopHandler, WithBackoff(20*time.Millisecond, 100*time.Millisecond), consumer.WithScope(q))
	if err != nil {
		t.Fatal(err)
	}
	pub.publish(q, msg("a", "x"))
	prooftest.Start(t, c.Run)
	waitFor(t, 10*time.Second, "a", func() bool { return c.Stats().Processed == 1 })
	conn := dial(t)
	ch, err := conn.Channel()
	if err != nil {
		t.Fatal(err)
	}
	if _, err := ch.QueueDelete(q, false, false, false); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 10*time.Second, "a reconnect", func() bool { return c.Stats().Errors >= 1 })
	waitFor(t, 10*time.Second, "the queue to be declared again", func() bool {
		ch, err := conn.Channel()
		if err != nil {
			t.Fatal(err)
		}
		defer ch.Close()
		_, err = ch.QueueDeclarePassive(q, true, false, false, false, nil)
		return err == nil
	})
	pub.publish(q, msg("b", "x"))
	waitFor(t, 10*time.Second, "b", func() bool { return c.Stats().Processed == 2 })
}

// TestQuorumQueue: the consumer works on a quorum queue, and the failed
// attempts are counted toward the dead letter.
func TestQuorumQueue(t *testing.T) {
	q := testQueue(t)
	conn := dial(t)
	ch, err := conn.Channel()
	if err != nil {
		t.Fatal(err)
	}
	args := amqp.Table{"x-queue-type": "quorum"}
	if _, err := ch.QueueDeclare(q, true, false, false, false, args); err != nil {
		t.Fatal(err)
	}
	pub := newPublisherOn(t, ch)
	exec := prooftest.MemExecutor(t, idem.WithLease(2*time.Second))
	var badRuns atomic.Int32
	c, err := New(amqpURL(), q, exec, func(ctx context.Context, d *amqp.Delivery) error {
		if d.MessageId == "bad" {
			badRuns.Add(1)
			return errors.New("boom")
		}
		return nil
	}, WithQueueArgs(args), consumer.WithScope(q), consumer.WithMaxDeliveries(2), consumer.WithRetryDelay(10*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	pub.publish(q, msg("good", "x"), msg("good", "x"), msg("bad", "x"))
	prooftest.Start(t, c.Run)
	waitFor(t, 20*time.Second, "the dead letter", func() bool { return depth(t, conn, q+".dlq") == 1 })
	waitFor(t, 20*time.Second, "good", func() bool { st := c.Stats(); return st.Processed+st.Replayed == 2 })
	if n := badRuns.Load(); n != 2 {
		t.Errorf("bad: got %d runs, want 2", n)
	}
}

// TestDeadLetterExchange: dead letters go to the user's exchange, and a key
// seen again with another fingerprint is dead-lettered with
// idem.ErrMismatch.
func TestDeadLetterExchange(t *testing.T) {
	q := testQueue(t)
	pub := newPublisher(t, q)
	conn := dial(t)
	ch, err := conn.Channel()
	if err != nil {
		t.Fatal(err)
	}
	dlx, dlq := q+".dlx", q+".dead"
	if err := ch.ExchangeDeclare(dlx, "direct", false, true, false, false, nil); err != nil {
		t.Fatal(err)
	}
	if _, err := ch.QueueDeclare(dlq, false, false, false, false, nil); err != nil {
		t.Fatal(err)
	}
	if err := ch.QueueBind(dlq, "dead", dlx, false, nil); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_, _ = ch.QueueDelete(dlq, false, false, false)
		_ = ch.ExchangeDelete(dlx, false, false)
	})
	exec := prooftest.MemExecutor(t, idem.WithLease(2*time.Second))
	c, err := New(amqpURL(), q, exec, nopHandler,
		WithDeadLetterExchange(dlx, "dead"), consumer.WithBatchSize(1),
		WithFingerprint(func(d *amqp.Delivery) string { return string(d.Body) }), consumer.WithScope(q))
	if err != nil {
		t.Fatal(err)
	}
	pub.publish(q, msg("k", "one"), msg("k", "two"))
	prooftest.Start(t, c.Run)
	waitFor(t, 10*time.Second, "the dead letter", func() bool { return depth(t, conn, dlq) == 1 })
	d, ok, err := ch.Get(dlq, true)
	if err != nil || !ok {
		t.Fatalf("get: %v %v", ok, err)
	}
	if string(d.Body) != "two" || !strings.Contains(fmt.Sprint(d.Headers[HeaderError]), idem.ErrMismatch.Error()) {
		t.Errorf("got body %q, error %v, want two with %v", d.Body, d.Headers[HeaderError], idem.ErrMismatch)
	}
	if st := c.Stats(); st.Processed != 1 || st.DeadLettered != 1 || st.Invalid != 0 {
		t.Errorf("got %+v, want 1 processed, 1 dead-lettered, 0 no-key", st)
	}
}

// TestGracefulShutdownConcurrent: with two batches in flight, cancelling
// Run waits for both before closing the connection.
func TestGracefulShutdownConcurrent(t *testing.T) {
	q := testQueue(t)
	pub := newPublisher(t, q)
	exec := prooftest.MemExecutor(t, idem.WithLease(2*time.Second))
	entered := make(chan struct{}, 10)
	var finished atomic.Int32
	c, err := New(amqpURL(), q, exec, func(ctx context.Context, d *amqp.Delivery) error {
		entered <- struct{}{}
		time.Sleep(300 * time.Millisecond)
		finished.Add(1)
		return nil
	}, consumer.WithBatchSize(1), WithPrefetch(5), consumer.WithConcurrency(2), consumer.WithScope(q))
	if err != nil {
		t.Fatal(err)
	}
	pub.publish(q, msg("a", "x"), msg("b", "x"), msg("c", "x"), msg("d", "x"))
	stop := prooftest.Start(t, c.Run)
	<-entered
	<-entered
	stop()
	if st := c.Stats(); st.Processed != 2 || finished.Load() != 2 {
		t.Errorf("got %+v and %d finished, want 2 processed and acked", st, finished.Load())
	}
	conn := dial(t)
	waitFor(t, 5*time.Second, "2 messages back in the queue", func() bool { return depth(t, conn, q) == 2 })
}

// TestPoison: a handler that panics does not crash the consumer (the panic
// is the message's error, redelivered, then dead-lettered after the
// maximum), and a fingerprint over its limit is dead-lettered at its first
// delivery instead of going round the retry queue forever.
func TestPoison(t *testing.T) {
	q := testQueue(t)
	pub := newPublisher(t, q)
	exec := prooftest.MemExecutor(t, idem.WithLease(2*time.Second))
	var panics atomic.Int32
	c, err := New(amqpURL(), q, exec, func(_ context.Context, d *amqp.Delivery) error {
		if string(d.Body) == "panic" {
			panics.Add(1)
			panic("poison message")
		}
		return nil
	}, WithFingerprint(func(d *amqp.Delivery) string { return string(d.Body) }), consumer.WithScope(q), consumer.WithMaxDeliveries(2))
	if err != nil {
		t.Fatal(err)
	}
	pub.publish(q, msg("boom", "panic"), msg("long", strings.Repeat("f", storekit.MaxFingerprintLen+1)))
	stop := prooftest.Start(t, c.Run)
	conn := dial(t)
	waitFor(t, 20*time.Second, "2 dead letters", func() bool { return depth(t, conn, q+".dlq") == 2 })
	stop()
	if n := panics.Load(); n != 2 {
		t.Errorf("got %d panicking runs, want 2 (max deliveries)", n)
	}
	if st := c.Stats(); st.DeadLettered != 2 || st.Invalid != 1 {
		t.Errorf("got %+v, want 2 dead-lettered, 1 of them invalid", st)
	}
}

func TestKeyHelpers(t *testing.T) {
	d := &amqp.Delivery{Headers: amqp.Table{"k": "h1"}, Body: []byte(`{"id":"o-1","amount":5,"at":"now"}`)}
	if KeyHeader("k")(d) != "h1" || KeyField("id")(d) != "o-1" || KeyHash("id", "amount")(d) != consumer.HashKey("o-1", "5") {
		t.Fatalf("got %q %q %q", KeyHeader("k")(d), KeyField("id")(d), KeyHash("id", "amount")(d))
	}
}
