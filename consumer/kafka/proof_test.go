package kafka_test

import (
	"context"
	"errors"
	"math/rand/v2"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/idemgo/idem"
	"github.com/idemgo/idem/consumer"
	"github.com/idemgo/idem/consumer/kafka"
	"github.com/idemgo/idem/redisstore"
	"github.com/idemgo/idem/testkit/prooftest"
	"github.com/idemgo/idem/testkit/redistest"
)

// proofMessages is the number of messages of TestProof:
// IDEM_PROOF_MESSAGES, or 10,000.
func proofMessages(t *testing.T) int {
	if testing.Short() {
		return prooftest.Messages(t, 2000)
	}
	return prooftest.Messages(t, 10000)
}

// TestProof delivers N messages of which 30% are duplicates (half
// published right after their original to another partition, so that both
// are in flight at once; half published after the original completed),
// plus a few messages without a key, to 4 consumers of one group on a real
// Redis store. One consumer crashes in the middle of a batch: its handler
// contexts are cancelled and its client closed without committing. Every
// key must have exactly one effect in a fenced sink, every message must be
// committed or dead-lettered, and the group must have nothing pending.
func TestProof(t *testing.T) {
	const (
		partitions = 8
		consumers  = 4
		noKey      = 10
	)
	n := proofMessages(t)
	dups := n * 3 / 10
	uniques := n - dups
	concurrentDups := dups / 2
	lateDups := dups - concurrentDups

	srv := redistest.Start(t)
	addrs := startCluster(t, partitions, "proof", "proof.dlq")
	prod := producer(t, addrs)
	rng := rand.New(rand.NewPCG(1, 2))

	keys := make([]string, uniques)
	var phase1 []*kgo.Record
	rec := func(key string) *kgo.Record {
		return &kgo.Record{Topic: "proof", Partition: rng.Int32N(partitions),
			Headers: []kgo.RecordHeader{{Key: "id", Value: []byte(key)}}}
	}
	for i := range uniques {
		keys[i] = "order-" + strconv.Itoa(i)
		o := rec(keys[i])
		o.Partition = int32(i % partitions) // aligned, see below
		phase1 = append(phase1, o)
		if i < concurrentDups {
			// The duplicate goes to the next partition at about the same
			// position, so the two copies are handled at about the same
			// time, often by different consumers.
			d := rec(keys[i])
			d.Partition = (phase1[len(phase1)-1].Partition + 1) % partitions
			phase1 = append(phase1, d)
		}
	}
	for range noKey {
		phase1 = append(phase1, &kgo.Record{Topic: "proof", Partition: rng.Int32N(partitions), Value: []byte("no key")})
	}

	s := newSink()
	var victim atomic.Pointer[kafka.Consumer]
	var victimCalls, cancelledInVictim, inProgress atomic.Int32
	const crashAt = 150
	newConsumer := func(i int) *kafka.Consumer {
		rc := srv.GoRedis(t)
		st, err := redisstore.New(rc)
		if err != nil {
			t.Fatal(err)
		}
		exec, err := idem.New(st, idem.WithLease(5*time.Second))
		if err != nil {
			t.Fatal(err)
		}
		var self *kafka.Consumer
		h := func(ctx context.Context, r *kgo.Record) error {
			key := string(r.Headers[0].Value)
			if i == 0 {
				if victimCalls.Add(1) == crashAt {
					victim.Load().Crash()
				}
				if ctx.Err() != nil {
					cancelledInVictim.Add(1)
				}
			}
			// A little work, so that copies of a key handled by two
			// consumers overlap.
			select {
			case <-time.After(time.Duration(rand.IntN(1000)) * time.Microsecond):
			case <-ctx.Done():
			}
			return s.apply(ctx, key)
		}
		c, err := kafka.New(groupOpts(addrs, "proof-group", "proof"), exec, h,
			kafka.WithKeyHeader("id"), consumer.WithRetryDelay(50*time.Millisecond),
			consumer.WithBatchSize(100), consumer.WithScope("proof"),
			consumer.WithEventHook(func(e consumer.Event) {
				if errors.Is(e.Result.Err, idem.ErrInProgress) {
					inProgress.Add(1)
				}
			}))
		if err != nil {
			t.Fatal(err)
		}
		self = c
		if i == 0 {
			victim.Store(self)
		}
		return c
	}

	start := time.Now()
	cs := make([]*kafka.Consumer, consumers)
	stops := make([]func(), consumers)
	for i := range cs {
		cs[i] = newConsumer(i)
		stops[i] = prooftest.Start(t, cs[i].Run)
	}
	// Publish concurrently from two producers, in chunks, while the group
	// is consuming.
	var wg sync.WaitGroup
	for half := range 2 {
		wg.Go(func() {
			part := phase1[half*len(phase1)/2 : (half+1)*len(phase1)/2]
			for len(part) > 0 {
				m := min(len(part), 500)
				produce(t, prod, part[:m]...)
				part = part[m:]
			}
		})
	}
	wg.Wait()
	eventually(t, 60*time.Second, "every key applied", func() bool { return s.applied() == uniques })
	var late []*kgo.Record
	for i := range lateDups {
		late = append(late, rec(keys[uniques-1-i]))
	}
	produce(t, prod, late...)
	eventually(t, 60*time.Second, "nothing pending", func() bool {
		return pending(t, addrs, "proof-group", "proof") == 0
	})
	for _, stop := range stops {
		stop()
	}
	elapsed := time.Since(start)

	lost, dup, execs := s.check(keys)
	var total kafka.Stats
	for _, c := range cs {
		st := c.Stats()
		total.Processed += st.Processed
		total.Replayed += st.Replayed
		total.Retried += st.Retried
		total.DeadLettered += st.DeadLettered
		total.Invalid += st.Invalid
	}
	p := pending(t, addrs, "proof-group", "proof")
	dl := count(t, addrs, "proof.dlq")
	t.Logf("messages=%d (unique=%d concurrent-dups=%d late-dups=%d no-key=%d) consumers=%d crashed-after=%d-handler-calls cancelled-in-victim=%d in-progress-retries=%d",
		n+noKey, uniques, concurrentDups, lateDups, noKey, consumers, crashAt, cancelledInVictim.Load(), inProgress.Load())
	t.Logf("lost=%d duplicate-effects=%d handler-executions=%d pending=%d dlq-records=%d elapsed=%v",
		lost, dup, execs, p, dl, elapsed.Round(time.Millisecond))
	t.Logf("counters: processed=%d replayed=%d retried=%d dead-lettered=%d no-key=%d",
		total.Processed, total.Replayed, total.Retried, total.DeadLettered, total.Invalid)
	for i, c := range cs {
		t.Logf("consumer %d: %+v", i, c.Stats())
	}
	if lost != 0 || dup != 0 {
		t.Errorf("got %d lost keys and %d duplicate effects, want 0 and 0", lost, dup)
	}
	if total.Processed != int64(uniques) {
		t.Errorf("got %d processed, want one per key: %d", total.Processed, uniques)
	}
	if p != 0 {
		t.Errorf("got %d pending records, want 0", p)
	}
	if dl != noKey || total.Invalid != noKey {
		t.Errorf("got %d dead letters and %d no-key, want %d", dl, total.Invalid, noKey)
	}
	if victimCalls.Load() < crashAt {
		t.Errorf("the victim handled %d records, fewer than the %d before its crash", victimCalls.Load(), crashAt)
	}
}
