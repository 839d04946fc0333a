// Package consumertest is the conformance suite of broker consumer
// adapters, as storetest is the Store's: every adapter of this repository
// runs it against its real broker (kfake for Kafka). An adapter provides a
// Harness; Run checks what package consumer promises of every adapter.
package consumertest

import (
	"context"
	"errors"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/idemgo/idem"
	"github.com/idemgo/idem/consumer"
)

// MaxDeliveries is the maximum of deliveries the suite configures.
const MaxDeliveries = 2

// Handler is the suite's handler: it gets the message's key (as the suite
// published it) and payload.
type Handler func(ctx context.Context, key string, payload []byte) error

// Harness is one adapter on a fresh queue (topic, stream, subject) of its
// real broker.
type Harness interface {
	// Publish sends a message whose idempotency key is key (none if
	// empty), with payload, where the adapter's default key source (or the
	// one the harness configures) finds it.
	Publish(t *testing.T, key string, payload []byte)
	// Start runs one consumer of the queue until stop is called; its
	// Processor has opts (the suite passes consumer.WithMaxDeliveries and a
	// short consumer.WithRetryDelay) and a fingerprint of the payload.
	// stats returns the consumer's Stats.
	Start(t *testing.T, opts []consumer.Option, h Handler) (stats func() consumer.Stats, stop func())
	// DeadLetters returns how many messages the dead-letter path holds.
	DeadLetters(t *testing.T) int
}

// Run runs the suite; newHarness returns a harness on a fresh queue.
func Run(t *testing.T, newHarness func(t *testing.T) Harness) {
	opts := []consumer.Option{consumer.WithMaxDeliveries(MaxDeliveries), consumer.WithRetryDelay(20 * time.Millisecond)}
	t.Run("CompletedDuplicateAckedWithoutHandler", func(t *testing.T) {
		h := newHarness(t)
		r := newRuns()
		stats, stop := h.Start(t, opts, r.handler(nil))
		defer stop()
		h.Publish(t, "k1", []byte("a"))
		waitFor(t, "the first run", func() bool { return stats().Processed == 1 })
		h.Publish(t, "k1", []byte("a"))
		waitFor(t, "the duplicate's replay", func() bool { return stats().Replayed == 1 })
		if n := r.count("k1"); n != 1 {
			t.Errorf("handler ran %d times for one key, want 1", n)
		}
	})
	t.Run("HandlerErrorRedeliveredThenDeadLettered", func(t *testing.T) {
		h := newHarness(t)
		r := newRuns()
		stats, stop := h.Start(t, opts, r.handler(func(string) error { return errors.New("downstream refused") }))
		defer stop()
		h.Publish(t, "bad", []byte("a"))
		waitFor(t, "the dead letter", func() bool { return stats().DeadLettered == 1 && h.DeadLetters(t) == 1 })
		if n := r.count("bad"); n != MaxDeliveries {
			t.Errorf("handler ran %d times, want %d (the maximum of deliveries)", n, MaxDeliveries)
		}
	})
	t.Run("PanicIsAnError", func(t *testing.T) {
		h := newHarness(t)
		r := newRuns()
		stats, stop := h.Start(t, opts, r.handler(func(key string) error {
			if key == "boom" {
				panic("poison message")
			}
			return nil
		}))
		defer stop()
		h.Publish(t, "boom", []byte("a"))
		h.Publish(t, "fine", []byte("b"))
		waitFor(t, "the dead letter and the next message", func() bool {
			st := stats()
			return st.DeadLettered == 1 && st.Processed == 1 && h.DeadLetters(t) == 1
		})
		if st := stats(); st.Panics != MaxDeliveries {
			t.Errorf("stats %+v, want %d panics", st, MaxDeliveries)
		}
	})
	t.Run("InvalidDeadLetteredAtOnce", func(t *testing.T) {
		h := newHarness(t)
		r := newRuns()
		stats, stop := h.Start(t, opts, r.handler(nil))
		defer stop()
		h.Publish(t, "", []byte("no key"))
		h.Publish(t, strings.Repeat("k", idem.MaxKeyLen+1), []byte("long key"))
		h.Publish(t, "long-fp", []byte(strings.Repeat("f", idem.MaxFingerprintLen+1)))
		h.Publish(t, "ok", []byte("ok"))
		waitFor(t, "three dead letters and the good message", func() bool {
			st := stats()
			return st.Invalid == 3 && st.Processed == 1 && h.DeadLetters(t) == 3
		})
		if st := stats(); st.Retried != 0 {
			t.Errorf("stats %+v: an invalid message was retried", st)
		}
		if n := r.total(); n != 1 {
			t.Errorf("handler ran %d times, want 1 (only the valid message)", n)
		}
	})
}

// runs counts handler runs per key.
type runs struct {
	mu sync.Mutex
	n  map[string]int
}

func newRuns() *runs { return &runs{n: map[string]int{}} }

func (r *runs) handler(fail func(key string) error) Handler {
	return func(ctx context.Context, key string, payload []byte) error {
		r.mu.Lock()
		r.n[key]++
		r.mu.Unlock()
		if _, ok := idem.FenceFrom(ctx); !ok {
			return errors.New("consumertest: no fence in the handler's context")
		}
		if fail != nil {
			return fail(key)
		}
		return nil
	}
}

func (r *runs) count(key string) int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.n[key]
}

func (r *runs) total() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	n := 0
	for _, c := range r.n {
		n += c
	}
	return n
}

// waitFor waits for cond, checked every 10ms, for at most 20s.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after 20s waiting for %s", what)
		}
		time.Sleep(10 * time.Millisecond)
	}
}
