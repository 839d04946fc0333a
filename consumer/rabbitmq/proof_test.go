package rabbitmq

import (
	"context"
	"math/rand/v2"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/idemgo/idem"
	"github.com/idemgo/idem/consumer"
	"github.com/idemgo/idem/redisstore"
	"github.com/idemgo/idem/testkit/prooftest"
	"github.com/idemgo/idem/testkit/redistest"
)

// proofMessages is the number of keyed messages of TestProof:
// IDEM_PROOF_MESSAGES, or 10,000.
func proofMessages(t *testing.T) int { return prooftest.Messages(t, 10000) }

// TestProof delivers N messages, 30% of them duplicates (half published
// concurrently with their original, half after it completed), plus a few
// without a key, to 4 consumers on a real RabbitMQ with a real Redis store.
// One consumer is killed in the middle of a batch: its TCP connection is
// cut and its handlers' context cancelled, so nothing of its batch is acked.
// The sink applies an effect per key only with a higher fence. The test
// asserts no lost key, no duplicate effect, every message acked or
// dead-lettered, and nothing left in the queues.
func TestProof(t *testing.T) {
	n := proofMessages(t)
	const noKeys = 20
	unique := n * 7 / 10
	dups := n - unique
	concurrentDups := dups / 2
	laterDups := dups - concurrentDups

	q := testQueue(t)
	pub := newPublisher(t, q)
	pub2 := newPublisher(t, q)
	srv := redistest.Start(t)
	newExec := func() *idem.Executor {
		rdb := srv.GoRedis(t)
		store, err := redisstore.New(rdb)
		if err != nil {
			t.Fatal(err)
		}
		exec, err := idem.New(store, idem.WithLease(3*time.Second))
		if err != nil {
			t.Fatal(err)
		}
		return exec
	}
	shared := newExec()

	s := newSink()
	var mu sync.Mutex
	resolved := map[string]bool{} // message instances acked or dead-lettered
	onResult := func(d *amqp.Delivery, r consumer.Result, requeued bool) {
		if requeued || r.Action == consumer.Retry {
			return
		}
		mu.Lock()
		resolved[d.Headers["x-test-id"].(string)] = true
		mu.Unlock()
	}
	resolvedCount := func() int {
		mu.Lock()
		defer mu.Unlock()
		return len(resolved)
	}
	opts := func(extra ...Option) []Option {
		return append([]Option{
			consumer.WithScope(q), consumer.WithRetryDelay(100 * time.Millisecond),
			consumer.WithBatchSize(50), WithBatchWait(5 * time.Millisecond), WithPrefetch(100),
			WithMaxDelay(200 * time.Millisecond),
			WithBackoff(20*time.Millisecond, 500*time.Millisecond),
		}, extra...)
	}
	handler := func(ctx context.Context, d *amqp.Delivery) error {
		s.run(ctx, d.MessageId)
		return nil
	}

	// The victim: its own connection (which the test cuts) and its own
	// Redis client and executor.
	var (
		killer      connKiller
		victimCtx   context.Context
		crash       context.CancelFunc
		calls       atomic.Int64
		inBatch     atomic.Int64
		crashed     atomic.Bool
		crashPos    atomic.Int64
		zombieKey   atomic.Value
		zombieFence atomic.Int64
	)
	victimCtx, crash = context.WithCancel(context.Background())
	crashAt := int64(n / 20)
	victimResult := func(d *amqp.Delivery, r consumer.Result, requeued bool) {
		inBatch.Store(0)
		onResult(d, r, requeued)
	}
	victim, err := New(amqpURL(), q, newExec(), func(ctx context.Context, d *amqp.Delivery) error {
		if crashed.Load() {
			<-ctx.Done() // the rest of the batch: the process is gone
			return ctx.Err()
		}
		pos := inBatch.Add(1)
		if calls.Add(1) >= crashAt && pos >= 2 && crashed.CompareAndSwap(false, true) {
			// Crash in the middle of a batch: cut the connection, cancel
			// the handlers. Nothing of this batch is acked.
			crashPos.Store(pos)
			fence, _ := idem.FenceFrom(ctx)
			zombieKey.Store(d.MessageId)
			zombieFence.Store(fence)
			s.mu.Lock()
			s.runs[d.MessageId]++
			s.mu.Unlock()
			killer.kill()
			crash()
			<-ctx.Done()
			return ctx.Err()
		}
		return handler(ctx, d)
	}, opts(WithAMQPConfig(killer.config()), consumer.WithShutdownTimeout(time.Millisecond))...)
	if err != nil {
		t.Fatal(err)
	}
	victim.settled = victimResult
	victimDone := make(chan error, 1)
	go func() { victimDone <- victim.Run(victimCtx) }()
	t.Cleanup(crash)

	var live []*Consumer
	for range 3 {
		c, err := New(amqpURL(), q, shared, handler, opts(consumer.WithConcurrency(2))...)
		if err != nil {
			t.Fatal(err)
		}
		c.settled = onResult
		live = append(live, c)
	}
	var stops []func()
	for _, c := range live {
		stops = append(stops, prooftest.Start(t, c.Run))
	}

	begin := time.Now()
	instance := 0
	newMsg := func(key string) amqp.Publishing {
		instance++
		return amqp.Publishing{
			MessageId: key, Body: []byte("payload of " + key), DeliveryMode: amqp.Persistent,
			Headers: amqp.Table{"x-test-id": strconv.Itoa(instance)},
		}
	}
	key := func(i int) string { return "order-" + strconv.Itoa(i) }

	// Phase 1: the originals on one connection and, concurrently, the
	// first duplicates on another, in chunks.
	var originals, concurrent [][]amqp.Publishing
	for i := 0; i < unique; i += 200 {
		var chunk []amqp.Publishing
		for j := i; j < min(i+200, unique); j++ {
			chunk = append(chunk, newMsg(key(j)))
		}
		originals = append(originals, chunk)
	}
	var chunk []amqp.Publishing
	for j := range concurrentDups {
		chunk = append(chunk, newMsg(key(j*unique/concurrentDups)))
		if len(chunk) == 200 || j == concurrentDups-1 {
			concurrent = append(concurrent, chunk)
			chunk = nil
		}
	}
	for range noKeys {
		m := newMsg("")
		originals[0] = append(originals[0], m)
	}
	var wg sync.WaitGroup
	wg.Go(func() {
		for _, c := range originals {
			pub.publish(q, c...)
		}
	})
	wg.Go(func() {
		for _, c := range concurrent {
			pub2.publish(q, c...)
		}
	})
	wg.Wait()
	total := instance

	patience := 90*time.Second + time.Duration(n)*5*time.Millisecond
	waitFor(t, patience, "every key's effect", func() bool { return s.keys() == unique })
	if !crashed.Load() {
		t.Fatalf("the victim did not crash (it ran %d handlers, crash at %d)", calls.Load(), crashAt)
	}

	// Phase 2: duplicates of completed keys.
	var later []amqp.Publishing
	for range laterDups {
		later = append(later, newMsg(key(rand.IntN(unique))))
	}
	total = instance
	pub.publish(q, later...)

	waitFor(t, patience, "every message acked or dead-lettered", func() bool { return resolvedCount() == total })
	elapsed := time.Since(begin)
	for _, stop := range stops {
		stop()
	}
	select {
	case err := <-victimDone:
		if err != nil {
			t.Errorf("victim Run: %v", err)
		}
	case <-time.After(10 * time.Second):
		t.Errorf("the victim's Run did not return")
	}

	// A zombie write from the crashed handler, after the key was taken
	// again: the fence rejects it.
	staleBefore := s.stale
	zk, _ := zombieKey.Load().(string)
	if s.apply(zk, zombieFence.Load()) {
		t.Errorf("zombie write of %s with fence %d: applied, want rejected", zk, zombieFence.Load())
	}

	conn := dial(t)
	lost, duplicate, extraRuns := 0, 0, 0
	for i := range unique {
		k := key(i)
		switch a := s.appliedCount(k); {
		case a == 0:
			lost++
		case a > 1:
			duplicate += a - 1
		}
		extraRuns += max(s.runCount(k)-1, 0)
	}
	left, retryLeft, dlq := depth(t, conn, q), depth(t, conn, q+".retry"), depth(t, conn, q+".dlq")
	var sum Stats
	counted := map[*consumer.Processor]bool{} // consumers that share a processor share its counters
	for _, c := range append(live, victim) {
		if counted[c.proc] {
			continue
		}
		counted[c.proc] = true
		st := c.Stats()
		sum.Processed += st.Processed
		sum.Replayed += st.Replayed
		sum.Retried += st.Retried
		sum.DeadLettered += st.DeadLettered
		sum.Invalid += st.Invalid
		sum.Errors += st.Errors
	}
	t.Logf("messages=%d (unique keys %d, concurrent duplicates %d, later duplicates %d, no key %d), consumers=4, elapsed=%v (%.0f msg/s)",
		total, unique, concurrentDups, laterDups, noKeys, elapsed.Round(time.Millisecond), float64(total)/elapsed.Seconds())
	t.Logf("victim crashed at handler call %d, position %d of its batch; victim stats %+v", calls.Load(), crashPos.Load(), victim.Stats())
	t.Logf("counters: processed=%d replayed=%d retried=%d dead-lettered=%d invalid=%d broker errors (requeues, reconnects)=%d",
		sum.Processed, sum.Replayed, sum.Retried, sum.DeadLettered, sum.Invalid, sum.Errors)
	t.Logf("sink: keys=%d lost=%d duplicate-effects=%d handler-runs-beyond-one=%d stale-writes-rejected=%d (zombie %d)",
		s.keys(), lost, duplicate, extraRuns, s.stale, s.stale-staleBefore)
	t.Logf("broker at the end: queue=%d retry=%d dead-letter=%d; resolved %d of %d messages", left, retryLeft, dlq, resolvedCount(), total)

	if lost != 0 || duplicate != 0 {
		t.Errorf("got %d lost keys and %d duplicate effects, want 0 and 0", lost, duplicate)
	}
	if left != 0 || retryLeft != 0 {
		t.Errorf("got %d messages left in the queue and %d in the retry queue, want 0", left, retryLeft)
	}
	if dlq != noKeys || sum.Invalid != noKeys {
		t.Errorf("got %d dead letters and %d no-key, want %d", dlq, sum.Invalid, noKeys)
	}
	if s.stale-staleBefore != 1 {
		t.Errorf("got %d stale writes from the zombie, want 1", s.stale-staleBefore)
	}
}
