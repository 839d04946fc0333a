package kafka_test

import (
	"context"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/idemgo/idem"
	"github.com/idemgo/idem/consumer"
	"github.com/idemgo/idem/consumer/kafka"
	"github.com/idemgo/idem/memstore"
	"github.com/idemgo/idem/storekit"
	"github.com/idemgo/idem/testkit/prooftest"
)

// TestPanicDeadLetteredAcrossRestarts: a handler that always panics does
// not crash the consumer; the panic is the record's error. The consumer is
// restarted after every delivery (a new Consumer on the same store, so
// nothing of the count survives in memory), and the record is still
// dead-lettered after MaxDeliveries: the count is the key's acquisitions
// in the store.
func TestPanicDeadLetteredAcrossRestarts(t *testing.T) {
	addrs := startCluster(t, 1, "in", "in.dlq")
	produce(t, producer(t, addrs), &kgo.Record{Topic: "in", Value: []byte("poison"), Headers: keyHeader("p")})
	store, err := memstore.New()
	if err != nil {
		t.Fatal(err)
	}
	var runs atomic.Int32
	const maxDeliveries = 3
	for delivery := 1; delivery <= maxDeliveries; delivery++ {
		exec, err := idem.New(store, idem.WithLease(time.Second))
		if err != nil {
			t.Fatal(err)
		}
		c, err := kafka.New(
			groupOpts(addrs, "g", "in"), exec, func(context.Context, *kgo.Record) error {
				runs.Add(1)
				panic("poison record")
			}, kafka.WithKeyHeader("Idempotency-Key"), consumer.WithMaxDeliveries(maxDeliveries), consumer.WithRetryDelay(time.Hour))
		// one delivery per process
		if err != nil {
			t.Fatal(err)
		}
		stop := prooftest.Start(t, c.Run)
		eventually(t, 20*time.Second, "the next handler run", func() bool { return int(runs.Load()) >= delivery })
		if delivery == maxDeliveries {
			eventually(t, 20*time.Second, "the dead letter", func() bool { return c.Stats().DeadLettered == 1 })
		}
		stop()
	}
	if n := runs.Load(); n != maxDeliveries {
		t.Errorf("handler ran %d times, want %d", n, maxDeliveries)
	}
	if n := count(t, addrs, "in.dlq"); n != 1 {
		t.Fatalf("got %d dead letters, want 1", n)
	}
	dl := readAll(t, addrs, "in.dlq", 1)
	for _, h := range dl[0].Headers {
		if h.Key == kafka.HeaderError && !strings.Contains(string(h.Value), consumer.ErrPanic.Error()) {
			t.Errorf("dead letter error %q, want the panic", h.Value)
		}
	}
}

// TestPoisonLengthsDeadLetteredAtOnce: a key or fingerprint over its limit
// is dead-lettered at its first delivery; it never holds the partition.
func TestPoisonLengthsDeadLetteredAtOnce(t *testing.T) {
	addrs := startCluster(t, 1, "in", "in.dlq")
	produce(t, producer(t, addrs),
		&kgo.Record{Topic: "in", Value: []byte("long key"), Headers: keyHeader(strings.Repeat("k", storekit.MaxKeyLen+1))},
		&kgo.Record{Topic: "in", Value: []byte(strings.Repeat("f", storekit.MaxFingerprintLen+1)), Headers: keyHeader("long-fp")},
		&kgo.Record{Topic: "in", Value: []byte("ok"), Headers: keyHeader("ok")},
	)
	var ran atomic.Int32
	c, err := kafka.New(
		groupOpts(addrs, "g", "in"), prooftest.MemExecutor(t), func(context.Context, *kgo.Record) error { ran.Add(1); return nil },
		kafka.WithKeyHeader("Idempotency-Key"), kafka.WithFingerprint(func(r *kgo.Record) string { return string(r.Value) }),
		consumer.WithRetryDelay(10*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	stop := prooftest.Start(t, c.Run)
	eventually(t, 20*time.Second, "two dead letters and the good record", func() bool {
		return c.Stats().DeadLettered == 2 && c.Stats().Processed == 1
	})
	stop()
	if st := c.Stats(); st.Retried != 0 || ran.Load() != 1 {
		t.Errorf("got %+v and %d handler runs, want no retry and one run", st, ran.Load())
	}
	if n := pending(t, addrs, "g", "in"); n != 0 {
		t.Errorf("got %d pending records, want 0", n)
	}
}

// TestRecordKeyIsNotTheDefault: two different events with the same record
// key (a partition key, here a customer) both run their handler; a record
// with a record key but no Idempotency-Key header is dead-lettered, never
// taken for a duplicate.
func TestRecordKeyIsNotTheDefault(t *testing.T) {
	addrs := startCluster(t, 1, "in", "in.dlq")
	produce(t, producer(t, addrs),
		&kgo.Record{Topic: "in", Key: []byte("customer-7"), Value: []byte("order 1"), Headers: keyHeader("evt-1")},
		&kgo.Record{Topic: "in", Key: []byte("customer-7"), Value: []byte("order 2"), Headers: keyHeader("evt-2")},
		&kgo.Record{Topic: "in", Key: []byte("customer-7"), Value: []byte("order 3")},
	)
	var ran atomic.Int32
	c, err := kafka.New(
		groupOpts(addrs, "g", "in"), prooftest.MemExecutor(t), func(context.Context, *kgo.Record) error { ran.Add(1); return nil })
	if err != nil {
		t.Fatal(err)
	}
	stop := prooftest.Start(t, c.Run)
	eventually(t, 20*time.Second, "every record settled", func() bool {
		st := c.Stats()
		return st.Processed+st.Replayed+st.DeadLettered == 3
	})
	stop()
	if st := c.Stats(); st.Processed != 2 || st.Replayed != 0 || st.DeadLettered != 1 || ran.Load() != 2 {
		t.Errorf("got %+v and %d handler runs, want 2 processed, 1 dead-lettered (no key), 2 runs", st, ran.Load())
	}
	// The record key stays available as an explicit choice.
	if _, err := kafka.New(
		groupOpts(addrs, "g2", "in"), prooftest.MemExecutor(t), func(context.Context, *kgo.Record) error { return nil },
		kafka.WithRecordKey()); err != nil {
		t.Errorf("WithRecordKey: %v", err)
	}
}

func TestKeyHelpers(t *testing.T) {
	r := &kgo.Record{Headers: keyHeader("h1"), Value: []byte(`{"id":"o-1","amount":5,"at":"now"}`)}
	if kafka.KeyHeader(kafka.DefaultKeyHeader)(r) != "h1" || kafka.KeyField("id")(r) != "o-1" || kafka.KeyHash("id", "amount")(r) != consumer.HashKey("o-1", "5") {
		t.Fatalf("got %q %q %q", kafka.KeyHeader(kafka.DefaultKeyHeader)(r), kafka.KeyField("id")(r), kafka.KeyHash("id", "amount")(r))
	}
}
