package main

import (
	"context"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	amqp "github.com/rabbitmq/amqp091-go"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/idemgo/idem/testkit/redistest"
	"github.com/idemgo/idem/testkit/sqsfake"
)

// consumeMessage is one message the broker tests send: its key (where the
// broker's default key source, or --key, finds it) and body.
type consumeMessage struct{ key, body string }

// consumeMessages: k1 twice (the second is acked without a call), bad (a
// 400: dead-lettered), flaky (a 503, then a 200: retried).
var consumeMessages = []consumeMessage{
	{"k1", `{"id":"k1","n":1}`}, {"k1", `{"id":"k1","n":1}`}, {"bad", `{"id":"bad"}`}, {"flaky", `{"id":"flaky"}`},
}

func consumeAnswer(key string, n int) int {
	switch {
	case key == "bad":
		return 400
	case key == "flaky" && n == 1:
		return 503
	}
	return 200
}

// TestConsumeBrokers: idem consume on Kafka (kfake), RabbitMQ, NATS
// JetStream (with --key json:/id) and SQS (the fake): each message is
// handled once per key, the 400 dead-lettered, the 503 retried, the
// duplicate acked without a call, with the broker's metadata in headers;
// again with one request per batch (--to-batch), the same answers.
func TestConsumeBrokers(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t)
	store := "redis://" + srv.Addr()
	tp := "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
	for _, tc := range []struct {
		name   string
		broker string // Idem-Broker
		setup  func(t *testing.T) (from string, args []string, env []string, send func(m consumeMessage), deadLetters func() int)
	}{
		{"kafka", "kafka", func(t *testing.T) (string, []string, []string, func(consumeMessage), func() int) {
			kc, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.SeedTopics(1, "events", "events.dlq"))
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(kc.Close)
			cl, err := kgo.NewClient(kgo.SeedBrokers(kc.ListenAddrs()...), kgo.AllowAutoTopicCreation())
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(cl.Close)
			send := func(m consumeMessage) {
				r := &kgo.Record{Topic: "events", Value: []byte(m.body), Headers: []kgo.RecordHeader{{Key: "Idempotency-Key", Value: []byte(m.key)}, {Key: "traceparent", Value: []byte(tp)}}}
				if err := cl.ProduceSync(t.Context(), r).FirstErr(); err != nil {
					t.Fatal(err)
				}
			}
			dl := func() int {
				dc, err := kgo.NewClient(kgo.SeedBrokers(kc.ListenAddrs()...), kgo.ConsumeTopics("events.dlq"), kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()))
				if err != nil {
					return 0
				}
				defer dc.Close()
				ctx, cancel := context.WithTimeout(t.Context(), 500*time.Millisecond)
				defer cancel()
				return len(dc.PollFetches(ctx).Records())
			}
			return "kafka://" + strings.Join(kc.ListenAddrs(), ",") + "/events?group=billing", []string{"--retry-delay", "10ms"}, nil, send, dl
		}},
		{"amqp", "amqp", func(t *testing.T) (string, []string, []string, func(consumeMessage), func() int) {
			queue := unique("idem-test-consume-")
			conn, err := amqp.Dial("amqp://guest:guest@127.0.0.1:5672/")
			if err != nil {
				t.Fatalf("RabbitMQ: %v", err)
			}
			t.Cleanup(func() { conn.Close() })
			ch, err := conn.Channel()
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() {
				ch.QueueDelete(queue, false, false, false)
				ch.QueueDelete(queue+".dlq", false, false, false)
				ch.QueueDelete(queue+".retry", false, false, false)
			})
			if _, err := ch.QueueDeclare(queue, true, false, false, false, nil); err != nil {
				t.Fatal(err)
			}
			send := func(m consumeMessage) {
				err := ch.PublishWithContext(t.Context(), "", queue, false, false, amqp.Publishing{
					MessageId: m.key, Body: []byte(m.body), ContentType: "application/json", Headers: amqp.Table{"traceparent": tp},
				})
				if err != nil {
					t.Fatal(err)
				}
			}
			dl := func() int {
				q, err := ch.QueueDeclarePassive(queue+".dlq", true, false, false, false, nil)
				if err != nil {
					return 0
				}
				return q.Messages
			}
			return "amqp://guest:guest@127.0.0.1:5672/" + queue, nil, nil, send, dl
		}},
		{"nats", "nats", func(t *testing.T) (string, []string, []string, func(consumeMessage), func() int) {
			nc, err := nats.Connect("nats://127.0.0.1:4222")
			if err != nil {
				t.Fatalf("NATS: %v", err)
			}
			t.Cleanup(nc.Close)
			js, err := jetstream.New(nc)
			if err != nil {
				t.Fatal(err)
			}
			subject := unique("consume.")
			name := strings.ReplaceAll(strings.ToUpper(subject), ".", "_")
			for n, subj := range map[string]string{name: subject, name + "_DLQ": subject + ".dlq"} {
				if _, err := js.CreateStream(t.Context(), jetstream.StreamConfig{Name: n, Subjects: []string{subj}, Storage: jetstream.MemoryStorage}); err != nil {
					t.Fatal(err)
				}
				t.Cleanup(func() { js.DeleteStream(context.Background(), n) })
			}
			send := func(m consumeMessage) {
				msg := nats.NewMsg(subject)
				msg.Data = []byte(m.body)
				msg.Header.Set("traceparent", tp)
				if _, err := js.PublishMsg(t.Context(), msg); err != nil {
					t.Fatal(err)
				}
			}
			dl := func() int {
				s, err := js.Stream(t.Context(), name+"_DLQ")
				if err != nil {
					return 0
				}
				info, err := s.Info(t.Context())
				if err != nil {
					return 0
				}
				return int(info.State.Msgs)
			}
			return "nats://127.0.0.1:4222/" + name + "?consumer=billing", []string{"--key", "json:/id", "--dead-letter", subject + ".dlq", "--retry-delay", "10ms"}, nil, send, dl
		}},
		{"sqs", "sqs", func(t *testing.T) (string, []string, []string, func(consumeMessage), func() int) {
			fake := sqsfake.New("")
			hs := httptest.NewServer(fake)
			t.Cleanup(hs.Close)
			fake.SetBase(hs.URL)
			fake.CreateQueue("jobs", sqsfake.QueueOptions{})
			dlq := fake.CreateQueue("jobs-dlq", sqsfake.QueueOptions{})
			send := func(m consumeMessage) {
				fake.Send("jobs", m.body, map[string]sqsfake.MessageAttribute{
					"idempotency-key": {DataType: "String", StringValue: m.key},
					"traceparent":     {DataType: "String", StringValue: tp},
				}, "")
			}
			dl := func() int { return len(fake.Messages("jobs-dlq")) }
			from := "sqs://" + strings.TrimPrefix(hs.URL, "http://") + "/000000000000/jobs?insecure=true&region=us-east-1"
			return from, []string{"--dead-letter", dlq}, []string{"AWS_ACCESS_KEY_ID=AKIDTEST", "AWS_SECRET_ACCESS_KEY=SECRETTEST"}, send, dl
		}},
	} {
		for _, flag := range []string{"--to", "--to-batch"} {
			t.Run(tc.name+map[string]string{"--to": "", "--to-batch": "/to-batch"}[flag], func(t *testing.T) {
				h := newTestHandler(t, consumeAnswer)
				url := h.srv.URL
				if flag == "--to-batch" { // the same answers, one request per batch
					url = newBatchHandler(t, h).srv.URL
				}
				from, args, env, send, deadLetters := tc.setup(t)
				for _, m := range consumeMessages {
					send(m)
				}
				p := startIdemEnv(t, env, append([]string{"consume", "--from", from, flag, url, "--redis", store, "--lease", "2s", "--scope", unique("s-")}, args...)...)
				waitFor(t, "every message handled", func() bool {
					return h.count("flaky") == 2 && h.count("bad") == 1 && h.count("k1") == 1 && deadLetters() == 1
				})
				p.terminate()
				if code := p.wait(); code != 0 {
					t.Errorf("exit code after SIGTERM: %d, want 0", code)
				}
				if n := h.count("k1"); n != 1 {
					t.Errorf("k1: %d calls, want 1", n)
				}
				if !strings.Contains(p.stderr.String(), "replayed=1") || !strings.Contains(p.stderr.String(), "dead_lettered=1") {
					t.Errorf("stop line: want replayed=1 and dead_lettered=1:\n%s", p.stderr.String())
				}
				c := h.callsOf("k1")[0]
				if c.header.Get("Idem-Broker") != tc.broker || c.header.Get("Traceparent") != tp || c.fence == "" || c.body != `{"id":"k1","n":1}` || c.header.Get("Idem-Message-Id") == "" {
					t.Errorf("k1's call: headers %v body %q, want the broker, the traceparent, a fence, a message ID and the body", c.header, c.body)
				}
			})
		}
	}
}
