package rabbitmq

import (
	"context"
	"errors"
	"strings"
	"sync"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/idemgo/idem"
	"github.com/idemgo/idem/consumer"
	"github.com/idemgo/idem/testkit/prooftest"
)

func newTestSender(t *testing.T, queue string, opts ...SenderOption) *Sender {
	t.Helper()
	s, err := NewSender(amqpURL(), "", queue, opts...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

// TestSenderToConsumer: messages a Sender published, one of them twice (a
// relay that sent it again), reach a Consumer under their keys, with
// payload and headers, whether it reads the key from the message-id (its
// default) or from the header Idempotency-Key; the repeated one runs its
// handler once.
func TestSenderToConsumer(t *testing.T) {
	for _, tc := range []struct {
		name string
		opts []Option
	}{{"message-id", nil}, {"header", []Option{WithKeyHeader(OutboxKeyHeader)}}} {
		t.Run(tc.name, func(t *testing.T) { testSenderToConsumer(t, tc.opts...) })
	}
}

func testSenderToConsumer(t *testing.T, opts ...Option) {
	q := testQueue(t)
	newPublisher(t, q) // declares the queue
	s := newTestSender(t, q)
	for _, m := range []struct{ key, payload string }{{"order-1:paid", "p1"}, {"order-2:paid", "p2"}, {"order-1:paid", "p1"}} {
		if err := s.Send(t.Context(), m.key, []byte(m.payload), map[string]string{"type": "order.paid", "traceparent": "00-ab"}); err != nil {
			t.Fatal(err)
		}
	}
	var mu sync.Mutex
	got := map[string][]*amqp.Delivery{}
	c, err := New(amqpURL(), q, prooftest.MemExecutor(t, idem.WithLease(2*time.Second)), func(ctx context.Context, d *amqp.Delivery) error {
		mu.Lock()
		defer mu.Unlock()
		got[d.MessageId] = append(got[d.MessageId], d)
		return nil
	}, append([]Option{WithBatchWait(20 * time.Millisecond), WithMaxDelay(50 * time.Millisecond), consumer.WithScope(q)}, opts...)...)
	if err != nil {
		t.Fatal(err)
	}
	stop := prooftest.Start(t, c.Run)
	waitFor(t, 20*time.Second, "3 deliveries", func() bool { st := c.Stats(); return st.Processed+st.Replayed == 3 })
	stop()
	mu.Lock()
	defer mu.Unlock()
	if len(got) != 2 || len(got["order-1:paid"]) != 1 || len(got["order-2:paid"]) != 1 {
		t.Fatalf("handler runs per key: got %v, want one for each of the 2 keys", got)
	}
	d := got["order-1:paid"][0]
	if string(d.Body) != "p1" || d.Headers[OutboxKeyHeader] != "order-1:paid" || d.Headers["type"] != "order.paid" ||
		d.Headers["traceparent"] != "00-ab" || d.DeliveryMode != amqp.Persistent {
		t.Fatalf("delivery: got body %q, headers %v, mode %d; want p1, the key and the 2 headers, persistent", d.Body, d.Headers, d.DeliveryMode)
	}
}

// TestSenderUnroutable: a message no queue takes is returned by the broker
// and Send fails, so that the relay keeps it; once the queue exists, the
// same Sender delivers.
func TestSenderUnroutable(t *testing.T) {
	q := testQueue(t)
	s := newTestSender(t, q)
	err := s.Send(t.Context(), "k", []byte("p"), nil)
	if err == nil || !strings.Contains(err.Error(), "unroutable") {
		t.Fatalf("Send to a queue that does not exist: got %v, want the broker's return", err)
	}
	newPublisher(t, q)
	if err := s.Send(t.Context(), "k", []byte("p"), nil); err != nil {
		t.Fatalf("Send once the queue exists: %v", err)
	}
	if n := depth(t, dial(t), q); n != 1 {
		t.Fatalf("queue depth: got %d, want 1", n)
	}
}

// TestSenderReconnects: after its connection is cut, the Sender's next
// Send fails or dials again; one after that delivers.
func TestSenderReconnects(t *testing.T) {
	q := testQueue(t)
	newPublisher(t, q)
	var k connKiller
	s := newTestSender(t, q, WithDialConfig(k.config()))
	if err := s.Send(t.Context(), "k1", []byte("p"), nil); err != nil {
		t.Fatal(err)
	}
	k.kill()
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	if err := s.Send(ctx, "k2", []byte("p"), nil); err != nil {
		if err := s.Send(ctx, "k2", []byte("p"), nil); err != nil {
			t.Fatalf("Send after the connection was cut, twice: %v", err)
		}
	}
	if n := depth(t, dial(t), q); n != 2 {
		t.Fatalf("queue depth: got %d, want 2", n)
	}
	s.Close()
	if err := s.Send(t.Context(), "k3", nil, nil); !errors.Is(err, errSenderClosed) {
		t.Fatalf("Send after Close: got %v, want errSenderClosed", err)
	}
}

func TestNewSenderValidates(t *testing.T) {
	if _, err := NewSender("http://x", "", "q"); !errors.Is(err, idem.ErrInvalid) {
		t.Errorf("bad URL: got %v, want idem.ErrInvalid", err)
	}
	if _, err := NewSender(amqpURL(), "", ""); !errors.Is(err, idem.ErrInvalid) {
		t.Errorf("no exchange and no routing key: got %v, want idem.ErrInvalid", err)
	}
}
