package redisstream

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/idemgo/idem"
	"github.com/redis/go-redis/v9"
)

// TestSenderToConsumer: messages a Sender appended, one of them twice (a
// relay that sent it again), reach a Consumer with its default settings
// under their keys, with payload and headers; the repeated one runs its
// handler once.
func TestSenderToConsumer(t *testing.T) {
	e := newEnv(t, standalone(t), "", time.Minute)
	s, err := NewSender(e.rdb, e.stream)
	if err != nil {
		t.Fatal(err)
	}
	msgs := []struct{ key, payload string }{{"order-1:paid", "p1"}, {"order-2:paid", "p2"}, {"order-1:paid", "p1"}}
	for _, m := range msgs {
		if err := s.Send(t.Context(), m.key, []byte(m.payload), map[string]string{"type": "order.paid", "traceparent": "00-ab"}); err != nil {
			t.Fatal(err)
		}
	}
	var mu sync.Mutex
	got := map[string][]map[string]any{}
	c := e.consumer("c1")
	err = e.run(c, func(ctx context.Context, msg redis.XMessage) error {
		mu.Lock()
		defer mu.Unlock()
		k, _ := msg.Values["key"].(string)
		got[k] = append(got[k], msg.Values)
		return nil
	}, func() bool { s := c.Stats(); return s.Processed+s.Replayed == 3 })
	if err != nil {
		t.Fatal(err)
	}
	mu.Lock()
	defer mu.Unlock()
	if len(got) != 2 || len(got["order-1:paid"]) != 1 || len(got["order-2:paid"]) != 1 {
		t.Fatalf("handler runs per key: got %v, want one for each of the 2 keys", got)
	}
	v := got["order-1:paid"][0]
	if v[PayloadField] != "p1" || v["type"] != "order.paid" || v["traceparent"] != "00-ab" || len(v) != 4 {
		t.Fatalf("entry fields: got %v, want key, payload p1, type and traceparent", v)
	}
}

func TestNewSenderValidates(t *testing.T) {
	if _, err := NewSender(nil, "s"); !errors.Is(err, idem.ErrInvalid) {
		t.Errorf("nil client: got %v, want idem.ErrInvalid", err)
	}
	if _, err := NewSender(redis.NewClient(&redis.Options{}), ""); !errors.Is(err, idem.ErrInvalid) {
		t.Errorf("empty stream: got %v, want idem.ErrInvalid", err)
	}
}
