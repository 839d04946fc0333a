package kafka_test

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/idemgo/idem"
	"github.com/idemgo/idem/consumer/kafka"
	"github.com/idemgo/idem/testkit/prooftest"
	"github.com/twmb/franz-go/pkg/kgo"
)

// TestSenderToConsumer: messages a Sender produced, one of them twice (a
// relay that sent it again), reach a Consumer with its default settings
// under their keys, with payload and headers, the record key set to the
// idempotency key; the repeated one runs its handler once.
func TestSenderToConsumer(t *testing.T) {
	addrs := startCluster(t, 3, "orders")
	cl, err := kgo.NewClient(kgo.SeedBrokers(addrs...), kgo.ProducerLinger(time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(cl.Close)
	s, err := kafka.NewSender(cl, "orders")
	if err != nil {
		t.Fatal(err)
	}
	for _, m := range []struct{ key, payload string }{{"order-1:paid", "p1"}, {"order-2:paid", "p2"}, {"order-1:paid", "p1"}} {
		if err := s.Send(t.Context(), m.key, []byte(m.payload), map[string]string{"type": "order.paid", "traceparent": "00-ab"}); err != nil {
			t.Fatal(err)
		}
	}
	var mu sync.Mutex
	got := map[string][]*kgo.Record{}
	c, err := kafka.New(groupOpts(addrs, "g-sender", "orders"), prooftest.MemExecutor(t), func(ctx context.Context, r *kgo.Record) error {
		mu.Lock()
		defer mu.Unlock()
		k := string(kafka.KeyHeader(kafka.DefaultKeyHeader)(r))
		got[k] = append(got[k], r)
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	stop := prooftest.Start(t, c.Run)
	eventually(t, 20*time.Second, "3 records handled or replayed", func() bool { st := c.Stats(); return st.Processed+st.Replayed >= 3 })
	stop()
	mu.Lock()
	defer mu.Unlock()
	if len(got) != 2 || len(got["order-1:paid"]) != 1 || len(got["order-2:paid"]) != 1 {
		t.Fatalf("handler runs per key: got %d keys (%v), want one run for each of the 2 keys", len(got), got)
	}
	r := got["order-1:paid"][0]
	h := map[string]string{}
	for _, x := range r.Headers {
		h[x.Key] = string(x.Value)
	}
	if string(r.Key) != "order-1:paid" || string(r.Value) != "p1" || h["type"] != "order.paid" || h["traceparent"] != "00-ab" || len(h) != 3 {
		t.Fatalf("record: got key %q, value %q, headers %v; want the idempotency key, p1, and the 3 headers", r.Key, r.Value, h)
	}
}

func TestNewSenderValidates(t *testing.T) {
	if _, err := kafka.NewSender(nil, "t"); !errors.Is(err, idem.ErrInvalid) {
		t.Errorf("nil client: got %v, want idem.ErrInvalid", err)
	}
	cl, err := kgo.NewClient(kgo.SeedBrokers("127.0.0.1:1"))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	if _, err := kafka.NewSender(cl, ""); !errors.Is(err, idem.ErrInvalid) {
		t.Errorf("empty topic: got %v, want idem.ErrInvalid", err)
	}
}
