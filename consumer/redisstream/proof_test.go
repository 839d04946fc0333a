package redisstream

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/idemgo/idem"
	"github.com/idemgo/idem/consumer"
	"github.com/idemgo/idem/redisstore"
	"github.com/idemgo/idem/testkit/prooftest"
	"github.com/idemgo/idem/testkit/redistest"
)

// sink is the side effect of the proof: a table keyed by message key whose
// rows carry the fence of the write that set them, updated like
// "UPDATE … SET fence = $1 WHERE key = $2 AND fence < $1". It counts applied

// TestProof delivers N messages, 30% of them duplicates (half published
// concurrently with their original, half after it completed), plus a few
// without a key, to 4 consumers; one of them crashes in the middle of a
// batch (its records acquired, nothing completed or acknowledged, its
// client closed). Every key must have exactly one applied effect, and the
// group must end with nothing pending.
func TestProof(t *testing.T) {
	n := prooftest.Messages(t, 10000)
	srv := redistest.Start(t)
	const tag = "proof"
	stream := "{" + tag + "}:orders"
	group := "billing"
	lease := time.Second

	unique := n * 7 / 10
	dups := n - unique
	concurrentDups := dups / 2
	lateDups := dups - concurrentDups
	const noKey = 10
	const flakyEvery = 97 // every 97th key fails on its first execution

	pub := srv.GoRedis(t)
	ctx := t.Context()

	snk := prooftest.NewSink()
	var failedOnce sync.Map
	handler := func(ctx context.Context, msg redis.XMessage) error {
		key := msg.Values["key"].(string)
		fence, ok := idem.FenceFrom(ctx)
		if !ok {
			return errors.New("no fence in the handler's context")
		}
		snk.Run(key)
		i, _ := strconv.Atoi(key[1:])
		if i%flakyEvery == 0 {
			if _, loaded := failedOnce.LoadOrStore(key, true); !loaded {
				return errors.New("flaky downstream")
			}
		}
		snk.Apply(key, fence)
		return nil
	}

	type member struct {
		c   *Consumer
		rdb *redis.Client
	}
	newMember := func(name string) member {
		rdb := redis.NewClient(&redis.Options{Addr: srv.Addr(), PoolSize: 64})
		store, err := redisstore.New(rdb, redisstore.WithHashTag(tag))
		if err != nil {
			t.Fatal(err)
		}
		c, err := New(rdb, stream, group, name, executorOn(store, idem.WithLease(lease), idem.WithRetention(time.Hour)), nopHandler, consumer.WithBatchSize(50), WithBlock(100*time.Millisecond))
		if err != nil {
			t.Fatal(err)
		}
		return member{c, rdb}
	}
	if err := pub.XGroupCreateMkStream(ctx, stream, group, "0").Err(); err != nil {
		t.Fatal(err)
	}

	members := make([]member, 4)
	for i := range members {
		members[i] = newMember("c" + strconv.Itoa(i))
	}
	// Consumer 0 crashes at the start of its third batch that has work:
	// every key of that batch acquired, nothing run, completed or acked.
	victim := members[0]
	var victimBatches atomic.Int32
	crashed := make(chan struct{})
	victim.c.crash = func() bool {
		if victimBatches.Add(1) == 3 {
			close(crashed)
			return true
		}
		return false
	}

	runCtx, stop := context.WithCancel(ctx)
	var wg sync.WaitGroup
	errs := make([]error, len(members))
	for i, m := range members {
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs[i] = runWith(runCtx, m.c, handler)
			if i == 0 {
				m.rdb.Close() // abrupt: nothing more reaches Redis
			}
		}()
	}

	start := time.Now()
	publish := func(p redis.Pipeliner, key string, seq int) {
		vals := map[string]any{"seq": seq}
		if key != "" {
			vals["key"] = key
		}
		p.XAdd(ctx, &redis.XAddArgs{Stream: stream, Values: vals})
	}
	// Phase 1: originals, and concurrently published duplicates of some of
	// them from a second publisher.
	var pwg sync.WaitGroup
	pwg.Add(2)
	go func() {
		defer pwg.Done()
		for lo := 0; lo < unique; lo += 500 {
			_, err := pub.Pipelined(ctx, func(p redis.Pipeliner) error {
				for i := lo; i < min(lo+500, unique); i++ {
					publish(p, "k"+strconv.Itoa(i), i)
				}
				return nil
			})
			if err != nil {
				t.Error(err)
				return
			}
		}
	}()
	go func() {
		defer pwg.Done()
		pub2 := redis.NewClient(&redis.Options{Addr: srv.Addr()})
		defer pub2.Close()
		step := unique / concurrentDups
		for lo := 0; lo < concurrentDups; lo += 250 {
			_, err := pub2.Pipelined(ctx, func(p redis.Pipeliner) error {
				for j := lo; j < min(lo+250, concurrentDups); j++ {
					publish(p, "k"+strconv.Itoa(j*step), unique+j)
				}
				for j := 0; lo == 0 && j < noKey; j++ {
					publish(p, "", -1)
				}
				return nil
			})
			if err != nil {
				t.Error(err)
				return
			}
		}
	}()
	pwg.Wait()

	deadline := time.Now().Add(45 * time.Second)
	waitFor := func(what string, cond func() bool) {
		t.Helper()
		for !cond() {
			if time.Now().After(deadline) {
				t.Fatalf("timed out waiting for %s", what)
			}
			time.Sleep(20 * time.Millisecond)
		}
	}
	waitFor("every key's effect", func() bool { return snk.AppliedKeys() == unique })
	select {
	case <-crashed:
	default:
		t.Fatal("the victim consumer never crashed")
	}

	// Phase 2: duplicates of completed keys.
	_, err := pub.Pipelined(ctx, func(p redis.Pipeliner) error {
		for j := range lateDups {
			publish(p, "k"+strconv.Itoa((j*7)%unique), 2*unique+j)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	lastID, err := pub.XRevRangeN(ctx, stream, "+", "-", 1).Result()
	if err != nil || len(lastID) != 1 {
		t.Fatalf("XREVRANGE: %v %v", lastID, err)
	}
	waitFor("an empty pending list", func() bool {
		groups, err := pub.XInfoGroups(ctx, stream).Result()
		if err != nil || len(groups) != 1 {
			return false
		}
		return groups[0].Pending == 0 && groups[0].LastDeliveredID == lastID[0].ID
	})
	elapsed := time.Since(start)
	stop()
	wg.Wait()
	if !errors.Is(errs[0], errCrashed) {
		t.Errorf("victim Run = %v, want the simulated crash", errs[0])
	}
	for i, err := range errs[1:] {
		if err != nil {
			t.Errorf("consumer %d: Run = %v", i+1, err)
		}
	}

	// The verdict.
	lost, dup, extraRuns := 0, 0, 0
	for i := range unique {
		key := "k" + strconv.Itoa(i)
		switch a := snk.Applied[key]; {
		case a == 0:
			lost++
		case a > 1:
			dup++
		}
		extraRuns += max(snk.Executed[key]-1, 0)
	}
	total := consumer.Stats{}
	for i, m := range members {
		s := m.c.Stats()
		t.Logf("consumer %d: %+v", i, s)
		total.Processed += s.Processed
		total.Replayed += s.Replayed
		total.Retried += s.Retried
		total.DeadLettered += s.DeadLettered
		total.Invalid += s.Invalid
		total.Redelivered += s.Redelivered
		total.Errors += s.Errors
	}
	dlq, err := pub.XLen(ctx, stream+":dlq").Result()
	if err != nil {
		t.Fatal(err)
	}
	published, _ := pub.XLen(ctx, stream).Result()
	t.Logf("messages %d (unique keys %d, concurrent duplicates %d, late duplicates %d, no key %d) in %v",
		published, unique, concurrentDups, lateDups, noKey, elapsed.Round(time.Millisecond))
	t.Logf("total: %+v; dead-letter stream %d; lost keys %d, duplicate effects %d, handler executions beyond the first %d (flaky failures), stale writes refused by the fence %d",
		total, dlq, lost, dup, extraRuns, snk.Stale)
	if lost != 0 || dup != 0 {
		t.Errorf("lost keys %d, duplicate effects %d; want 0 and 0", lost, dup)
	}
	if dlq != noKey || total.Invalid != noKey {
		t.Errorf("dead-letter stream has %d entries, no-key counter %d; want %d", dlq, total.Invalid, noKey)
	}
	if total.Processed != int64(unique) {
		t.Errorf("processed %d, want %d (one per key)", total.Processed, unique)
	}
	if want := int64(int(published) - unique - noKey); total.Replayed != want {
		t.Errorf("replayed %d, want %d", total.Replayed, want)
	}
	if fmt.Sprint(total.Redelivered) == "0" {
		t.Error("nothing was claimed: the crash recovery path did not run")
	}
}
