package sqsconsumer_test

import (
	"context"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/sqs/types"

	"github.com/idemgo/idem"
	"github.com/idemgo/idem/consumer"
	"github.com/idemgo/idem/consumer/consumertest"
	sqsconsumer "github.com/idemgo/idem/consumer/sqs"
	"github.com/idemgo/idem/testkit/prooftest"
	"github.com/idemgo/idem/testkit/sqsfake"
)

// TestConformance runs the adapter conformance suite on the in-test SQS
// server (no real SQS here).
func TestConformance(t *testing.T) {
	consumertest.Run(t, func(t *testing.T) consumertest.Harness {
		f := startFake(t)
		return &harness{f: f, q: f.CreateQueue("q", sqsfake.QueueOptions{}), dlq: f.CreateQueue("dlq", sqsfake.QueueOptions{})}
	})
}

// TestSidecarConformance runs the suite against the sidecar (package
// consumer/sidecar, the core of `idem consume`) on this adapter.
func TestSidecarConformance(t *testing.T) {
	consumertest.RunSidecar(t, func(t *testing.T) consumertest.Harness {
		f := startFake(t)
		return &harness{f: f, q: f.CreateQueue("q", sqsfake.QueueOptions{}), dlq: f.CreateQueue("dlq", sqsfake.QueueOptions{})}
	})
}

type harness struct {
	f      *fakeSQS
	q, dlq string
	exec   *idem.Executor
}

func (h *harness) Executor(t *testing.T) *idem.Executor {
	if h.exec == nil {
		h.exec = prooftest.MemExecutor(t, idem.WithLease(time.Second))
	}
	return h.exec
}

func (h *harness) Publish(t *testing.T, key string, payload []byte) {
	h.f.Send("q", string(payload), keyAttr(key), "")
}

func (h *harness) Start(t *testing.T, opts []consumer.Option, hd consumertest.Handler) (func() consumer.Stats, func()) {
	opts = append([]consumer.Option{consumer.WithMaxDeliveries(consumertest.MaxDeliveries),
		consumer.WithRetryDelay(0), sqsconsumer.WithWaitTime(time.Second),
		sqsconsumer.WithFingerprint(func(m types.Message) string { return aws.ToString(m.Body) })}, opts...)
	c, err := sqsconsumer.New(h.f.client(nil), h.q, h.dlq, h.Executor(t), func(ctx context.Context, m types.Message) error {
		return hd(ctx, sqsconsumer.KeyHeader(sqsconsumer.DefaultKeyAttribute)(m), []byte(aws.ToString(m.Body)))
	}, opts...)
	if err != nil {
		t.Fatal(err)
	}
	return c.Stats, runConsumer(t, c.Run)
}

func (h *harness) DeadLetters(t *testing.T) int { return len(h.f.Messages("dlq")) }
