package rabbitmq

import (
	"context"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/idemgo/idem"
	"github.com/idemgo/idem/consumer"
	"github.com/idemgo/idem/consumer/consumertest"
	"github.com/idemgo/idem/testkit/prooftest"
)

// TestConformance runs the adapter conformance suite on a real RabbitMQ.
func TestConformance(t *testing.T) {
	consumertest.Run(t, func(t *testing.T) consumertest.Harness {
		q := testQueue(t)
		return &harness{q: q, pub: newPublisher(t, q), conn: dial(t)}
	})
}

// TestSidecarConformance runs the suite against the sidecar (package
// consumer/sidecar, the core of `idem consume`) on this adapter.
func TestSidecarConformance(t *testing.T) {
	consumertest.RunSidecar(t, func(t *testing.T) consumertest.Harness {
		q := testQueue(t)
		return &harness{q: q, pub: newPublisher(t, q), conn: dial(t)}
	})
}

type harness struct {
	q    string
	pub  *publisher
	conn *amqp.Connection
	exec *idem.Executor
}

func (h *harness) Executor(t *testing.T) *idem.Executor {
	if h.exec == nil {
		h.exec = prooftest.MemExecutor(t, idem.WithLease(time.Second))
	}
	return h.exec
}

func (h *harness) Publish(t *testing.T, key string, payload []byte) {
	// A header: the message-id property cannot hold the suite's key over
	// 255 bytes.
	p := amqp.Publishing{Body: payload}
	if key != "" {
		p.Headers = amqp.Table{"idem-key": key}
	}
	h.pub.publish(h.q, p)
}

func (h *harness) Start(t *testing.T, opts []consumer.Option, hd consumertest.Handler) (func() consumer.Stats, func()) {
	opts = append([]consumer.Option{consumer.WithScope(h.q), WithKeyHeader("idem-key"),
		WithFingerprint(func(d *amqp.Delivery) string { return string(d.Body) })}, opts...)
	c, err := New(amqpURL(), h.q, h.Executor(t), func(ctx context.Context, d *amqp.Delivery) error {
		k, _ := d.Headers["idem-key"].(string)
		return hd(ctx, k, d.Body)
	}, opts...)
	if err != nil {
		t.Fatal(err)
	}
	return c.Stats, prooftest.Start(t, c.Run)
}

func (h *harness) DeadLetters(t *testing.T) int { return depth(t, h.conn, h.q+".dlq") }
