package outbox

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"net/http/httptest"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/sqs"
	sqstypes "github.com/aws/aws-sdk-go-v2/service/sqs/types"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	amqp "github.com/rabbitmq/amqp091-go"
	"github.com/redis/go-redis/v9"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/idemgo/idem"
	"github.com/idemgo/idem/consumer"
	"github.com/idemgo/idem/consumer/kafka"
	natsconsumer "github.com/idemgo/idem/consumer/nats"
	"github.com/idemgo/idem/consumer/rabbitmq"
	"github.com/idemgo/idem/consumer/redisstream"
	sqsconsumer "github.com/idemgo/idem/consumer/sqs"
	"github.com/idemgo/idem/postgres/pgoutbox"
	"github.com/idemgo/idem/redisstore"
	"github.com/idemgo/idem/testkit/redistest"
	"github.com/idemgo/idem/testkit/sqsfake"
)

// Every broker's Sender is a pgoutbox.Sender, though their modules do not
// import pgoutbox.
var (
	_ pgoutbox.Sender = (*redisstream.Sender)(nil)
	_ pgoutbox.Sender = (*kafka.Sender)(nil)
	_ pgoutbox.Sender = (*rabbitmq.Sender)(nil)
	_ pgoutbox.Sender = (*natsconsumer.Sender)(nil)
	_ pgoutbox.Sender = (*sqsconsumer.Sender)(nil)
)

// The environment of a child's sender, set by the broker rig.
const (
	envKind   = "IDEM_OB_KIND"   // the broker: redisstream, kafka, rabbitmq, nats, sqs
	envBroker = "IDEM_OB_BROKER" // its address or URL
	envDest   = "IDEM_OB_DEST"   // the stream, topic, exchange, subject or queue URL
)

// The shared servers; the others are started by the tests.
const (
	amqpURL = "amqp://guest:guest@127.0.0.1:5672/"
	natsURL = "nats://127.0.0.1:4222"
)

// natsDuplicates is the duplicate window of the scenarios' NATS streams:
// the shortest the server takes. A relay's repeat within the window is
// stored once by the server itself (a Sender's Nats-Msg-Id is the key);
// the scenarios restart the relay after it, so that the repeat reaches
// the consumer.
const natsDuplicates = 100 * time.Millisecond

// destination is the outbox destination of the scenarios' messages.
const destination = "events"

func uniqueName(prefix string) string {
	var b [6]byte
	_, _ = rand.Read(b[:])
	return prefix + hex.EncodeToString(b[:])
}

// broker is a broker the relay sends to, with its destination made for
// the test.
type broker interface {
	// env is the environment of a child's sender.
	env() []string
	// plain returns the messages per key that a consumer without
	// deduplication handles: every message the broker stored.
	plain(t *testing.T) map[string]int
	// dedup consumes every message (total) through the broker's idem
	// adapter, on rdb's Redis, and returns the handler runs per key.
	dedup(t *testing.T, rdb *redis.Client, total int) map[string]int
}

// brokers are the five brokers, by name.
var brokers = []struct {
	name  string
	setup func(t *testing.T) broker
}{
	{"redisstream", setupRedisStream},
	{"kafka", setupKafka},
	{"rabbitmq", setupRabbitMQ},
	{"nats", setupNATS},
	{"sqs", setupSQS},
}

// newSender returns the sender the environment names (a child's).
func newSender() (pgoutbox.Sender, func(), error) {
	addr, dest := os.Getenv(envBroker), os.Getenv(envDest)
	switch kind := os.Getenv(envKind); kind {
	case "redisstream":
		rdb := redis.NewClient(&redis.Options{Addr: addr})
		s, err := redisstream.NewSender(rdb, dest)
		return s, func() { rdb.Close() }, err
	case "kafka":
		cl, err := kgo.NewClient(kgo.SeedBrokers(addr), kgo.ProducerLinger(time.Millisecond))
		if err != nil {
			return nil, nil, err
		}
		s, err := kafka.NewSender(cl, dest)
		return s, cl.Close, err
	case "rabbitmq":
		exchange, key, _ := strings.Cut(dest, "/")
		s, err := rabbitmq.NewSender(addr, exchange, key)
		if err != nil {
			return nil, nil, err
		}
		return s, func() { s.Close() }, nil
	case "nats":
		nc, err := nats.Connect(addr, nats.MaxReconnects(-1), nats.ReconnectWait(50*time.Millisecond))
		if err != nil {
			return nil, nil, err
		}
		js, err := jetstream.New(nc)
		if err != nil {
			return nil, nil, err
		}
		s, err := natsconsumer.NewSender(js, dest)
		return s, nc.Close, err
	case "sqs":
		s, err := sqsconsumer.NewSender(sqsClient(addr), dest)
		return s, func() {}, err
	default:
		return nil, nil, fmt.Errorf("unknown broker %q", kind)
	}
}

func sqsClient(base string) *sqs.Client {
	return sqs.New(sqs.Options{
		Region:       "us-east-1",
		BaseEndpoint: aws.String(base),
		Credentials: aws.CredentialsProviderFunc(func(context.Context) (aws.Credentials, error) {
			return aws.Credentials{AccessKeyID: "AKIDCHAOS", SecretAccessKey: "SECRETCHAOS"}, nil
		}),
	})
}

// runs counts handler runs per key.
type runs struct {
	mu sync.Mutex
	n  map[string]int
}

func (r *runs) add(key string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.n == nil {
		r.n = make(map[string]int)
	}
	r.n[key]++
}

func (r *runs) counts() map[string]int {
	r.mu.Lock()
	defer r.mu.Unlock()
	out := make(map[string]int, len(r.n))
	for k, v := range r.n {
		out[k] = v
	}
	return out
}

// consume runs run until handled reaches total, then stops it.
func consume(t *testing.T, run func(context.Context) error, handled func() int64, total int) {
	t.Helper()
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan error, 1)
	go func() { done <- run(ctx) }()
	deadline := time.Now().Add(waitTimeout)
	for handled() < int64(total) {
		if time.Now().After(deadline) {
			cancel()
			<-done
			t.Fatalf("the consumer handled %d of %d messages within %v", handled(), total, waitTimeout)
		}
		time.Sleep(20 * time.Millisecond) // poll the consumer's counters
	}
	cancel()
	if err := <-done; err != nil && !errors.Is(err, natsconsumer.ErrStopped) {
		t.Fatalf("consumer: %v", err)
	}
}

func executor(t *testing.T, rdb *redis.Client, opts ...redisstore.Option) *idem.Executor {
	t.Helper()
	store, err := redisstore.New(rdb, opts...)
	if err != nil {
		t.Fatal(err)
	}
	exec, err := idem.New(store, idem.WithLease(5*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	return exec
}

func handled(s func() consumer.Stats) func() int64 {
	return func() int64 { st := s(); return st.Processed + st.Replayed }
}

// --- Redis Streams: a stream on a redis-server of the test.

const streamTag = "outbox"

type redisStreamBroker struct {
	rdb    *redis.Client
	stream string
}

func setupRedisStream(t *testing.T) broker {
	srv := redistest.Start(t)
	rdb := srv.GoRedis(t)
	return &redisStreamBroker{rdb: rdb, stream: "{" + streamTag + "}:" + destination}
}

func (b *redisStreamBroker) env() []string {
	return []string{envKind + "=redisstream", envBroker + "=" + b.rdb.Options().Addr, envDest + "=" + b.stream}
}

func (b *redisStreamBroker) plain(t *testing.T) map[string]int {
	xs, err := b.rdb.XRange(t.Context(), b.stream, "-", "+").Result()
	if err != nil {
		t.Fatal(err)
	}
	n := map[string]int{}
	for _, x := range xs {
		k, _ := x.Values["key"].(string)
		n[k]++
	}
	return n
}

func (b *redisStreamBroker) dedup(t *testing.T, _ *redis.Client, total int) map[string]int {
	// The consumer's records share the stream's Redis and hash tag: the
	// completion and the XACK are one script.
	var r runs
	c, err := redisstream.New(b.rdb, b.stream, "billing", "c1", executor(t, b.rdb, redisstore.WithHashTag(streamTag)),
		func(ctx context.Context, m redis.XMessage) error {
			k, _ := m.Values["key"].(string)
			r.add(k)
			return nil
		},
		redisstream.WithBlock(50*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	consume(t, c.Run, handled(c.Stats), total)
	return r.counts()
}

// --- Kafka: a kfake cluster in the test process.

type kafkaBroker struct{ addrs []string }

func setupKafka(t *testing.T) broker {
	c, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.SeedTopics(4, destination))
	if err != nil {
		t.Fatalf("kfake: %v", err)
	}
	t.Cleanup(c.Close)
	return &kafkaBroker{addrs: c.ListenAddrs()}
}

func (b *kafkaBroker) env() []string {
	return []string{envKind + "=kafka", envBroker + "=" + b.addrs[0], envDest + "=" + destination}
}

func (b *kafkaBroker) plain(t *testing.T) map[string]int {
	cl, err := kgo.NewClient(kgo.SeedBrokers(b.addrs...), kgo.ConsumeTopics(destination), kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	ends, err := kadm.NewClient(cl).ListEndOffsets(t.Context(), destination)
	if err != nil {
		t.Fatal(err)
	}
	var total int64
	ends.Each(func(o kadm.ListedOffset) { total += o.Offset })
	n := map[string]int{}
	ctx, cancel := context.WithTimeout(t.Context(), waitTimeout)
	defer cancel()
	for got := int64(0); got < total; {
		fs := cl.PollFetches(ctx)
		if err := ctx.Err(); err != nil {
			t.Fatalf("read %d of %d records: %v", got, total, err)
		}
		fs.EachRecord(func(r *kgo.Record) {
			got++
			n[string(kafka.KeyHeader(kafka.DefaultKeyHeader)(r))]++
		})
	}
	return n
}

func (b *kafkaBroker) dedup(t *testing.T, rdb *redis.Client, total int) map[string]int {
	var r runs
	c, err := kafka.New([]kgo.Opt{
		kgo.SeedBrokers(b.addrs...), kgo.ConsumerGroup("billing"), kgo.ConsumeTopics(destination),
		kgo.FetchMaxWait(100 * time.Millisecond),
	}, executor(t, rdb), func(ctx context.Context, rec *kgo.Record) error {
		r.add(string(kafka.KeyHeader(kafka.DefaultKeyHeader)(rec)))
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	consume(t, c.Run, handled(c.Stats), total)
	return r.counts()
}

// --- RabbitMQ: the shared server; a fanout exchange of the test's own
// with two queues: one for the idem consumer, one for the plain count.

type rabbitBroker struct {
	exchange string
	ch       *amqp.Channel
}

// amqpChannel returns a channel on the shared RabbitMQ, closed with its
// connection when the test ends.
func amqpChannel(t *testing.T) *amqp.Channel {
	t.Helper()
	conn, err := amqp.Dial(amqpURL)
	if err != nil {
		t.Fatalf("RabbitMQ at %s is unreachable (%v): start it, e.g. sudo rabbitmq-server -detached, user guest/guest", amqpURL, err)
	}
	t.Cleanup(func() { conn.Close() })
	ch, err := conn.Channel()
	if err != nil {
		t.Fatal(err)
	}
	return ch
}

func setupRabbitMQ(t *testing.T) broker {
	ch := amqpChannel(t)
	ex := uniqueName("idem-chaos-outbox-")
	if err := ch.ExchangeDeclare(ex, "fanout", false, false, false, false, nil); err != nil {
		t.Fatal(err)
	}
	for _, q := range []string{ex + ".dedup", ex + ".plain"} {
		if _, err := ch.QueueDeclare(q, true, false, false, false, nil); err != nil {
			t.Fatal(err)
		}
		if err := ch.QueueBind(q, "", ex, false, nil); err != nil {
			t.Fatal(err)
		}
	}
	t.Cleanup(func() {
		for _, q := range []string{ex + ".dedup", ex + ".dedup.retry", ex + ".dedup.dlq", ex + ".plain"} {
			if _, err := ch.QueueDelete(q, false, false, false); err != nil {
				t.Errorf("cleanup: delete queue %s: %v", q, err)
			}
		}
		if err := ch.ExchangeDelete(ex, false, false); err != nil {
			t.Errorf("cleanup: delete exchange %s: %v", ex, err)
		}
	})
	return &rabbitBroker{exchange: ex, ch: ch}
}

func (b *rabbitBroker) env() []string {
	return []string{envKind + "=rabbitmq", envBroker + "=" + amqpURL, envDest + "=" + b.exchange + "/"}
}

func (b *rabbitBroker) plain(t *testing.T) map[string]int {
	n := map[string]int{}
	for {
		d, ok, err := b.ch.Get(b.exchange+".plain", true)
		if err != nil {
			t.Fatal(err)
		}
		if !ok {
			return n
		}
		n[d.MessageId]++
	}
}

func (b *rabbitBroker) dedup(t *testing.T, rdb *redis.Client, total int) map[string]int {
	var r runs
	q := b.exchange + ".dedup"
	c, err := rabbitmq.New(amqpURL, q, executor(t, rdb), func(ctx context.Context, d *amqp.Delivery) error {
		r.add(d.MessageId)
		return nil
	}, consumer.WithScope(q), rabbitmq.WithBatchWait(20*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	consume(t, c.Run, handled(c.Stats), total)
	return r.counts()
}

// --- NATS JetStream: the shared server; a stream of the test's own.

type natsBroker struct {
	name   string
	js     jetstream.JetStream
	stream jetstream.Stream
}

func setupNATS(t *testing.T) broker {
	nc, err := nats.Connect(natsURL, nats.Timeout(2*time.Second))
	if err != nil {
		t.Fatalf("nats-server with JetStream at %s is unreachable (%v): start it, e.g. nats-server -js", natsURL, err)
	}
	t.Cleanup(nc.Close)
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	name := strings.ToUpper(uniqueName("IDEM_CHAOS_OUTBOX_"))
	st, err := js.CreateStream(t.Context(), jetstream.StreamConfig{
		Name: name, Subjects: []string{name + ".>"}, Storage: jetstream.MemoryStorage, Duplicates: natsDuplicates,
	})
	if err != nil {
		t.Fatalf("create stream: %v", err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if err := js.DeleteStream(ctx, name); err != nil {
			t.Errorf("cleanup: delete stream %s: %v", name, err)
		}
	})
	return &natsBroker{name: name, js: js, stream: st}
}

func (b *natsBroker) env() []string {
	return []string{envKind + "=nats", envBroker + "=" + natsURL, envDest + "=" + b.name + "." + destination}
}

func (b *natsBroker) plain(t *testing.T) map[string]int {
	info, err := b.stream.Info(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	n := map[string]int{}
	for seq := info.State.FirstSeq; info.State.Msgs > 0 && seq <= info.State.LastSeq; seq++ {
		m, err := b.stream.GetMsg(t.Context(), seq)
		if err != nil {
			t.Fatalf("get message %d: %v", seq, err)
		}
		n[m.Header.Get(natsconsumer.DefaultKeyHeader)]++
	}
	return n
}

func (b *natsBroker) dedup(t *testing.T, rdb *redis.Client, total int) map[string]int {
	cons, err := b.js.CreateOrUpdateConsumer(t.Context(), b.name, jetstream.ConsumerConfig{
		Durable: "billing", AckPolicy: jetstream.AckExplicitPolicy, AckWait: 5 * time.Second, MaxDeliver: -1,
	})
	if err != nil {
		t.Fatal(err)
	}
	var r runs
	c, err := natsconsumer.New(b.js, cons, executor(t, rdb), func(ctx context.Context, m jetstream.Msg) error {
		r.add(m.Headers().Get(natsconsumer.DefaultKeyHeader))
		return nil
	}, consumer.WithScope(b.name), natsconsumer.WithFetchMaxWait(200*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	consume(t, c.Run, handled(c.Stats), total)
	return r.counts()
}

// --- SQS: the fake SQS server in the test process, over HTTP.

type sqsBroker struct {
	fake          *sqsfake.Server
	base          string
	queueURL, dlq string
}

func setupSQS(t *testing.T) broker {
	fake := sqsfake.New("")
	srv := httptest.NewServer(fake)
	t.Cleanup(srv.Close)
	fake.SetBase(srv.URL)
	return &sqsBroker{
		fake: fake, base: srv.URL,
		queueURL: fake.CreateQueue(destination, sqsfake.QueueOptions{VisibilityTimeout: 30 * time.Second}),
		dlq:      fake.CreateQueue(destination+"-dlq", sqsfake.QueueOptions{}),
	}
}

func (b *sqsBroker) env() []string {
	return []string{envKind + "=sqs", envBroker + "=" + b.base, envDest + "=" + b.queueURL}
}

func (b *sqsBroker) plain(*testing.T) map[string]int {
	n := map[string]int{}
	for _, m := range b.fake.Messages(destination) {
		n[m.Attributes[sqsconsumer.DefaultKeyAttribute].StringValue]++
	}
	return n
}

func (b *sqsBroker) dedup(t *testing.T, rdb *redis.Client, total int) map[string]int {
	var r runs
	c, err := sqsconsumer.New(sqsClient(b.base), b.queueURL, b.dlq, executor(t, rdb), func(ctx context.Context, m sqstypes.Message) error {
		r.add(sqsconsumer.DefaultKey(m))
		return nil
	}, sqsconsumer.WithWaitTime(time.Second))
	if err != nil {
		t.Fatal(err)
	}
	consume(t, c.Run, handled(c.Stats), total)
	return r.counts()
}
