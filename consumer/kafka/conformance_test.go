package kafka_test

import (
	"context"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/idemgo/idem"
	"github.com/idemgo/idem/consumer"
	"github.com/idemgo/idem/consumer/consumertest"
	"github.com/idemgo/idem/consumer/kafka"
	"github.com/idemgo/idem/testkit/prooftest"
)

// TestConformance runs the adapter conformance suite on kfake.
func TestConformance(t *testing.T) {
	consumertest.Run(t, func(t *testing.T) consumertest.Harness {
		addrs := startCluster(t, 1, "in", "in.dlq")
		return &harness{addrs: addrs, prod: producer(t, addrs)}
	})
}

// TestSidecarConformance runs the suite against the sidecar (package
// consumer/sidecar, the core of `idem consume`) on this adapter.
func TestSidecarConformance(t *testing.T) {
	consumertest.RunSidecar(t, func(t *testing.T) consumertest.Harness {
		addrs := startCluster(t, 1, "in", "in.dlq")
		return &harness{addrs: addrs, prod: producer(t, addrs)}
	})
}

type harness struct {
	addrs []string
	prod  *kgo.Client
	exec  *idem.Executor
}

func (h *harness) Executor(t *testing.T) *idem.Executor {
	if h.exec == nil {
		h.exec = prooftest.MemExecutor(t, idem.WithLease(time.Second))
	}
	return h.exec
}

func (h *harness) Publish(t *testing.T, key string, payload []byte) {
	r := &kgo.Record{Topic: "in", Value: payload}
	if key != "" {
		r.Headers = keyHeader(key)
	}
	produce(t, h.prod, r)
}

func (h *harness) Start(t *testing.T, opts []consumer.Option, hd consumertest.Handler) (func() consumer.Stats, func()) {
	opts = append([]consumer.Option{
		consumer.WithMaxDeliveries(consumertest.MaxDeliveries), consumer.WithRetryDelay(20 * time.Millisecond),
		kafka.WithFingerprint(func(r *kgo.Record) string { return string(r.Value) }),
	}, opts...)
	c, err := kafka.New(groupOpts(h.addrs, "g", "in"), h.Executor(t),
		func(ctx context.Context, r *kgo.Record) error {
			return hd(ctx, kafka.KeyHeader(kafka.DefaultKeyHeader)(r), r.Value)
		}, opts...)
	if err != nil {
		t.Fatal(err)
	}
	return c.Stats, prooftest.Start(t, c.Run)
}

func (h *harness) DeadLetters(t *testing.T) int { return int(count(t, h.addrs, "in.dlq")) }
