package kafka_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/idemgo/idem"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
)

// startCluster starts an in-process kfake cluster with topics of
// partitions partitions each.
func startCluster(t testing.TB, partitions int32, topics ...string) []string {
	t.Helper()
	c, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.SeedTopics(partitions, topics...))
	if err != nil {
		t.Fatalf("kfake: %v", err)
	}
	t.Cleanup(c.Close)
	return c.ListenAddrs()
}

// groupOpts are the client options of a test consumer: short heartbeats so
// that rebalances are quick.
func groupOpts(addrs []string, group string, topics ...string) []kgo.Opt {
	return []kgo.Opt{
		kgo.SeedBrokers(addrs...),
		kgo.ConsumerGroup(group),
		kgo.ConsumeTopics(topics...),
		kgo.FetchMaxWait(100 * time.Millisecond),
		kgo.HeartbeatInterval(200 * time.Millisecond),
		kgo.AutoCommitInterval(500 * time.Millisecond),
	}
}

// producer returns a client that produces to explicit partitions.
func producer(t testing.TB, addrs []string) *kgo.Client {
	t.Helper()
	cl, err := kgo.NewClient(kgo.SeedBrokers(addrs...), kgo.RecordPartitioner(kgo.ManualPartitioner()),
		kgo.ProducerLinger(time.Millisecond))
	if err != nil {
		t.Fatalf("producer: %v", err)
	}
	t.Cleanup(cl.Close)
	return cl
}

func produce(t testing.TB, cl *kgo.Client, rs ...*kgo.Record) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := cl.ProduceSync(ctx, rs...).FirstErr(); err != nil {
		t.Fatalf("produce: %v", err)
	}
}

// pending returns how many records of topics the group has not committed.
func pending(t testing.TB, addrs []string, group string, topics ...string) int64 {
	t.Helper()
	cl, err := kgo.NewClient(kgo.SeedBrokers(addrs...))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	adm := kadm.NewClient(cl)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	ends, err := adm.ListEndOffsets(ctx, topics...)
	if err != nil {
		t.Fatalf("list end offsets: %v", err)
	}
	committed, err := adm.FetchOffsets(ctx, group)
	if err != nil {
		t.Fatalf("fetch offsets: %v", err)
	}
	var n int64
	ends.Each(func(o kadm.ListedOffset) {
		at := int64(0)
		if c, ok := committed.Lookup(o.Topic, o.Partition); ok && c.At >= 0 {
			at = c.At
		}
		n += o.Offset - at
	})
	return n
}

// count returns the number of records in topic.
func count(t testing.TB, addrs []string, topic string) int64 {
	t.Helper()
	cl, err := kgo.NewClient(kgo.SeedBrokers(addrs...))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	ends, err := kadm.NewClient(cl).ListEndOffsets(ctx, topic)
	if err != nil {
		t.Fatalf("list end offsets: %v", err)
	}
	var n int64
	ends.Each(func(o kadm.ListedOffset) { n += o.Offset })
	return n
}

// readAll reads the n first records of topic.
func readAll(t testing.TB, addrs []string, topic string, n int) []*kgo.Record {
	t.Helper()
	cl, err := kgo.NewClient(kgo.SeedBrokers(addrs...), kgo.ConsumeTopics(topic),
		kgo.FetchMaxWait(100*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	var out []*kgo.Record
	for len(out) < n && ctx.Err() == nil {
		out = append(out, cl.PollFetches(ctx).Records()...)
	}
	return out
}

var errStale = errors.New("sink: stale fence")

// sink is a fenced side effect: it accepts a write for a key only if the
// writer's fence is above the stored one (UPDATE … WHERE fence < $1), and
// only while the writer's context is live (the write is a transaction that
// a cancelled context rolls back). It counts accepted writes (effects) and
// raw handler executions per key.
type sink struct {
	mu      sync.Mutex
	fence   map[string]int64
	effects map[string]int
	execs   map[string]int
}

func newSink() *sink {
	return &sink{fence: map[string]int64{}, effects: map[string]int{}, execs: map[string]int{}}
}

func (s *sink) apply(ctx context.Context, key string) error {
	f, ok := idem.FenceFrom(ctx)
	if !ok {
		return errors.New("sink: no fence in context")
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	s.execs[key]++
	if err := ctx.Err(); err != nil {
		return err
	}
	if f <= s.fence[key] {
		return fmt.Errorf("%w: %d <= %d", errStale, f, s.fence[key])
	}
	s.fence[key] = f
	s.effects[key]++
	return nil
}

// check returns the number of keys among want without an effect, with more
// than one, and the total number of executions.
func (s *sink) check(want []string) (lost, dup, execs int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, k := range want {
		switch n := s.effects[k]; {
		case n == 0:
			lost++
		case n > 1:
			dup++
		}
	}
	for _, n := range s.execs {
		execs += n
	}
	return lost, dup, execs
}

func (s *sink) applied() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.effects)
}

// eventually waits up to d for cond.
func eventually(t testing.TB, d time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(d)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %v waiting for %s", d, what)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// keyHeader returns the headers of a record whose idempotency key is key
// (the default key source, the header Idempotency-Key).
func keyHeader(key string) []kgo.RecordHeader {
	return []kgo.RecordHeader{{Key: "Idempotency-Key", Value: []byte(key)}}
}
