package sqsconsumer_test

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"net/http"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/service/sqs/types"
	"github.com/redis/go-redis/v9"

	"github.com/idemgo/idem"
	"github.com/idemgo/idem/consumer"
	sqsconsumer "github.com/idemgo/idem/consumer/sqs"
	"github.com/idemgo/idem/redisstore"
	"github.com/idemgo/idem/storekit"
	"github.com/idemgo/idem/testkit/prooftest"
	"github.com/idemgo/idem/testkit/redistest"
	"github.com/idemgo/idem/testkit/sqsfake"
)

// sink is a fenced side effect: a row per key that a write updates only
// with a higher fence (UPDATE … SET fence = $1 WHERE key = $2 AND fence <
// $1). It also counts raw handler executions.
type sink struct {
	mu       sync.Mutex
	fence    map[string]int64
	accepted map[string]int
	execs    map[string]int
	rejected int
	// crashed holds the fence of writes made by the consumer that was
	// killed before it could complete them.
	crashed map[string]int64
}

func newSink() *sink {
	return &sink{fence: map[string]int64{}, accepted: map[string]int{}, execs: map[string]int{}, crashed: map[string]int64{}}
}

func (s *sink) exec(key string) {
	s.mu.Lock()
	s.execs[key]++
	s.mu.Unlock()
}

func (s *sink) apply(key string, fence int64, byVictim bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if fence <= s.fence[key] {
		s.rejected++
		return
	}
	s.fence[key] = fence
	s.accepted[key]++
	if byVictim {
		s.crashed[key] = fence
	}
}

func (s *sink) applied() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.fence)
}

func proofMessages(t *testing.T) int { return prooftest.Messages(t, 10000) }

// TestProof delivers N messages, 30% of them duplicates (half sent right
// after their original, half after the originals completed), plus a few
// messages without a key, to 4 consumers of one queue on a real Redis store.
// One consumer is killed in the middle of a batch: its Redis and SQS
// connections fail from then on, so it neither completes nor deletes
// anything. The test checks that every key has exactly one effect (the
// killed consumer's uncompleted writes are superseded through the fence,
// never doubled by a completed owner), that every record is COMPLETED with
// the fence of the effect that stands, and that every message was deleted
// or dead-lettered.
func TestProof(t *testing.T) {
	n := proofMessages(t)
	const (
		consumers = 4
		noKey     = 10
		lease     = 2 * time.Second
	)
	unique := n * 7 / 10
	dups := n - unique
	early := dups / 2
	late := dups - early
	start := time.Now()

	srv := redistest.Start(t)
	rdb := redis.NewClient(&redis.Options{Addr: srv.Addr(), PoolSize: 16})
	t.Cleanup(func() { rdb.Close() })
	store, err := redisstore.New(rdb)
	if err != nil {
		t.Fatal(err)
	}
	exec, err := idem.New(store, idem.WithLease(lease))
	if err != nil {
		t.Fatal(err)
	}
	// The victim has its own Redis connection, closed when it is killed.
	victimRDB := redis.NewClient(&redis.Options{Addr: srv.Addr(), MaxRetries: -1})
	t.Cleanup(func() { victimRDB.Close() })
	victimStore, err := redisstore.New(victimRDB)
	if err != nil {
		t.Fatal(err)
	}
	victimExec, err := idem.New(victimStore, idem.WithLease(lease))
	if err != nil {
		t.Fatal(err)
	}

	f := startFake(t)
	qURL := f.CreateQueue("proof", sqsfake.QueueOptions{VisibilityTimeout: 3 * time.Second, DeadLetterQueue: "proof-dlq", MaxReceiveCount: 100})
	dURL := f.CreateQueue("proof-dlq", sqsfake.QueueOptions{})

	sk := newSink()
	var (
		victimCalls     atomic.Int64
		sinceReceive    atomic.Int64
		killed          atomic.Bool
		killedMidBatch  atomic.Int64
		victimTransport = &killable{base: http.DefaultTransport}
	)
	victimTransport.onRequest = func(target string) {
		if target == "AmazonSQS.ReceiveMessage" {
			sinceReceive.Store(0)
		}
	}
	killAfter := int64(unique / consumers / 3)
	var stopVictim context.CancelFunc
	kill := func() {
		// A crash: connections die, nothing more is completed, deleted or
		// made visible by this consumer.
		killed.Store(true)
		victimTransport.killed.Store(true)
		victimRDB.Close()
		stopVictim()
	}
	transient := func(key string, m types.Message) bool {
		// About 1% of keys fail on their first delivery.
		return len(key) > 0 && key[len(key)-1] == '7' && key[len(key)-2] == '0' && m.Attributes["ApproximateReceiveCount"] == "1"
	}
	handler := func(victim bool) sqsconsumer.Handler {
		return func(ctx context.Context, m types.Message) error {
			key := sqsconsumer.DefaultKey(m)
			if victim {
				if killed.Load() {
					return errKilled
				}
				calls := victimCalls.Add(1)
				if calls >= killAfter && sinceReceive.Load() >= 3 {
					killedMidBatch.Store(sinceReceive.Load())
					kill()
					return errKilled
				}
				sinceReceive.Add(1)
			}
			sk.exec(key)
			if transient(key, m) {
				return errors.New("transient downstream error")
			}
			fence, ok := idem.FenceFrom(ctx)
			if !ok {
				return errors.New("no fence in the handler's context")
			}
			sk.apply(key, fence, victim)
			return nil
		}
	}
	opts := []sqsconsumer.Option{
		consumer.WithBatchSize(10),
		sqsconsumer.WithWaitTime(time.Second),
		sqsconsumer.WithVisibilityTimeout(3 * time.Second),
		consumer.WithMaxDeliveries(20),
		consumer.WithRetryDelay(time.Second),
		consumer.WithShutdownTimeout(5 * time.Second),
	}
	cs := make([]*sqsconsumer.Consumer, consumers)
	done := make([]chan struct{}, consumers)
	cancels := make([]context.CancelFunc, consumers)
	for i := range consumers {
		victim := i == consumers-1
		client, e := f.client(nil), exec
		if victim {
			client, e = f.client(victimTransport), victimExec
		}
		c, err := sqsconsumer.New(client, qURL, dURL, e, handler(victim), opts...)
		if err != nil {
			t.Fatal(err)
		}
		cs[i] = c
		ctx, cancel := context.WithCancel(context.Background())
		cancels[i] = cancel
		if victim {
			stopVictim = cancel
		}
		done[i] = make(chan struct{})
		go func() {
			defer close(done[i])
			if err := c.Run(ctx); err != nil {
				t.Errorf("consumer %d: Run: %v", i, err)
			}
		}()
	}
	t.Cleanup(func() {
		for i := range consumers {
			cancels[i]()
			<-done[i]
		}
	})

	// Originals, each followed closely by some concurrent duplicates.
	key := func(i int) string { return fmt.Sprintf("key-%06d", i) }
	rng := rand.New(rand.NewPCG(1, 2))
	var order []string
	for i := range unique {
		order = append(order, key(i))
	}
	rng.Shuffle(len(order), func(i, j int) { order[i], order[j] = order[j], order[i] })
	for range early {
		// A copy right after a random message: it races its original.
		at := rng.IntN(len(order))
		order = append(order[:at+1], append([]string{order[at]}, order[at+1:]...)...)
	}
	go func() {
		for i, k := range order {
			f.Send("proof", "payload of "+k, keyAttr(k), "")
			if i%200 == 199 {
				time.Sleep(2 * time.Millisecond) // let consumers interleave
			}
		}
		for i := range noKey {
			f.Send("proof", fmt.Sprintf("keyless %d", i), nil, "")
		}
	}()

	// 50s per 10,000 messages: far above the ~10-15s a loaded machine needs
	// under -race, so that only a hang fails.
	deadline := time.Duration(max(1, n/10000)) * 50 * time.Second
	waitFor(t, deadline, "every key to have an effect", func() bool { return sk.applied() == unique })
	// Late duplicates, after their originals completed.
	for range late {
		k := key(rng.IntN(unique))
		f.Send("proof", "payload of "+k, keyAttr(k), "")
	}
	waitFor(t, deadline-time.Since(start), "the queue to drain", drained(f, "proof"))
	for i := range consumers {
		cancels[i]()
		<-done[i]
	}
	elapsed := time.Since(start)

	if !killed.Load() {
		t.Fatalf("the victim consumer was never killed (%d calls, kill after %d)", victimCalls.Load(), killAfter)
	}
	// Effects: every key exactly one standing effect; a second accepted
	// write is allowed only as the takeover of a write the killed consumer
	// made and never completed.
	lost, dupEffects, superseded := 0, 0, 0
	sk.mu.Lock()
	execs, multiExec := 0, 0
	for i := range unique {
		k := key(i)
		execs += sk.execs[k]
		if sk.execs[k] > 1 {
			multiExec++
		}
		switch a := sk.accepted[k]; {
		case a == 0:
			lost++
		case a == 1:
		case a == 2 && sk.crashed[k] != 0 && sk.crashed[k] < sk.fence[k]:
			superseded++
		default:
			dupEffects++
		}
	}
	rejected := sk.rejected
	crashedWrites := len(sk.crashed)
	finalFence := map[string]int64{}
	for k, v := range sk.fence {
		finalFence[k] = v
	}
	sk.mu.Unlock()
	if lost != 0 || dupEffects != 0 {
		t.Errorf("lost keys: got %d, want 0; duplicate effects: got %d, want 0", lost, dupEffects)
	}
	// Records: COMPLETED, with the fence of the standing effect.
	ctx := t.Context()
	badRecords := 0
	for i := range unique {
		k := key(i)
		rec, err := store.Get(ctx, cs[0].Processor().Key(k).Digest())
		if err != nil || rec.State != storekit.StateCompleted || rec.Fence != finalFence[k] {
			if badRecords < 5 {
				t.Errorf("record of %s: got %v fence %d (%v), want COMPLETED fence %d", k, rec.State, rec.Fence, err, finalFence[k])
			}
			badRecords++
		}
	}
	// Broker: every message deleted, the keyless ones after being
	// dead-lettered; nothing left, nothing redriven.
	main, dlq := f.Counts("proof"), f.Counts("proof-dlq")
	if main.Deleted != n+noKey || dlq.Sent != noKey || main.Redriven != 0 {
		t.Errorf("broker: %d deleted (want %d), %d dead-lettered (want %d), %d redriven (want 0)", main.Deleted, n+noKey, dlq.Sent, noKey, main.Redriven)
	}
	if superseded == 0 {
		t.Errorf("the victim was killed before any write of its batch: the mid-batch crash was not exercised")
	}
	var total sqsconsumer.Stats
	for _, c := range cs {
		s := c.Stats()
		total.Processed += s.Processed
		total.Replayed += s.Replayed
		total.Retried += s.Retried
		total.DeadLettered += s.DeadLettered
		total.Invalid += s.Invalid
		total.Errors += s.Errors
	}
	t.Logf("proof: %d messages (%d keys, %d duplicates: %d early, %d late) + %d keyless, %d consumers, victim killed after %d handler calls, %d into a batch, in %v",
		n, unique, dups, early, late, noKey, consumers, victimCalls.Load(), killedMidBatch.Load(), elapsed.Round(time.Millisecond))
	t.Logf("proof: lost keys %d, duplicate effects %d, bad records %d, handler executions %d (%d keys more than once), writes by the killed consumer %d, superseded by takeover %d, stale writes rejected %d",
		lost, dupEffects, badRecords, execs, multiExec, crashedWrites, superseded, rejected)
	t.Logf("proof: broker: received %d, deleted %d, dead-lettered %d, left %d; counters: processed %d, replayed %d, retried %d, dead-lettered %d, no-key %d, broker errors %d",
		main.Received, main.Deleted, dlq.Sent, main.Visible+main.InFlight+main.Delayed, total.Processed, total.Replayed, total.Retried, total.DeadLettered, total.Invalid, total.Errors)
}
