package sqsconsumer_test

import (
	"context"
	"errors"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/service/sqs/types"

	"github.com/idemgo/idem"
	sqsconsumer "github.com/idemgo/idem/consumer/sqs"
	"github.com/idemgo/idem/testkit/prooftest"
	"github.com/idemgo/idem/testkit/sqsfake"
)

// TestSenderToConsumer: messages a Sender sent, one of them twice (a relay
// that sent it again), reach a Consumer with its default settings under
// their keys, with body and attributes; the repeated one runs its handler
// once. On a FIFO queue the key is the deduplication id too (hashed when
// SQS would refuse it).
func TestSenderToConsumer(t *testing.T) {
	long := strings.Repeat("k", 200)
	for _, queue := range []string{"orders", "orders.fifo"} {
		t.Run(queue, func(t *testing.T) {
			f := startFake(t)
			qURL := f.CreateQueue(queue, sqsfake.QueueOptions{VisibilityTimeout: 30 * time.Second})
			dURL := f.CreateQueue("dlq", sqsfake.QueueOptions{})
			s, err := sqsconsumer.NewSender(f.client(nil), qURL)
			if err != nil {
				t.Fatal(err)
			}
			for _, m := range []struct{ key, payload string }{{"order-1:paid", "p1"}, {"order-2:paid", "p2"}, {"order-1:paid", "p1"}, {long, "p3"}} {
				if err := s.Send(t.Context(), m.key, []byte(m.payload), map[string]string{"type": "order.paid", "traceparent": "00-ab"}); err != nil {
					t.Fatal(err)
				}
			}
			var mu sync.Mutex
			got := map[string][]types.Message{}
			c, err := sqsconsumer.New(f.client(nil), qURL, dURL, prooftest.MemExecutor(t), func(ctx context.Context, m types.Message) error {
				mu.Lock()
				defer mu.Unlock()
				k := *m.MessageAttributes[sqsconsumer.DefaultKeyAttribute].StringValue
				got[k] = append(got[k], m)
				return nil
			}, sqsconsumer.WithWaitTime(time.Second))
			if err != nil {
				t.Fatal(err)
			}
			stop := runConsumer(t, c.Run)
			waitFor(t, 10*time.Second, "the queue to drain", drained(f, queue))
			stop()
			mu.Lock()
			defer mu.Unlock()
			if len(got) != 3 || len(got["order-1:paid"]) != 1 || len(got["order-2:paid"]) != 1 || len(got[long]) != 1 {
				t.Fatalf("handler runs per key: got %d keys, want one run for each of the 3 keys", len(got))
			}
			m := got["order-1:paid"][0]
			if *m.Body != "p1" || *m.MessageAttributes["type"].StringValue != "order.paid" || *m.MessageAttributes["traceparent"].StringValue != "00-ab" || len(m.MessageAttributes) != 3 {
				t.Fatalf("message: got body %q, %d attributes, want p1 and the key and 2 headers", *m.Body, len(m.MessageAttributes))
			}
			dedup := map[string]bool{}
			for _, k := range []string{"order-1:paid", long} {
				dedup[got[k][0].Attributes["MessageDeduplicationId"]] = true
			}
			if fifo := strings.HasSuffix(queue, ".fifo"); fifo != (dedup["order-1:paid"] && len(dedup) == 2 && !dedup[long]) {
				t.Fatalf("deduplication ids: got %v, want the key, and a hash for the long key, on FIFO only", dedup)
			}
		})
	}
}

// TestSenderRefusesWhatSQSWould: too many headers or a binary payload
// fail before the call.
func TestSenderRefusesWhatSQSWould(t *testing.T) {
	f := startFake(t)
	s, err := sqsconsumer.NewSender(f.client(nil), f.CreateQueue("q", sqsfake.QueueOptions{}))
	if err != nil {
		t.Fatal(err)
	}
	many := map[string]string{}
	for _, c := range "abcdefghij" {
		many[string(c)] = "v"
	}
	if err := s.Send(t.Context(), "k", []byte("p"), many); err == nil {
		t.Error("10 headers: got nil, want an error")
	}
	if err := s.Send(t.Context(), "k", []byte{0xff, 0xfe}, nil); err == nil {
		t.Error("binary payload: got nil, want an error")
	}
	if n := len(f.Messages("q")); n != 0 {
		t.Errorf("messages sent: got %d, want 0", n)
	}
}

func TestNewSenderValidates(t *testing.T) {
	if _, err := sqsconsumer.NewSender(nil, "u"); !errors.Is(err, idem.ErrInvalid) {
		t.Errorf("nil client: got %v, want idem.ErrInvalid", err)
	}
	if _, err := sqsconsumer.NewSender(startFake(t).client(nil), ""); !errors.Is(err, idem.ErrInvalid) {
		t.Errorf("empty queue URL: got %v, want idem.ErrInvalid", err)
	}
}
