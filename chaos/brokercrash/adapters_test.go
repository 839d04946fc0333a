package brokercrash

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"net/http/httptest"
	"os"
	"strconv"
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
	"github.com/idemgo/idem/chaos/chaostest"
	"github.com/idemgo/idem/consumer"
	"github.com/idemgo/idem/consumer/kafka"
	natsconsumer "github.com/idemgo/idem/consumer/nats"
	"github.com/idemgo/idem/consumer/rabbitmq"
	"github.com/idemgo/idem/consumer/redisstream"
	sqsconsumer "github.com/idemgo/idem/consumer/sqs"
	"github.com/idemgo/idem/redisstore"
	"github.com/idemgo/idem/testkit/redistest"
	"github.com/idemgo/idem/testkit/sqsfake"
)

// Environment of a child, set by a broker's env.
const (
	envBroker = "IDEM_BC_BROKER" // the broker's address or URL
	envQueue  = "IDEM_BC_QUEUE"  // the stream, topic, queue (URL for SQS)
	envDLQ    = "IDEM_BC_DLQ"    // the SQS dead-letter queue URL
)

// The servers the RabbitMQ and NATS variants need; the others start their
// own (redis-server, kfake, the SQS fake).
const (
	amqpURL = "amqp://guest:guest@127.0.0.1:5672/"
	natsURL = "nats://127.0.0.1:4222"
)

// adapters are the broker adapters under test, each with the settings that
// make a crashed consumer's message come back quickly: every one hands
// messages one at a time (batches of one) to a single handler goroutine.
var adapters = []adapter{
	{name: "redisstream", redelivery: "XAUTOCLAIM after 2s idle", setup: setupRedisStream, start: startRedisStream},
	{name: "kafka", redelivery: "group rebalance after a 2s session timeout", setup: setupKafka, start: startKafka},
	{name: "rabbitmq", redelivery: "requeue when the connection closes", setup: setupRabbitMQ, start: startRabbitMQ},
	{name: "nats", redelivery: "AckWait 2s", setup: setupNATS, start: startNATS},
	{name: "sqs", redelivery: "visibility timeout 3s", setup: setupSQS, start: startSQS},
}

// uniqueName returns a name no other test run uses, for shared brokers.
func uniqueName(prefix string) string {
	var b [6]byte
	_, _ = rand.Read(b[:])
	return prefix + hex.EncodeToString(b[:])
}

// --- Redis Streams: the stream lives on the test's redis-server.

const (
	streamTag   = "chaos"
	streamName  = "{" + streamTag + "}:orders"
	streamGroup = "billing"
)

type redisStreamBroker struct{ rdb *redis.Client }

func setupRedisStream(t *testing.T, srv *redistest.Server) broker {
	rdb := redis.NewClient(&redis.Options{Addr: srv.Addr()})
	t.Cleanup(func() { _ = rdb.Close() })
	if err := rdb.XGroupCreateMkStream(t.Context(), streamName, streamGroup, "0").Err(); err != nil {
		t.Fatal(err)
	}
	return &redisStreamBroker{rdb}
}

func (b *redisStreamBroker) env() []string { return nil }

func (b *redisStreamBroker) publish(t *testing.T, msgs []message) {
	_, err := b.rdb.Pipelined(t.Context(), func(p redis.Pipeliner) error {
		for _, m := range msgs {
			p.XAdd(t.Context(), &redis.XAddArgs{Stream: streamName, Values: map[string]any{"key": m.key, "seq": m.seq}})
		}
		return nil
	})
	if err != nil {
		t.Fatalf("publish: %v", err)
	}
}

// remaining is the group's pending entries plus those not delivered yet.
func (b *redisStreamBroker) remaining(t *testing.T, _ int) int {
	groups, err := b.rdb.XInfoGroups(t.Context(), streamName).Result()
	if err != nil || len(groups) != 1 {
		t.Fatalf("XINFO GROUPS: %v %v", groups, err)
	}
	g := groups[0]
	undelivered := g.Lag
	if undelivered < 0 { // the server cannot tell: count
		rest, err := b.rdb.XRange(t.Context(), streamName, "("+g.LastDeliveredID, "+").Result()
		if err != nil {
			t.Fatalf("XRANGE: %v", err)
		}
		undelivered = int64(len(rest))
	}
	return int(g.Pending + undelivered)
}

func (b *redisStreamBroker) deadLetters(t *testing.T) int {
	n, err := b.rdb.XLen(t.Context(), streamName+":dlq").Result()
	if err != nil {
		t.Fatalf("XLEN: %v", err)
	}
	return int(n)
}

func startRedisStream(rdb *redis.Client, h handlerFunc, opts ...consumer.Option) (func(context.Context) error, error) {
	store, err := redisstore.New(rdb, redisstore.WithHashTag(streamTag))
	if err != nil {
		return nil, err
	}
	exec, err := idem.New(store, idem.WithLease(lease))
	if err != nil {
		return nil, err
	}
	c, err := redisstream.New(rdb, streamName, streamGroup, os.Getenv(envName), exec,
		func(ctx context.Context, m redis.XMessage) error {
			key, _ := m.Values["key"].(string)
			return h(ctx, key)
		},
		append([]consumer.Option{consumer.WithBatchSize(1), redisstream.WithBlock(100 * time.Millisecond),
			consumer.WithRetryDelay(100 * time.Millisecond)}, opts...)...)
	if err != nil {
		return nil, err
	}
	return c.Run, nil
}

// --- Kafka: a kfake cluster in the test process, on loopback.

const (
	kafkaTopic      = "orders"
	kafkaGroup      = "billing"
	kafkaPartitions = 4
	kafkaSession    = 2 * time.Second
)

type kafkaBroker struct {
	addrs []string
	cl    *kgo.Client
	adm   *kadm.Client
}

func setupKafka(t *testing.T, _ *redistest.Server) broker {
	c, err := kfake.NewCluster(kfake.NumBrokers(1),
		kfake.SeedTopics(kafkaPartitions, kafkaTopic, kafkaTopic+kafka.DefaultDLQSuffix),
		kfake.GroupMinSessionTimeout(500*time.Millisecond))
	if err != nil {
		t.Fatalf("kfake: %v", err)
	}
	t.Cleanup(c.Close)
	cl, err := kgo.NewClient(kgo.SeedBrokers(c.ListenAddrs()...), kgo.ProducerLinger(time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(cl.Close)
	return &kafkaBroker{addrs: c.ListenAddrs(), cl: cl, adm: kadm.NewClient(cl)}
}

func (b *kafkaBroker) env() []string { return []string{envBroker + "=" + b.addrs[0]} }

func (b *kafkaBroker) publish(t *testing.T, msgs []message) {
	rs := make([]*kgo.Record, len(msgs))
	for i, m := range msgs {
		rs[i] = &kgo.Record{Topic: kafkaTopic, Key: []byte(m.key), Value: []byte(strconv.Itoa(m.seq)),
			Headers: []kgo.RecordHeader{{Key: kafka.DefaultKeyHeader, Value: []byte(m.key)}}}
	}
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	if err := b.cl.ProduceSync(ctx, rs...).FirstErr(); err != nil {
		t.Fatalf("produce: %v", err)
	}
}

// remaining is the group's lag: records past the committed offsets.
func (b *kafkaBroker) remaining(t *testing.T, _ int) int {
	return int(b.lag(t, kafkaTopic))
}

func (b *kafkaBroker) lag(t *testing.T, topic string) int64 {
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	ends, err := b.adm.ListEndOffsets(ctx, topic)
	if err != nil {
		t.Fatalf("list end offsets: %v", err)
	}
	committed, err := b.adm.FetchOffsets(ctx, kafkaGroup)
	if err != nil {
		t.Fatalf("fetch offsets: %v", err)
	}
	var n int64
	ends.Each(func(o kadm.ListedOffset) {
		at := int64(0)
		if c, ok := committed.Lookup(o.Topic, o.Partition); ok && c.At >= 0 {
			at = c.At
		}
		n += o.Offset - at
	})
	return n
}

func (b *kafkaBroker) deadLetters(t *testing.T) int {
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	ends, err := b.adm.ListEndOffsets(ctx, kafkaTopic+kafka.DefaultDLQSuffix)
	if err != nil {
		t.Fatalf("list end offsets: %v", err)
	}
	var n int64
	ends.Each(func(o kadm.ListedOffset) { n += o.Offset })
	return int(n)
}

func startKafka(rdb *redis.Client, h handlerFunc, opts ...consumer.Option) (func(context.Context) error, error) {
	exec, err := chaostest.NewRedisExecutor(rdb, lease)
	if err != nil {
		return nil, err
	}
	c, err := kafka.New(
		[]kgo.Opt{
			kgo.SeedBrokers(os.Getenv(envBroker)),
			kgo.ConsumerGroup(kafkaGroup),
			kgo.ConsumeTopics(kafkaTopic),
			kgo.FetchMaxWait(100 * time.Millisecond),
			kgo.SessionTimeout(kafkaSession),
			kgo.HeartbeatInterval(200 * time.Millisecond),
			kgo.RebalanceTimeout(3 * time.Second),
			kgo.AutoCommitInterval(200 * time.Millisecond),
		}, exec, func(ctx context.Context, r *kgo.Record) error { return h(ctx, string(r.Key)) },
		append([]consumer.Option{consumer.WithBatchSize(1), consumer.WithConcurrency(1),
			consumer.WithRetryDelay(100 * time.Millisecond), consumer.WithScope(kafkaTopic)}, opts...)...)
	if err != nil {
		return nil, err
	}
	return c.Run, nil
}

// --- RabbitMQ: the server on 127.0.0.1:5672, a queue of the test's own.

type rabbitBroker struct {
	queue string
	conn  *amqp.Connection
	ch    *amqp.Channel
	rdb   *redis.Client
}

func setupRabbitMQ(t *testing.T, srv *redistest.Server) broker {
	conn, err := amqp.Dial(amqpURL)
	if err != nil {
		t.Fatalf("RabbitMQ at %s is unreachable (%v): start it, e.g. sudo systemctl start rabbitmq-server, user guest/guest", amqpURL, err)
	}
	t.Cleanup(func() { _ = conn.Close() })
	queue := uniqueName("idem-chaos-crash-")
	ch, err := conn.Channel()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		for _, q := range []string{queue, queue + ".retry", queue + ".dlq"} {
			if _, err := ch.QueueDelete(q, false, false, false); err != nil {
				t.Errorf("cleanup: delete queue %s: %v", q, err)
			}
		}
	})
	if _, err := ch.QueueDeclare(queue, true, false, false, false, nil); err != nil {
		t.Fatal(err)
	}
	if err := ch.Confirm(false); err != nil {
		t.Fatal(err)
	}
	rdb := redis.NewClient(&redis.Options{Addr: srv.Addr()})
	t.Cleanup(func() { _ = rdb.Close() })
	return &rabbitBroker{queue: queue, conn: conn, ch: ch, rdb: rdb}
}

func (b *rabbitBroker) env() []string {
	return []string{envBroker + "=" + amqpURL, envQueue + "=" + b.queue}
}

func (b *rabbitBroker) publish(t *testing.T, msgs []message) {
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	dcs := make([]*amqp.DeferredConfirmation, len(msgs))
	for i, m := range msgs {
		dc, err := b.ch.PublishWithDeferredConfirmWithContext(ctx, "", b.queue, false, false, amqp.Publishing{
			MessageId: m.key, Body: []byte(strconv.Itoa(m.seq)), DeliveryMode: amqp.Persistent,
		})
		if err != nil {
			t.Fatalf("publish: %v", err)
		}
		dcs[i] = dc
	}
	for _, dc := range dcs {
		if ok, err := dc.WaitContext(ctx); !ok || err != nil {
			t.Fatalf("publish not confirmed: %v", err)
		}
	}
}

// remaining is the number of messages in the queue and its retry queue,
// ready or delivered and not acknowledged yet, as rabbitmqctl counts them
// (AMQP's passive declare counts only the ready ones).
func (b *rabbitBroker) remaining(t *testing.T, _ int) int {
	return chaostest.RabbitMQMessages(t, b.queue, b.queue+".retry")
}

func (b *rabbitBroker) depth(t *testing.T, queue string) int {
	ch, err := b.conn.Channel()
	if err != nil {
		t.Fatal(err)
	}
	defer ch.Close()
	q, err := ch.QueueDeclarePassive(queue, true, false, false, false, nil)
	var aerr *amqp.Error
	if errors.As(err, &aerr) && aerr.Code == amqp.NotFound {
		return 0 // not declared (yet): no consumer has started
	}
	if err != nil {
		t.Fatalf("inspect queue %s: %v", queue, err)
	}
	return q.Messages
}

func (b *rabbitBroker) deadLetters(t *testing.T) int { return b.depth(t, b.queue+".dlq") }

func startRabbitMQ(rdb *redis.Client, h handlerFunc, opts ...consumer.Option) (func(context.Context) error, error) {
	exec, err := chaostest.NewRedisExecutor(rdb, lease)
	if err != nil {
		return nil, err
	}
	queue := os.Getenv(envQueue)
	c, err := rabbitmq.New(os.Getenv(envBroker), queue, exec,
		func(ctx context.Context, d *amqp.Delivery) error { return h(ctx, d.MessageId) },
		append([]consumer.Option{consumer.WithScope(queue), consumer.WithRetryDelay(100 * time.Millisecond),
			consumer.WithBatchSize(1), rabbitmq.WithPrefetch(4), rabbitmq.WithMaxDelay(lease),
			rabbitmq.WithBackoff(50*time.Millisecond, time.Second)}, opts...)...)
	if err != nil {
		return nil, err
	}
	return c.Run, nil
}

// --- NATS JetStream: the server on 127.0.0.1:4222, a stream of the test's own.

const (
	natsDurable = "workers"
	natsHeader  = "Idem-Key"
	natsAckWait = 2 * time.Second
)

type natsBroker struct {
	name string
	js   jetstream.JetStream
	cons jetstream.Consumer
	dlq  jetstream.Stream
}

func setupNATS(t *testing.T, _ *redistest.Server) broker {
	nc, err := nats.Connect(natsURL, nats.Timeout(2*time.Second))
	if err != nil {
		t.Fatalf("nats-server with JetStream at %s is unreachable (%v): start it, e.g. nats-server -js", natsURL, err)
	}
	t.Cleanup(nc.Close)
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	name := uniqueName("IDEM_CHAOS_CRASH_")
	ctx := t.Context()
	if _, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: name, Subjects: []string{name + ".>"}, Storage: jetstream.MemoryStorage}); err != nil {
		t.Fatalf("create stream: %v", err)
	}
	dlq, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: name + "_DLQ", Subjects: []string{"dlq." + name + ".>"}, Storage: jetstream.MemoryStorage})
	if err != nil {
		t.Fatalf("create dead-letter stream: %v", err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		for _, s := range []string{name, name + "_DLQ"} {
			if err := js.DeleteStream(ctx, s); err != nil {
				t.Errorf("cleanup: delete stream %s: %v", s, err)
			}
		}
	})
	cons, err := js.CreateOrUpdateConsumer(ctx, name, jetstream.ConsumerConfig{
		Durable: natsDurable, AckPolicy: jetstream.AckExplicitPolicy, AckWait: natsAckWait,
		MaxDeliver: -1, MaxAckPending: 10000,
	})
	if err != nil {
		t.Fatalf("create consumer: %v", err)
	}
	return &natsBroker{name: name, js: js, cons: cons, dlq: dlq}
}

func (b *natsBroker) env() []string {
	return []string{envBroker + "=" + natsURL, envQueue + "=" + b.name}
}

func (b *natsBroker) publish(t *testing.T, msgs []message) {
	futures := make([]jetstream.PubAckFuture, len(msgs))
	for i, m := range msgs {
		msg := nats.NewMsg(b.name + ".orders")
		msg.Header.Set(natsHeader, m.key)
		msg.Data = []byte(strconv.Itoa(m.seq))
		f, err := b.js.PublishMsgAsync(msg)
		if err != nil {
			t.Fatalf("publish: %v", err)
		}
		futures[i] = f
	}
	timeout := time.After(30 * time.Second)
	for _, f := range futures {
		select {
		case <-f.Ok():
		case err := <-f.Err():
			t.Fatalf("publish: %v", err)
		case <-timeout:
			t.Fatal("publish: no acknowledgement within 30s")
		}
	}
}

// remaining is the consumer's messages not delivered yet plus those
// delivered and not acknowledged.
func (b *natsBroker) remaining(t *testing.T, _ int) int {
	info, err := b.cons.Info(t.Context())
	if err != nil {
		t.Fatalf("consumer info: %v", err)
	}
	return int(info.NumPending) + info.NumAckPending
}

func (b *natsBroker) deadLetters(t *testing.T) int {
	info, err := b.dlq.Info(t.Context())
	if err != nil {
		t.Fatalf("dead-letter stream info: %v", err)
	}
	return int(info.State.Msgs)
}

func startNATS(rdb *redis.Client, h handlerFunc, opts ...consumer.Option) (func(context.Context) error, error) {
	exec, err := chaostest.NewRedisExecutor(rdb, lease)
	if err != nil {
		return nil, err
	}
	nc, err := nats.Connect(os.Getenv(envBroker))
	if err != nil {
		return nil, err
	}
	js, err := jetstream.New(nc)
	if err != nil {
		return nil, err
	}
	stream := os.Getenv(envQueue)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	cons, err := js.Consumer(ctx, stream, natsDurable)
	if err != nil {
		return nil, err
	}
	c, err := natsconsumer.New(js, cons, exec,
		func(ctx context.Context, m jetstream.Msg) error { return h(ctx, m.Headers().Get(natsHeader)) },
		append([]consumer.Option{consumer.WithScope(stream), consumer.WithRetryDelay(100 * time.Millisecond),
			natsconsumer.WithKeyHeader(natsHeader), consumer.WithBatchSize(1),
			natsconsumer.WithFetchMaxWait(200 * time.Millisecond)}, opts...)...)
	if err != nil {
		return nil, err
	}
	return func(ctx context.Context) error {
		defer nc.Close()
		if err := c.Run(ctx); !errors.Is(err, natsconsumer.ErrStopped) {
			return err
		}
		return nil
	}, nil
}

// --- SQS: the fake SQS server in the test process, over HTTP on loopback.

const (
	sqsQueue      = "orders"
	sqsDLQ        = "orders-dlq"
	sqsVisibility = 3 * time.Second // the shortest the consumer accepts
	sqsKeyAttr    = sqsconsumer.DefaultKeyAttribute
)

type sqsBroker struct {
	fake          *sqsfake.Server
	base          string
	queueURL, dlq string
}

func setupSQS(t *testing.T, _ *redistest.Server) broker {
	fake := sqsfake.New("")
	srv := httptest.NewServer(fake)
	t.Cleanup(srv.Close)
	fake.SetBase(srv.URL)
	return &sqsBroker{
		fake: fake, base: srv.URL,
		queueURL: fake.CreateQueue(sqsQueue, sqsfake.QueueOptions{VisibilityTimeout: sqsVisibility}),
		dlq:      fake.CreateQueue(sqsDLQ, sqsfake.QueueOptions{}),
	}
}

func (b *sqsBroker) env() []string {
	return []string{envBroker + "=" + b.base, envQueue + "=" + b.queueURL, envDLQ + "=" + b.dlq}
}

func (b *sqsBroker) publish(_ *testing.T, msgs []message) {
	for _, m := range msgs {
		b.fake.Send(sqsQueue, strconv.Itoa(m.seq),
			map[string]sqsfake.MessageAttribute{sqsKeyAttr: {DataType: "String", StringValue: m.key}}, "")
	}
}

// remaining is the messages still in the queue: visible, in flight or
// delayed (a deleted message is gone).
func (b *sqsBroker) remaining(*testing.T, int) int {
	c := b.fake.Counts(sqsQueue)
	return c.Visible + c.InFlight + c.Delayed
}

func (b *sqsBroker) deadLetters(*testing.T) int {
	c := b.fake.Counts(sqsDLQ)
	return c.Visible + c.InFlight + c.Delayed
}

func startSQS(rdb *redis.Client, h handlerFunc, opts ...consumer.Option) (func(context.Context) error, error) {
	exec, err := chaostest.NewRedisExecutor(rdb, lease)
	if err != nil {
		return nil, err
	}
	client := sqs.New(sqs.Options{
		Region:       "us-east-1",
		BaseEndpoint: aws.String(os.Getenv(envBroker)),
		Credentials: aws.CredentialsProviderFunc(func(context.Context) (aws.Credentials, error) {
			return aws.Credentials{AccessKeyID: "AKIDCHAOS", SecretAccessKey: "SECRETCHAOS"}, nil
		}),
	})
	c, err := sqsconsumer.New(client, os.Getenv(envQueue), os.Getenv(envDLQ), exec,
		func(ctx context.Context, m sqstypes.Message) error { return h(ctx, sqsconsumer.DefaultKey(m)) },
		append([]consumer.Option{consumer.WithBatchSize(1), sqsconsumer.WithVisibilityTimeout(sqsVisibility),
			sqsconsumer.WithWaitTime(time.Second), consumer.WithRetryDelay(100 * time.Millisecond)}, opts...)...)
	if err != nil {
		return nil, err
	}
	return c.Run, nil
}
