package natsconsumer_test

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// natsURL is the real nats-server with JetStream the tests run against.
const natsURL = "nats://127.0.0.1:4222"

// connect connects to the test server; the test fails if it is unreachable.
func connect(t testing.TB) (*nats.Conn, jetstream.JetStream) {
	t.Helper()
	nc, err := nats.Connect(natsURL, nats.Timeout(2*time.Second))
	if err != nil {
		t.Fatalf("connect to nats-server at %s (JetStream required): %v", natsURL, err)
	}
	t.Cleanup(nc.Close)
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatalf("jetstream.New: %v", err)
	}
	return nc, js
}

// testStream is a stream with a unique name capturing "<name>.>", and its
// dead-letter stream capturing "dlq.<name>.>", both deleted when the test
// ends.
type testStream struct {
	name   string
	js     jetstream.JetStream
	stream jetstream.Stream
	dlq    jetstream.Stream
}

func newStream(t testing.TB, js jetstream.JetStream, mod func(*jetstream.StreamConfig)) *testStream {
	t.Helper()
	var b [6]byte
	_, _ = rand.Read(b[:])
	name := "IDEMT_" + strings.ToUpper(hex.EncodeToString(b[:]))
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	cfg := jetstream.StreamConfig{Name: name, Subjects: []string{name + ".>"}, Storage: jetstream.MemoryStorage}
	if mod != nil {
		mod(&cfg)
	}
	st, err := js.CreateStream(ctx, cfg)
	if err != nil {
		t.Fatalf("create stream %s: %v", name, err)
	}
	dlq, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: name + "_DLQ", Subjects: []string{"dlq." + name + ".>"}, Storage: jetstream.MemoryStorage})
	if err != nil {
		t.Fatalf("create dead-letter stream: %v", err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		_ = js.DeleteStream(ctx, name)
		_ = js.DeleteStream(ctx, name+"_DLQ")
	})
	return &testStream{name: name, js: js, stream: st, dlq: dlq}
}

// consumer creates a durable pull consumer with explicit ack.
func (s *testStream) consumer(t testing.TB, mod func(*jetstream.ConsumerConfig)) jetstream.Consumer {
	t.Helper()
	cfg := jetstream.ConsumerConfig{
		Durable:    "workers",
		AckPolicy:  jetstream.AckExplicitPolicy,
		AckWait:    5 * time.Second,
		MaxDeliver: -1,
		// Room for a large batch from each of several consumers.
		MaxAckPending: 100000,
	}
	if mod != nil {
		mod(&cfg)
	}
	c, err := s.js.CreateOrUpdateConsumer(t.Context(), s.name, cfg)
	if err != nil {
		t.Fatalf("create consumer: %v", err)
	}
	return c
}

// publish publishes data to "<name>.<sub>" with the key in header (none if
// key is empty) and waits for the stream's ack.
func (s *testStream) publish(t testing.TB, sub, header, key string, data []byte) {
	t.Helper()
	m := nats.NewMsg(s.name + "." + sub)
	m.Data = data
	if key != "" {
		m.Header.Set(header, key)
	}
	if _, err := s.js.PublishMsg(t.Context(), m); err != nil {
		t.Fatalf("publish: %v", err)
	}
}

// dlqMsgs returns the messages of the dead-letter stream.
func (s *testStream) dlqMsgs(t testing.TB) []*jetstream.RawStreamMsg {
	t.Helper()
	info, err := s.dlq.Info(t.Context())
	if err != nil {
		t.Fatalf("dead-letter stream info: %v", err)
	}
	var out []*jetstream.RawStreamMsg
	for seq := info.State.FirstSeq; info.State.Msgs > 0 && seq <= info.State.LastSeq; seq++ {
		m, err := s.dlq.GetMsg(t.Context(), seq)
		if err != nil {
			t.Fatalf("get dead letter %d: %v", seq, err)
		}
		out = append(out, m)
	}
	return out
}

// waitDrained waits until cons has nothing pending and nothing unacked.
func waitDrained(t testing.TB, cons jetstream.Consumer, timeout time.Duration) *jetstream.ConsumerInfo {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		info, err := cons.Info(t.Context())
		if err != nil {
			t.Fatalf("consumer info: %v", err)
		}
		if info.NumPending == 0 && info.NumAckPending == 0 {
			return info
		}
		if time.Now().After(deadline) {
			t.Fatalf("consumer not drained after %v: pending %d, ack pending %d, redelivered %d",
				timeout, info.NumPending, info.NumAckPending, info.NumRedelivered)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// runBg runs c.Run until the test ends or the returned stop is called, and
// waits for it to return.
func runBg(t testing.TB, run func(context.Context) error) (stop func() error) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	errc := make(chan error, 1)
	go func() { errc <- run(ctx) }()
	var err error
	stopped := false
	stop = func() error {
		if !stopped {
			stopped = true
			cancel()
			select {
			case err = <-errc:
			case <-time.After(30 * time.Second):
				t.Errorf("Run did not return 30s after its context was cancelled")
			}
		}
		return err
	}
	t.Cleanup(func() { _ = stop() })
	return stop
}

// eventually polls cond every 20ms for at most timeout.
func eventually(t testing.TB, timeout time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %v waiting for %s", timeout, what)
		}
		time.Sleep(20 * time.Millisecond)
	}
}
