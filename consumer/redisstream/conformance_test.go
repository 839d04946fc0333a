package redisstream

import (
	"context"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/idemgo/idem"
	"github.com/idemgo/idem/consumer"
	"github.com/idemgo/idem/consumer/consumertest"
)

// TestConformance runs the adapter conformance suite on a real Redis.
func TestConformance(t *testing.T) {
	rdb := standalone(t)
	consumertest.Run(t, func(t *testing.T) consumertest.Harness {
		return &harness{e: newEnv(t, rdb, "", 200*time.Millisecond)}
	})
}

type harness struct{ e *env }

func (h *harness) Executor(*testing.T) *idem.Executor { return h.e.exec }

func (h *harness) Publish(t *testing.T, key string, payload []byte) {
	vals := []any{"body", string(payload)}
	if key != "" {
		vals = append(vals, "key", key)
	}
	h.e.add(vals...)
}

func (h *harness) Start(t *testing.T, opts []consumer.Option, hd consumertest.Handler) (func() consumer.Stats, func()) {
	h.e.stream = "s-" + t.Name()
	h.e.group = "g"
	c := h.e.consumer("c1", append([]consumer.Option{consumer.WithMaxDeliveries(consumertest.MaxDeliveries),
		consumer.WithRetryDelay(20 * time.Millisecond), WithClaimIdle(30 * time.Millisecond),
		WithFingerprint(func(m redis.XMessage) string { s, _ := m.Values["body"].(string); return s })}, opts...)...)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() {
		done <- runWith(ctx, c, func(ctx context.Context, m redis.XMessage) error {
			k, _ := m.Values["key"].(string)
			b, _ := m.Values["body"].(string)
			return hd(ctx, k, []byte(b))
		})
	}()
	return c.Stats, func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Run: %v", err)
		}
	}
}

func (h *harness) DeadLetters(t *testing.T) int {
	n, err := h.e.rdb.XLen(t.Context(), h.e.stream+":dlq").Result()
	if err != nil {
		t.Fatal(err)
	}
	return int(n)
}

// TestSidecarConformance runs the suite against the sidecar (package
// consumer/sidecar, the core of `idem consume`) on this adapter.
func TestSidecarConformance(t *testing.T) {
	rdb := standalone(t)
	consumertest.RunSidecar(t, func(t *testing.T) consumertest.Harness {
		return &harness{e: newEnv(t, rdb, "", 200*time.Millisecond)}
	})
}
