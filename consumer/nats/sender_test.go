package natsconsumer_test

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/idemgo/idem"
	natsconsumer "github.com/idemgo/idem/consumer/nats"
	"github.com/idemgo/idem/testkit/prooftest"
)

// TestSenderToConsumer: messages a Sender published reach a Consumer under
// their keys, with payload and headers, whether it reads the key from
// Nats-Msg-Id (its default) or from the header Idempotency-Key. A message
// sent again within the stream's duplicate window (a relay's repeat) is
// stored once; one sent again after it is stored twice and runs the
// handler once.
func TestSenderToConsumer(t *testing.T) {
	for _, tc := range []struct {
		name string
		opts []natsconsumer.Option
	}{{"Nats-Msg-Id", nil}, {"header", []natsconsumer.Option{natsconsumer.WithKeyHeader(natsconsumer.OutboxKeyHeader)}}} {
		t.Run(tc.name, func(t *testing.T) { testSenderToConsumer(t, tc.opts...) })
	}
}

func testSenderToConsumer(t *testing.T, opts ...natsconsumer.Option) {
	_, js := connect(t)
	s := newStream(t, js, func(c *jetstream.StreamConfig) { c.Duplicates = 500 * time.Millisecond })
	snd, err := natsconsumer.NewSender(js, s.name+".orders")
	if err != nil {
		t.Fatal(err)
	}
	send := func(key, payload string) {
		t.Helper()
		if err := snd.Send(t.Context(), key, []byte(payload), map[string]string{"type": "order.paid", "traceparent": "00-ab"}); err != nil {
			t.Fatal(err)
		}
	}
	send("order-1:paid", "p1")
	send("order-2:paid", "p2")
	send("order-1:paid", "p1") // within the window
	if info, err := s.stream.Info(t.Context()); err != nil || info.State.Msgs != 2 {
		t.Fatalf("stream holds %v messages (err %v), want 2: the repeat within the window is stored once", info.State.Msgs, err)
	}
	time.Sleep(600 * time.Millisecond) // past the server's duplicate window
	send("order-2:paid", "p2")
	cons := s.consumer(t, nil)
	var mu sync.Mutex
	got := map[string][]jetstream.Msg{}
	c, err := natsconsumer.New(js, cons, prooftest.MemExecutor(t, idem.WithLease(5*time.Second)), func(ctx context.Context, m jetstream.Msg) error {
		mu.Lock()
		defer mu.Unlock()
		k := m.Headers().Get(natsconsumer.OutboxKeyHeader)
		got[k] = append(got[k], m)
		return nil
	}, append([]natsconsumer.Option{natsconsumer.WithFetchMaxWait(200 * time.Millisecond)}, opts...)...)
	if err != nil {
		t.Fatal(err)
	}
	runBg(t, c.Run)
	waitDrained(t, cons, 10*time.Second)
	mu.Lock()
	defer mu.Unlock()
	if len(got) != 2 || len(got["order-1:paid"]) != 1 || len(got["order-2:paid"]) != 1 {
		t.Fatalf("handler runs per key: got %v, want one for each of the 2 keys", got)
	}
	if st := c.Stats(); st.Processed != 2 || st.Replayed != 1 {
		t.Fatalf("stats: got %+v, want 2 processed and 1 replayed", st)
	}
	m := got["order-1:paid"][0]
	h := m.Headers()
	if string(m.Data()) != "p1" || h.Get(jetstream.MsgIDHeader) != "order-1:paid" || h.Get("type") != "order.paid" || h.Get("traceparent") != "00-ab" || len(h) != 4 {
		t.Fatalf("message: got data %q, headers %v; want p1, the key in Nats-Msg-Id and Idempotency-Key, and the 2 headers", m.Data(), h)
	}
}

// TestSenderNoStream: a subject no stream captures gets no PubAck: Send
// fails, so the relay keeps the message.
func TestSenderNoStream(t *testing.T) {
	_, js := connect(t)
	s := newStream(t, js, nil)
	snd, err := natsconsumer.NewSender(js, "nowhere."+s.name)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(t.Context(), 5*time.Second)
	defer cancel()
	if err := snd.Send(ctx, "k", []byte("p"), nil); err == nil {
		t.Fatal("Send to a subject without a stream: got nil, want an error")
	}
}

func TestNewSenderValidates(t *testing.T) {
	if _, err := natsconsumer.NewSender(nil, "s"); !errors.Is(err, idem.ErrInvalid) {
		t.Errorf("nil JetStream: got %v, want idem.ErrInvalid", err)
	}
	_, js := connect(t)
	if _, err := natsconsumer.NewSender(js, ""); !errors.Is(err, idem.ErrInvalid) {
		t.Errorf("empty subject: got %v, want idem.ErrInvalid", err)
	}
}
