package natsconsumer_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/redis/go-redis/v9"

	"github.com/idemgo/idem"
	"github.com/idemgo/idem/consumer"
	natsconsumer "github.com/idemgo/idem/consumer/nats"
	"github.com/idemgo/idem/redisstore"
	"github.com/idemgo/idem/testkit/prooftest"
	"github.com/idemgo/idem/testkit/redistest"
)

// proofMessages is the default size of the proof; IDEM_PROOF_MESSAGES
// overrides it (the soak target sets 10000 or more).
const proofMessages = 10000

// TestProofExactlyOnceEffects delivers N messages, 30% of them duplicates
// (half published concurrently with their originals, half after the
// originals completed), plus a few poison messages (the handler always
// fails) and keyless ones, to 4 consumers on one durable JetStream
// consumer, with a real Redis store. One consumer crashes mid-batch: its
// handler stops (no effect), its connection is closed abruptly, and it
// acknowledges nothing more. The test asserts 0 lost keys, 0 duplicate
// effects, and a drained consumer (nothing pending, nothing unacked), and
// logs the counters.
func TestProofExactlyOnceEffects(t *testing.T) {
	n := prooftest.Messages(t, proofMessages)
	const (
		consumers  = 4
		batchSize  = 50
		poisonKeys = 5
		keyless    = 5
		lease      = 2 * time.Second
	)
	unique := n * 7 / 10
	dups := n - unique
	concurrentDups := dups / 2
	lateDups := dups - concurrentDups
	begin := time.Now()

	// The store: a real redis-server.
	srv := redistest.Start(t)

	_, js := connect(t)
	s := newStream(t, js, nil)
	s.consumer(t, func(c *jetstream.ConsumerConfig) { c.AckWait = lease })

	// newExec returns an Executor as one consumer process has it: its own
	// Redis client and store.
	newExec := func() *idem.Executor {
		rc := redis.NewClient(&redis.Options{Addr: srv.Addr()})
		t.Cleanup(func() { _ = rc.Close() })
		store, err := redisstore.New(rc)
		if err != nil {
			t.Fatal(err)
		}
		exec, err := idem.New(store, idem.WithLease(lease))
		if err != nil {
			t.Fatal(err)
		}
		return exec
	}

	key := func(i int) string { return "key-" + strconv.Itoa(i) }
	isPoison := func(k string) bool {
		i, _ := strconv.Atoi(k[len("key-"):])
		return i < poisonKeys
	}
	sk := prooftest.NewSink()

	// The consumers, each on its own connection, Redis client and Executor.
	// Consumer 0 is the victim.
	var (
		crashed      atomic.Bool
		crashSkipped atomic.Int64
		inProgress   atomic.Int64                  // naks of duplicates whose key was held elsewhere
		crashMsg     atomic.Pointer[jetstream.Msg] // the victim's handler crashes on this message
		crashBatch   atomic.Int64                  // the size of the batch it crashes in
		victimDone   atomic.Int64                  // messages the victim's handlers completed
	)
	crashAfter := int64(min(100, n/20)) // messages the victim handles before it crashes
	cs := make([]*natsconsumer.Consumer, consumers)
	stops := make([]func() error, consumers)
	for w := range consumers {
		nc, err := nats.Connect(natsURL)
		if err != nil {
			t.Fatalf("connect: %v", err)
		}
		t.Cleanup(nc.Close)
		wjs, err := jetstream.New(nc)
		if err != nil {
			t.Fatal(err)
		}
		wcons, err := wjs.Consumer(t.Context(), s.name, "workers")
		if err != nil {
			t.Fatal(err)
		}
		victim := w == 0
		h := func(ctx context.Context, m jetstream.Msg) error {
			if victim {
				if crashed.Load() {
					crashSkipped.Add(1)
					return errors.New("crashed")
				}
				if p := crashMsg.Load(); p != nil && m == *p {
					// The goroutine dies here, in the middle of its batch:
					// no effect, no more acks.
					crashed.Store(true)
					crashSkipped.Add(1)
					nc.Close()
					return errors.New("crashed")
				}
			}
			k := m.Headers().Get("Idem-Key")
			sk.Run(k)
			if isPoison(k) {
				return errors.New("poison")
			}
			if err := ctx.Err(); err != nil {
				return err
			}
			fence, ok := idem.FenceFrom(ctx)
			if !ok {
				return errors.New("no fence in context")
			}
			sk.Apply(k, fence)
			if victim {
				victimDone.Add(1)
			}
			return nil
		}
		c, err := natsconsumer.New(wjs, wcons, newExec(), h,
			consumer.WithScope(s.name), consumer.WithMaxDeliveries(3), consumer.WithRetryDelay(100*time.Millisecond),
			natsconsumer.WithKeyHeader("Idem-Key"),
			consumer.WithBatchSize(batchSize),
			natsconsumer.WithFetchMaxWait(200*time.Millisecond),
			consumer.WithShutdownTimeout(5*time.Second),
			consumer.WithEventHook(func(e consumer.Event) {
				var ip *idem.InProgressError
				if e.Result.Action == consumer.Retry && errors.As(e.Result.Err, &ip) {
					inProgress.Add(1)
				}
			}))
		if err != nil {
			t.Fatal(err)
		}
		cs[w] = c
		if !victim {
			stops[w] = runBg(t, c.Run)
			continue
		}
		// The victim runs its own fetch loop around ProcessBatch, so that
		// it can pick a message in the middle of a batch to crash on.
		stops[w] = runBg(t, func(ctx context.Context) error {
			for ctx.Err() == nil && !crashed.Load() {
				mb, err := wcons.Fetch(batchSize, jetstream.FetchMaxWait(200*time.Millisecond))
				if err != nil {
					continue
				}
				var msgs []jetstream.Msg
				for m := range mb.Messages() {
					msgs = append(msgs, m)
				}
				if len(msgs) >= 4 && victimDone.Load() >= crashAfter && crashMsg.Load() == nil {
					crashMsg.Store(&msgs[len(msgs)/2])
					crashBatch.Store(int64(len(msgs)))
				}
				c.ProcessBatch(ctx, msgs)
				if !crashed.Load() {
					// Its handler did not run (a replay, or a copy of a key
					// earlier in the batch): try the next batch.
					crashMsg.Store(nil)
				}
			}
			return nil
		})
	}

	// Publish: originals and concurrent duplicates from two goroutines at
	// once, then (after completion) the late duplicates.
	pub := func(k string, i int) {
		m := nats.NewMsg(s.name + ".orders")
		if k != "" {
			m.Header.Set("Idem-Key", k)
		}
		m.Data = []byte(strconv.Itoa(i))
		if _, err := js.PublishMsgAsync(m); err != nil {
			t.Errorf("publish: %v", err)
		}
	}
	waitPub := func() {
		select {
		case <-js.PublishAsyncComplete():
		case <-time.After(30 * time.Second):
			t.Fatal("publishes not acknowledged after 30s")
		}
	}
	var pw sync.WaitGroup
	pw.Go(func() {
		for i := range unique {
			pub(key(i), i)
		}
	})
	pw.Go(func() {
		// Odd duplicates trail their original by about two batches, so
		// that another consumer is likely to hold the key when they come;
		// even ones land next to it, often in the same batch.
		for j := range concurrentDups {
			lag := 0
			if j%2 == 1 {
				lag = 2 * batchSize
			}
			i := poisonKeys + (j-lag+unique)%(unique-poisonKeys)
			pub(key(i), i)
		}
		for range keyless {
			pub("", -1)
		}
	})
	pw.Wait()
	waitPub()

	wantKeys := unique - poisonKeys
	eventually(t, 40*time.Second, "every key applied once", func() bool { return sk.AppliedKeys() >= wantKeys })
	phase1 := time.Since(begin)
	for j := range lateDups {
		i := poisonKeys + (j*7)%(unique-poisonKeys)
		pub(key(i), i)
	}
	waitPub()
	cons, err := js.Consumer(t.Context(), s.name, "workers")
	if err != nil {
		t.Fatal(err)
	}
	info := waitDrained(t, cons, 40*time.Second)
	for w := range consumers {
		err := stops[w]()
		if w != 0 && !errors.Is(err, natsconsumer.ErrStopped) {
			t.Errorf("consumer %d: Run returned %v, want ErrStopped", w, err)
		}
	}
	elapsed := time.Since(begin)

	// Assertions: every consumer has stopped, so the sink is read alone.
	lost, dupEffects, reexecuted, execs := 0, 0, 0, 0
	for i := poisonKeys; i < unique; i++ {
		switch a := sk.Applied[key(i)]; {
		case a == 0:
			lost++
		case a > 1:
			dupEffects += a - 1
		}
	}
	for k, e := range sk.Executed {
		execs += e
		if e > 1 && !isPoison(k) {
			reexecuted++
		}
	}
	for i := range poisonKeys {
		if a := sk.Applied[key(i)]; a != 0 {
			t.Errorf("poison key %d has %d effects, want 0", i, a)
		}
	}
	dl := s.dlqMsgs(t)
	var total natsconsumer.Stats
	for w, c := range cs {
		st := c.Stats()
		t.Logf("consumer %d: %+v", w, st)
		total.Processed += st.Processed
		total.Replayed += st.Replayed
		total.Retried += st.Retried
		total.DeadLettered += st.DeadLettered
		total.Invalid += st.Invalid
		total.Errors += st.Errors
	}
	streamInfo, err := s.stream.Info(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("proof: %d messages (%d keys, %d poison; %d duplicates: %d concurrent, %d after completion; %d keyless), 4 consumers, batch %d, Redis store",
		streamInfo.State.Msgs, unique, poisonKeys, dups, concurrentDups, lateDups, keyless, batchSize)
	t.Logf("proof: victim crashed after %d messages, in a batch of %d, at message %d: %d handlers skipped; %d acks/naks failed on its closed connection",
		crashAfter, crashBatch.Load(), crashBatch.Load()/2+1, crashSkipped.Load(), cs[0].Stats().Errors)
	t.Logf("proof: %d deliveries of IN_PROGRESS duplicates nak'ed with a delay; %d replays beyond the %d duplicates (redeliveries of the victim's completed but unacked messages)",
		inProgress.Load(), int(total.Replayed)-dups, dups)
	t.Logf("proof: lost keys %d, duplicate effects %d, effects %d, handler executions %d, keys executed more than once (not poison) %d",
		lost, dupEffects, sk.Total, execs, reexecuted)
	t.Logf("proof: totals %+v; dead letters %d; consumer at end: pending %d, ack pending %d, delivered %d, ack floor %d",
		total, len(dl), info.NumPending, info.NumAckPending, info.Delivered.Stream, info.AckFloor.Stream)
	t.Logf("proof: phase 1 (all keys applied) %v, total %v (%.0f msg/s)", phase1.Round(time.Millisecond), elapsed.Round(time.Millisecond),
		float64(streamInfo.State.Msgs)/elapsed.Seconds())

	if lost != 0 || dupEffects != 0 {
		t.Errorf("got %d lost keys and %d duplicate effects, want 0 and 0", lost, dupEffects)
	}
	if sk.Total != wantKeys {
		t.Errorf("got %d effects, want %d", sk.Total, wantKeys)
	}
	if !crashed.Load() || crashSkipped.Load() < 1 || int(total.Replayed) <= dups {
		t.Errorf("the victim did not crash mid-batch (crashed %v, skipped %d, replays %d for %d duplicates)",
			crashed.Load(), crashSkipped.Load(), total.Replayed, dups)
	}
	seqs := map[string]bool{}
	for _, m := range dl {
		seqs[m.Header.Get(natsconsumer.HeaderOriginalSequence)] = true
	}
	if len(seqs) != poisonKeys+keyless {
		t.Errorf("got %d dead-lettered messages, want %d (poison and keyless)", len(seqs), poisonKeys+keyless)
	}
	if total.Invalid < keyless {
		t.Errorf("got %d no-key messages counted, want at least %d", total.Invalid, keyless)
	}
	if info.AckFloor.Stream != streamInfo.State.LastSeq {
		t.Errorf("got ack floor %d, want the last sequence %d: not every message was acked or terminated", info.AckFloor.Stream, streamInfo.State.LastSeq)
	}
	fmt.Fprintf(os.Stderr, "natsconsumer proof: %d messages, lost %d, duplicate effects %d, %v\n", streamInfo.State.Msgs, lost, dupEffects, elapsed.Round(time.Millisecond))
}
