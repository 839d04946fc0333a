package kafka_test

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idemgo/idem"
	"github.com/idemgo/idem/consumer"
	"github.com/idemgo/idem/consumer/kafka"
	"github.com/idemgo/idem/memstore"
	"github.com/idemgo/idem/testkit/prooftest"
	"github.com/twmb/franz-go/pkg/kgo"
)

func TestNewValidation(t *testing.T) {
	exec := prooftest.MemExecutor(t)
	addrs := startCluster(t, 1, "t")
	ok := func(context.Context, *kgo.Record) error { return nil }
	good := groupOpts(addrs, "g", "t")
	tests := []struct {
		name  string
		exec  *idem.Executor
		h     kafka.Handler
		kopts []kgo.Opt
		opts  []kafka.Option
	}{
		{"nil executor", nil, ok, good, nil},
		{"nil handler", exec, nil, good, nil},
		{"no group", exec, ok, []kgo.Opt{kgo.SeedBrokers(addrs...), kgo.ConsumeTopics("t")}, nil},
		{"disable autocommit", exec, ok, append(groupOpts(addrs, "g", "t"), kgo.DisableAutoCommit()), nil},
		{"block rebalance", exec, ok, append(groupOpts(addrs, "g", "t"), kgo.BlockRebalanceOnPoll()), nil},
		{"empty header", exec, ok, good, []kafka.Option{kafka.WithKeyHeader("")}},
		{"nil key func", exec, ok, good, []kafka.Option{kafka.WithKeyFunc(nil)}},
		{"two key sources", exec, ok, good, []kafka.Option{kafka.WithKeyHeader("k"), kafka.WithKeyFunc(func(*kgo.Record) string { return "" })}},
		{"zero batch", exec, ok, good, []kafka.Option{consumer.WithBatchSize(0)}},
		{"zero concurrency", exec, ok, good, []kafka.Option{consumer.WithConcurrency(0)}},
		{"negative shutdown", exec, ok, good, []kafka.Option{consumer.WithShutdownTimeout(-1)}},
		{"negative deliveries", exec, ok, good, []kafka.Option{consumer.WithMaxDeliveries(-1)}},
		{"negative retry delay", exec, ok, good, []kafka.Option{consumer.WithRetryDelay(-1)}},
	}
	c, err := kafka.New(good, exec, ok)
	if err != nil {
		t.Fatalf("valid configuration: %v", err)
	}
	c.Client().Close()
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c, err := kafka.New(tt.kopts, tt.exec, tt.h, tt.opts...)
			if err == nil {
				c.Client().Close()
				t.Fatal("got nil error, want one")
			}
			if !errors.Is(err, idem.ErrInvalid) {
				t.Errorf("got %v, want an error wrapping idem.ErrInvalid", err)
			}
		})
	}
}

// TestDuplicatesRunOnce: records with repeated keys run the handler once
// per key, everything is committed, and the counters add up.
func TestDuplicatesRunOnce(t *testing.T) {
	addrs := startCluster(t, 3, "orders")
	prod := producer(t, addrs)
	var rs []*kgo.Record
	for i := range 60 {
		key := fmt.Sprintf("k%d", i%40) // 20 duplicates
		rs = append(rs, &kgo.Record{Topic: "orders", Partition: int32(i % 3), Key: []byte(key), Value: []byte("v"), Headers: keyHeader(key)})
	}
	produce(t, prod, rs...)

	s := newSink()
	c, err := kafka.New(
		groupOpts(addrs, "g1", "orders"), prooftest.MemExecutor(t), func(ctx context.Context, r *kgo.Record) error {
			return s.apply(ctx, string(r.Key))
		})
	if err != nil {
		t.Fatal(err)
	}
	stop := prooftest.Start(t, c.Run)
	eventually(t, 20*time.Second, "40 effects", func() bool { return s.applied() == 40 })
	eventually(t, 20*time.Second, "all replayed", func() bool { st := c.Stats(); return st.Processed+st.Replayed >= 60 })
	stop()
	var want []string
	for i := range 40 {
		want = append(want, fmt.Sprintf("k%d", i))
	}
	lost, dup, execs := s.check(want)
	if lost != 0 || dup != 0 || execs != 40 {
		t.Errorf("got lost=%d dup=%d execs=%d, want 0, 0, 40", lost, dup, execs)
	}
	// A record that met its duplicate in flight is retried, and the
	// records after it in its partition are delivered again and replayed:
	// so at least 20 replays.
	if st := c.Stats(); st.Processed != 40 || st.Replayed < 20 || st.DeadLettered != 0 {
		t.Errorf("got %+v, want 40 processed and at least 20 replayed", st)
	}
	if n := pending(t, addrs, "g1", "orders"); n != 0 {
		t.Errorf("got %d pending records, want 0", n)
	}
	if err := c.Run(context.Background()); !errors.Is(err, idem.ErrInvalid) {
		t.Errorf("second Run: got %v, want an error wrapping idem.ErrInvalid", err)
	}
}

// TestNoKeyDeadLettered: a record without a key goes to the DLQ with the
// original headers plus the error headers, is counted, and is committed.
func TestNoKeyDeadLettered(t *testing.T) {
	addrs := startCluster(t, 1, "in", "in.dlq")
	prod := producer(t, addrs)
	produce(t, prod,
		&kgo.Record{Topic: "in", Value: []byte("no key"), Headers: []kgo.RecordHeader{{Key: "trace", Value: []byte("abc")}}},
		&kgo.Record{Topic: "in", Value: []byte("ok"), Headers: []kgo.RecordHeader{{Key: "id", Value: []byte("a")}}},
	)
	var ran atomic.Int32
	c, err := kafka.New(
		groupOpts(addrs, "g", "in"), prooftest.MemExecutor(t), func(context.Context, *kgo.Record) error { ran.Add(1); return nil },
		kafka.WithKeyHeader("id"))
	if err != nil {
		t.Fatal(err)
	}
	stop := prooftest.Start(t, c.Run)
	eventually(t, 20*time.Second, "dead letter", func() bool { return c.Stats().DeadLettered == 1 && ran.Load() == 1 })
	stop()
	if st := c.Stats(); st.Invalid != 1 || st.Processed != 1 {
		t.Errorf("got %+v, want 1 no-key and 1 processed", st)
	}
	dl := readAll(t, addrs, "in.dlq", 1)
	if len(dl) != 1 {
		t.Fatalf("got %d dead letters, want 1", len(dl))
	}
	h := map[string]string{}
	for _, x := range dl[0].Headers {
		h[x.Key] = string(x.Value)
	}
	if h["trace"] != "abc" || h[kafka.HeaderTopic] != "in" || h[kafka.HeaderOffset] != "0" || h[kafka.HeaderError] == "" {
		t.Errorf("got headers %v, want the original trace header plus topic, offset and error", h)
	}
	if string(dl[0].Value) != "no key" {
		t.Errorf("got value %q, want %q", dl[0].Value, "no key")
	}
	if n := pending(t, addrs, "g", "in"); n != 0 {
		t.Errorf("got %d pending records, want 0", n)
	}
}

// TestHandlerErrorRetriedInOrder: a failing record is redelivered (the
// partition is rewound to it) until it succeeds; a record that never
// succeeds is dead-lettered after MaxDeliveries handler runs and its key is
// FAILED. With one record per poll, effects keep offset order; with larger
// batches the records after a failing one run before its retry (a
// documented limit) and are replayed when they come again.
func TestHandlerErrorRetriedInOrder(t *testing.T) {
	for _, tt := range []struct {
		batch     int
		wantOrder string
	}{
		{1, "[a flaky b c]"},
		{100, "[a b c flaky]"},
	} {
		t.Run("batch="+strconv.Itoa(tt.batch), func(t *testing.T) {
			testHandlerErrorRetried(t, tt.batch, tt.wantOrder)
		})
	}
}

func testHandlerErrorRetried(t *testing.T, batch int, wantOrder string) {
	addrs := startCluster(t, 1, "jobs", "dead")
	prod := producer(t, addrs)
	var rs []*kgo.Record
	for _, k := range []string{"a", "flaky", "b", "poison", "c"} {
		rs = append(rs, &kgo.Record{Topic: "jobs", Key: []byte(k), Headers: keyHeader(k)})
	}
	produce(t, prod, rs...)
	var mu sync.Mutex
	runs := map[string]int{}
	var order []string
	exec := prooftest.MemExecutor(t)
	c, err := kafka.New(
		groupOpts(addrs, "g", "jobs"), exec, func(ctx context.Context, r *kgo.Record) error {
			k := string(r.Key)
			mu.Lock()
			defer mu.Unlock()
			runs[k]++
			switch {
			case k == "flaky" && runs[k] < 3:
				return errors.New("flaky: not yet")
			case k == "poison":
				return errors.New("poison: always fails")
			}
			order = append(order, k)
			return nil
		},
		consumer.WithMaxDeliveries(3), consumer.WithRetryDelay(10*time.Millisecond),
		consumer.WithDeadLetter("dead"), consumer.WithBatchSize(batch))
	if err != nil {
		t.Fatal(err)
	}
	stop := prooftest.Start(t, c.Run)
	eventually(t, 20*time.Second, "all done", func() bool { return c.Stats().Processed == 4 && c.Stats().DeadLettered == 1 })
	stop()
	mu.Lock()
	defer mu.Unlock()
	if got := fmt.Sprint(order); got != wantOrder {
		t.Errorf("got order %s, want %s", got, wantOrder)
	}
	if runs["flaky"] != 3 || runs["poison"] != 3 || runs["a"] != 1 || runs["b"] != 1 || runs["c"] != 1 {
		t.Errorf("got runs %v, want flaky and poison 3 times each, the others once", runs)
	}
	_, _, err = exec.Begin(context.Background(), idem.Key{Scope: kafka.DefaultScope, ID: "poison"}, "")
	var failed *idem.FailedError
	if !errors.As(err, &failed) {
		t.Errorf("got %v for the poison key, want a *idem.FailedError", err)
	}
	if n := count(t, addrs, "dead"); n != 1 {
		t.Errorf("got %d dead letters, want 1", n)
	}
	if n := pending(t, addrs, "g", "jobs"); n != 0 {
		t.Errorf("got %d pending records, want 0", n)
	}
}

// TestInProgressNotAcked: a record whose key is held by another owner is
// not committed; it is delivered again and replayed once the owner
// completes.
func TestInProgressNotAcked(t *testing.T) {
	addrs := startCluster(t, 1, "t")
	prod := producer(t, addrs)
	exec := prooftest.MemExecutor(t, idem.WithLease(time.Second))
	_, other, err := exec.Begin(context.Background(), idem.Key{Scope: kafka.DefaultScope, ID: "busy"}, "")
	if err != nil {
		t.Fatal(err)
	}
	produce(t, prod, &kgo.Record{Topic: "t", Key: []byte("busy"), Headers: keyHeader("busy")})
	var ran atomic.Int32
	c, err := kafka.New(
		groupOpts(addrs, "g", "t"), exec, func(context.Context, *kgo.Record) error { ran.Add(1); return nil })
	if err != nil {
		t.Fatal(err)
	}
	stop := prooftest.Start(t, c.Run)
	eventually(t, 10*time.Second, "a retry", func() bool { return c.Stats().Retried >= 1 })
	time.Sleep(700 * time.Millisecond) // past an auto-commit interval
	if n := pending(t, addrs, "g", "t"); n != 1 {
		t.Errorf("got %d pending records while in progress, want 1", n)
	}
	if err := other.Commit(context.Background(), nil); err != nil {
		t.Fatal(err)
	}
	eventually(t, 10*time.Second, "a replay", func() bool { return c.Stats().Replayed == 1 })
	stop()
	if ran.Load() != 0 {
		t.Errorf("got %d handler runs, want 0", ran.Load())
	}
	if n := pending(t, addrs, "g", "t"); n != 0 {
		t.Errorf("got %d pending records, want 0", n)
	}
}

// TestGracefulShutdown: a handler in flight when Run's context ends
// finishes and its record is committed; a handler that outlives the
// shutdown timeout is cancelled and its record stays uncommitted.
func TestGracefulShutdown(t *testing.T) {
	for _, tt := range []struct {
		name        string
		timeout     time.Duration
		wantPending int64
	}{
		{"finishes", 5 * time.Second, 0},
		{"times out", 50 * time.Millisecond, 1},
	} {
		t.Run(tt.name, func(t *testing.T) {
			addrs := startCluster(t, 1, "t")
			produce(t, producer(t, addrs), &kgo.Record{Topic: "t", Key: []byte("k"), Headers: keyHeader("k")})
			started := make(chan struct{})
			c, err := kafka.New(
				groupOpts(addrs, "g", "t"), prooftest.MemExecutor(t), func(ctx context.Context, r *kgo.Record) error {
					close(started)
					select {
					case <-time.After(500 * time.Millisecond):
						return nil
					case <-ctx.Done():
						return ctx.Err()
					}
				}, consumer.WithShutdownTimeout(tt.timeout))
			if err != nil {
				t.Fatal(err)
			}
			stop := prooftest.Start(t, c.Run)
			<-started
			stop()
			if n := pending(t, addrs, "g", "t"); n != tt.wantPending {
				t.Errorf("got %d pending, want %d (stats %+v)", n, tt.wantPending, c.Stats())
			}
		})
	}
}

// TestRebalanceWhileInFlight: a second consumer joins the group while the
// first is handling records; partitions move, in-flight handlers of revoked
// partitions are cancelled, and every key still has exactly one effect.
func TestRebalanceWhileInFlight(t *testing.T) {
	const n = 400
	addrs := startCluster(t, 6, "t")
	prod := producer(t, addrs)
	var keys []string
	var rs []*kgo.Record
	for i := range n {
		k := "key-" + strconv.Itoa(i)
		keys = append(keys, k)
		rs = append(rs, &kgo.Record{Topic: "t", Partition: int32(i % 6), Key: []byte(k), Headers: keyHeader(k)})
	}
	produce(t, prod, rs...)
	exec := prooftest.MemExecutor(t, idem.WithLease(2*time.Second))
	s := newSink()
	// The first consumer's handlers hold until the second consumer handled
	// a record, which it can only do after a rebalance moved partitions to
	// it: so the rebalance happens with handlers in flight.
	gate := make(chan struct{})
	var openGate sync.Once
	var cancelled, blocked atomic.Int32
	handler := func(first bool) kafka.Handler {
		return func(ctx context.Context, r *kgo.Record) error {
			if first {
				blocked.Add(1)
				select {
				case <-gate:
				case <-ctx.Done():
					cancelled.Add(1)
					return ctx.Err()
				case <-time.After(20 * time.Second):
					return errors.New("no rebalance within 20s")
				}
			} else {
				openGate.Do(func() { close(gate) })
			}
			return s.apply(ctx, string(r.Key))
		}
	}
	opts := []kafka.Option{consumer.WithBatchSize(1000), consumer.WithRetryDelay(20 * time.Millisecond)}
	a, err := kafka.New(groupOpts(addrs, "g", "t"), exec, handler(true), opts...)
	if err != nil {
		t.Fatal(err)
	}
	stopA := prooftest.Start(t, a.Run)
	eventually(t, 20*time.Second, "the first consumer blocked", func() bool { return blocked.Load() > 0 })
	b, err := kafka.New(groupOpts(addrs, "g", "t"), exec, handler(false), opts...)
	if err != nil {
		t.Fatal(err)
	}
	stopB := prooftest.Start(t, b.Run)
	eventually(t, 40*time.Second, "all keys", func() bool { return s.applied() == n })
	stopA()
	stopB()
	lost, dup, execs := s.check(keys)
	if lost != 0 || dup != 0 {
		t.Errorf("got %d lost and %d duplicate effects, want 0 and 0", lost, dup)
	}
	sa, sb := a.Stats(), b.Stats()
	t.Logf("a=%+v b=%+v executions=%d cancelled=%d", sa, sb, execs, cancelled.Load())
	if sb.Processed == 0 || cancelled.Load() == 0 {
		t.Errorf("got %d processed by the second consumer and %d cancelled handlers, want both > 0", sb.Processed, cancelled.Load())
	}
	if got := sa.Processed + sb.Processed; got != n {
		t.Errorf("got %d processed, want %d", got, n)
	}
	if p := pending(t, addrs, "g", "t"); p != 0 {
		t.Errorf("got %d pending records, want 0", p)
	}
}

// losingStore reports the lease lost on every Extend while lose is set.
type losingStore struct {
	idem.Store
	lose atomic.Bool
}

func (s *losingStore) Extend(ctx context.Context, key string, lease idem.Lease, d time.Duration) error {
	if s.lose.Load() {
		return idem.ErrLeaseLost
	}
	return s.Store.Extend(ctx, key, lease, d)
}

// TestLeaseLostNotAcked: when the lease heartbeat finds the lease lost, the
// handler's context is cancelled with ErrLeaseLost and the record is not
// committed; it is delivered again and completes then.
func TestLeaseLostNotAcked(t *testing.T) {
	addrs := startCluster(t, 1, "t")
	produce(t, producer(t, addrs), &kgo.Record{Topic: "t", Key: []byte("k"), Headers: keyHeader("k")})
	inner, err := memstore.New()
	if err != nil {
		t.Fatal(err)
	}
	st := &losingStore{Store: inner}
	st.lose.Store(true)
	exec, err := idem.New(st, idem.WithLease(30*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	var runs atomic.Int32
	var firstCause atomic.Value
	c, err := kafka.New(
		groupOpts(addrs, "g", "t"), exec, func(ctx context.Context, r *kgo.Record) error {
			if runs.Add(1) == 1 {
				<-ctx.Done()
				firstCause.Store(context.Cause(ctx))
				st.lose.Store(false)
				return ctx.Err()
			}
			return nil
		}, consumer.WithRetryDelay(10*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	stop := prooftest.Start(t, c.Run)
	eventually(t, 20*time.Second, "processed", func() bool { return c.Stats().Processed == 1 })
	stop()
	if cause, _ := firstCause.Load().(error); !errors.Is(cause, idem.ErrLeaseLost) {
		t.Errorf("got cause %v for the first run, want idem.ErrLeaseLost", cause)
	}
	// The lost attempt cannot release the key: the next delivery may find
	// it in progress until the lease expires, and then takes it over.
	if runs.Load() != 2 || c.Stats().Retried < 1 {
		t.Errorf("got %d runs and %+v, want 2 runs and at least 1 retry", runs.Load(), c.Stats())
	}
	if n := pending(t, addrs, "g", "t"); n != 0 {
		t.Errorf("got %d pending, want 0", n)
	}
}

// TestRevokeWithStuckHandler: a partition revoked while its handler ignores
// its context does not hold the rebalance: the handler is abandoned a
// second after the revoke (its record not committed, its key left to its
// lease), the group settles, and the record is consumed again and taken
// over with a higher fence once the lease ended.
func TestRevokeWithStuckHandler(t *testing.T) {
	addrs := startCluster(t, 2, "t")
	prod := producer(t, addrs)
	produce(t, prod, &kgo.Record{Topic: "t", Partition: 0, Key: []byte("stuck"), Headers: keyHeader("stuck")})
	exec := prooftest.MemExecutor(t, idem.WithLease(time.Second))
	release := make(chan struct{})
	var first sync.Once
	entered := make(chan int64, 1)
	var mu sync.Mutex
	var fences []int64 // of the runs after the stuck one
	h := func(ctx context.Context, r *kgo.Record) error {
		fence, _ := idem.FenceFrom(ctx)
		stuck := false
		first.Do(func() { stuck = true })
		if stuck {
			entered <- fence
			<-release // ignores ctx
			return nil
		}
		mu.Lock()
		fences = append(fences, fence)
		mu.Unlock()
		return nil
	}
	// An eager balancer revokes every partition at each rebalance, so the
	// stuck handler's partition is revoked when the second member joins.
	opts := append(groupOpts(addrs, "g", "t"), kgo.Balancers(kgo.RangeBalancer()))
	a, err := kafka.New(opts, exec, h, consumer.WithRetryDelay(20*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	prooftest.Start(t, a.Run)
	var fence int64
	select {
	case fence = <-entered:
	case <-time.After(20 * time.Second):
		t.Fatal("the handler did not start within 20s")
	}
	b, err := kafka.New(opts, exec, h, consumer.WithRetryDelay(20*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	prooftest.Start(t, b.Run)
	t.Cleanup(func() { close(release) }) // before the consumers' stops
	eventually(t, 20*time.Second, "the stuck record consumed again after the revoke (a revoke that waits for the handler holds the group)", func() bool {
		return a.Stats().Processed+b.Stats().Processed == 1
	})
	if st := a.Stats(); st.Abandoned != 1 {
		t.Errorf("first member: %+v, want 1 abandoned", st)
	}
	mu.Lock()
	defer mu.Unlock()
	if len(fences) != 1 || fences[0] <= fence {
		t.Errorf("runs after the stuck one had fences %v, want one above %d", fences, fence)
	}
}
