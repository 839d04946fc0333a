package natsconsumer_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/idemgo/idem"
	"github.com/idemgo/idem/consumer"
	"github.com/idemgo/idem/consumer/consumertest"
	natsconsumer "github.com/idemgo/idem/consumer/nats"
	"github.com/idemgo/idem/testkit/prooftest"
)

// TestConformance runs the adapter conformance suite on a real nats-server
// with JetStream. The key travels in a header of its own: JetStream would
// drop the suite's duplicates published with the same Nats-Msg-Id.
func TestConformance(t *testing.T) {
	consumertest.Run(t, func(t *testing.T) consumertest.Harness {
		_, js := connect(t)
		return &harness{js: js, s: newStream(t, js, nil)}
	})
}

// TestSidecarConformance runs the suite against the sidecar (package
// consumer/sidecar, the core of `idem consume`) on this adapter.
func TestSidecarConformance(t *testing.T) {
	consumertest.RunSidecar(t, func(t *testing.T) consumertest.Harness {
		_, js := connect(t)
		return &harness{js: js, s: newStream(t, js, nil)}
	})
}

type harness struct {
	js   jetstream.JetStream
	s    *testStream
	exec *idem.Executor
}

func (h *harness) Executor(t *testing.T) *idem.Executor {
	if h.exec == nil {
		h.exec = prooftest.MemExecutor(t, idem.WithLease(time.Second))
	}
	return h.exec
}

func (h *harness) Publish(t *testing.T, key string, payload []byte) {
	h.s.publish(t, "orders", "Idem-Key", key, payload)
}

func (h *harness) Start(t *testing.T, opts []consumer.Option, hd consumertest.Handler) (func() consumer.Stats, func()) {
	opts = append([]consumer.Option{natsconsumer.WithKeyHeader("Idem-Key"), natsconsumer.WithFetchMaxWait(100 * time.Millisecond),
		natsconsumer.WithFingerprint(func(m jetstream.Msg) string { return string(m.Data()) })}, opts...)
	c, err := natsconsumer.New(h.js, h.s.consumer(t, nil), h.Executor(t),
		func(ctx context.Context, m jetstream.Msg) error {
			return hd(ctx, m.Headers().Get("Idem-Key"), m.Data())
		}, opts...)
	if err != nil {
		t.Fatal(err)
	}
	stop := runBg(t, c.Run)
	return c.Stats, func() {
		if err := stop(); err != nil && !errors.Is(err, natsconsumer.ErrStopped) {
			t.Errorf("Run: %v", err)
		}
	}
}

func (h *harness) DeadLetters(t *testing.T) int { return len(h.s.dlqMsgs(t)) }
