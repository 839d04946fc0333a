// Package brokersource builds the consumers of `idem consume --from`: the
// adapter of package consumer for each broker (Redis Streams, Kafka,
// RabbitMQ, NATS JetStream, SQS), fed the broker URL of package brokerurl,
// --key's key function and the sidecar.Handler that each delivery, made a
// sidecar.Delivery by package delivery, is POSTed to. The flags are
// main's; this package takes their values.
package brokersource

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"sync"
	"time"

	"github.com/aws/aws-sdk-go-v2/service/sqs/types"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	amqp "github.com/rabbitmq/amqp091-go"
	"github.com/redis/go-redis/v9"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/idemgo/idem"
	"github.com/idemgo/idem/cmd/idem/internal/brokerurl"
	"github.com/idemgo/idem/cmd/idem/internal/cli"
	"github.com/idemgo/idem/cmd/idem/internal/delivery"
	"github.com/idemgo/idem/cmd/idem/internal/storeopen"
	"github.com/idemgo/idem/consumer"
	"github.com/idemgo/idem/consumer/kafka"
	natsconsumer "github.com/idemgo/idem/consumer/nats"
	"github.com/idemgo/idem/consumer/rabbitmq"
	"github.com/idemgo/idem/consumer/redisstream"
	"github.com/idemgo/idem/consumer/sidecar"
	sqsconsumer "github.com/idemgo/idem/consumer/sqs"
)

// Config is what the consumers are built from: the values of consume's
// flags.
type Config struct {
	Broker  *brokerurl.URL   // --from, parsed
	Key     delivery.KeySpec // --key, parsed
	Handler *sidecar.Handler // --to and the handler's flags
	// Options are the consumer options of every broker (the flags');
	// Open adds --key's key function, and WithConcurrency where the
	// adapter runs its own handlers at once.
	Options     []consumer.Option
	Concurrency int                   // --concurrency
	Name        string                // the consumer's name in a Redis stream's group (--name)
	Scope       string                // --scope; without it an SQS queue's keys are scoped by its URL
	DeadLetter  string                // --dead-letter: an SQS queue's dead-letter queue URL
	Lease       time.Duration         // --lease: the AckWait of a JetStream consumer created
	Redis       redis.UniversalClient // a Redis stream's client: the store's
}

// Source is a broker's consumers, built.
type Source struct {
	Run   func(ctx context.Context) error // until ctx is done and the drain ended
	Stats func() consumer.Stats
	Close func()
}

// options returns a copy of the Options, for one adapter.
func (c *Config) options() []consumer.Option { return slices.Clone(c.Options) }

// Open builds the consumers of the Broker, which call the Handler with
// exec.
func (c *Config) Open(ctx context.Context, exec *idem.Executor) (*Source, error) {
	switch c.Broker.Kind {
	case "redis-stream":
		return c.openRedisStream(exec)
	case "kafka":
		return c.openKafka(exec)
	case "amqp":
		return c.openAMQP(exec)
	case "nats":
		return c.openNATS(ctx, exec)
	}
	return c.openSQS(ctx, exec)
}

// openRedisStream builds --concurrency consumers of the group.
func (c *Config) openRedisStream(exec *idem.Executor) (*Source, error) {
	b := c.Broker
	opts := c.options()
	keyField := c.Key.HeaderOr(redisstream.DefaultKeyField)
	if !c.Key.IsDefault() {
		opts = append(opts, redisstream.WithKeyFunc(c.Key.RedisStreamKey))
	}
	handle := func(ctx context.Context, m redis.XMessage) error {
		return c.Handler.Call(ctx, delivery.RedisStream(b.Target, keyField, m))
	}
	var cs []*redisstream.Consumer
	for i := range c.Concurrency {
		name := c.Name
		if c.Concurrency > 1 {
			name += "-" + strconv.Itoa(i)
		}
		rc, err := redisstream.New(c.Redis, b.Target, b.Query.Get("group"), name, exec, handle, opts...)
		if err != nil {
			return nil, cli.Usagef("consume: %v", err)
		}
		cs = append(cs, rc)
	}
	return sourceOf(cs, nil, func() {}), nil
}

// runner is a broker consumer of the consumer package's adapters.
type runner interface {
	Run(ctx context.Context) error
	Stats() consumer.Stats
}

// sourceOf is the source of the consumers cs, run at once until every one
// has returned, their statistics summed; a Run's error that is stopped
// (the adapter's clean stop; nil for none) is no error; close ends what
// they share.
func sourceOf[C runner](cs []C, stopped error, close func()) *Source {
	return &Source{
		Run: func(ctx context.Context) error {
			errs := make([]error, len(cs))
			var wg sync.WaitGroup
			for i, c := range cs {
				wg.Go(func() {
					if err := c.Run(ctx); !errors.Is(err, stopped) {
						errs[i] = err
					}
				})
			}
			wg.Wait()
			return errors.Join(errs...)
		},
		Stats: func() consumer.Stats {
			var s consumer.Stats
			for _, c := range cs {
				s = addStats(s, c.Stats())
			}
			return s
		},
		Close: close,
	}
}

// addStats adds the counters of b to a.
func addStats(a, b consumer.Stats) consumer.Stats {
	a.Processed += b.Processed
	a.Replayed += b.Replayed
	a.Retried += b.Retried
	a.DeadLettered += b.DeadLettered
	a.Invalid += b.Invalid
	a.Panics += b.Panics
	a.Redelivered += b.Redelivered
	a.Errors += b.Errors
	a.Abandoned += b.Abandoned
	return a
}

// openKafka builds the member of the consumer group ?group= of the topic.
func (c *Config) openKafka(exec *idem.Executor) (*Source, error) {
	b := c.Broker
	group := b.Query.Get("group")
	if group == "" {
		return nil, cli.Usagef("consume: --from %s has no group: add ?group=NAME", b.Where)
	}
	opts := append(c.options(), consumer.WithConcurrency(c.Concurrency))
	if !c.Key.IsDefault() {
		opts = append(opts, kafka.WithKeyFunc(c.Key.KafkaKey))
	}
	keyHeader := c.Key.HeaderOr(kafka.DefaultKeyHeader)
	kopts := []kgo.Opt{kgo.SeedBrokers(b.Brokers...), kgo.ConsumerGroup(group), kgo.ConsumeTopics(b.Target)}
	kc, err := kafka.New(kopts, exec, func(ctx context.Context, r *kgo.Record) error {
		return c.Handler.Call(ctx, delivery.Kafka(keyHeader, r))
	}, opts...)
	if err != nil {
		return nil, cli.Usagef("consume: %v", err)
	}
	return &Source{Run: kc.Run, Stats: kc.Stats, Close: func() {}}, nil
}

// openAMQP builds the consumer of the queue.
func (c *Config) openAMQP(exec *idem.Executor) (*Source, error) {
	b := c.Broker
	queue := b.Target
	opts := append(c.options(), consumer.WithConcurrency(c.Concurrency))
	if !c.Key.IsDefault() {
		opts = append(opts, rabbitmq.WithKeyFunc(c.Key.AMQPKey))
	}
	rc, err := rabbitmq.New(b.AMQPDial, queue, exec, func(ctx context.Context, d *amqp.Delivery) error {
		return c.Handler.Call(ctx, delivery.AMQP(queue, d))
	}, opts...)
	if err != nil {
		return nil, cli.Usagef("consume: %v", err)
	}
	return &Source{Run: rc.Run, Stats: rc.Stats, Close: func() {}}, nil
}

// natsDurable connects to the NATS server of --from and returns the
// JetStream stream's durable consumer, created (explicit acks, no
// server-side maximum of deliveries, AckWait of --lease) if it does not
// exist. The caller closes nc.
func (c *Config) natsDurable(ctx context.Context, durable string) (*nats.Conn, jetstream.JetStream, jetstream.Consumer, error) {
	b := c.Broker
	nc, err := nats.Connect(b.NATSServer, nats.Name("idem consume"), nats.MaxReconnects(-1))
	if err != nil {
		return nil, nil, nil, fmt.Errorf("consume: %s: %v", b.Where, err)
	}
	js, err := jetstream.New(nc)
	if err != nil {
		nc.Close()
		return nil, nil, nil, err
	}
	cctx, cancel := context.WithTimeout(ctx, storeopen.ConnectTimeout)
	defer cancel()
	cons, err := js.Consumer(cctx, b.Target, durable)
	if errors.Is(err, jetstream.ErrConsumerNotFound) {
		cons, err = js.CreateConsumer(cctx, b.Target, jetstream.ConsumerConfig{
			Durable: durable, AckPolicy: jetstream.AckExplicitPolicy, MaxDeliver: -1, AckWait: max(c.Lease, time.Second),
		})
	}
	if err != nil {
		nc.Close()
		return nil, nil, nil, fmt.Errorf("consume: consumer %s of JetStream stream %s at %s: %v", durable, b.Target, b.NATSServer, err)
	}
	return nc, js, cons, nil
}

// openNATS builds the consumers of the JetStream stream's durable
// consumer ?consumer=, created (explicit acks, no server-side maximum of
// deliveries, AckWait of --lease) if it does not exist.
func (c *Config) openNATS(ctx context.Context, exec *idem.Executor) (*Source, error) {
	b := c.Broker
	durable := b.Query.Get("consumer")
	if durable == "" {
		return nil, cli.Usagef("consume: --from %s has no consumer: add ?consumer=DURABLE", b.Where)
	}
	nc, js, cons, err := c.natsDurable(ctx, durable)
	if err != nil {
		return nil, err
	}
	opts := c.options()
	if !c.Key.IsDefault() {
		opts = append(opts, natsconsumer.WithKeyFunc(c.Key.NATSKey))
	}
	keyHeader := c.Key.HeaderOr(natsconsumer.DefaultKeyHeader)
	stream := b.Target
	var ncs []*natsconsumer.Consumer
	for range c.Concurrency {
		n, err := natsconsumer.New(js, cons, exec, func(ctx context.Context, m jetstream.Msg) error {
			return c.Handler.Call(ctx, delivery.NATS(stream, keyHeader, m))
		}, opts...)
		if err != nil {
			nc.Close()
			return nil, cli.Usagef("consume: %v", err)
		}
		ncs = append(ncs, n)
	}
	return sourceOf(ncs, natsconsumer.ErrStopped, nc.Close), nil
}

// openSQS builds the consumer of the queue, with the AWS SDK's default
// credential chain.
func (c *Config) openSQS(ctx context.Context, exec *idem.Executor) (*Source, error) {
	b := c.Broker
	client, err := b.SQSClient(ctx)
	if err != nil {
		return nil, fmt.Errorf("consume: %s: %v", b.Where, err)
	}
	opts := append(c.options(), consumer.WithConcurrency(c.Concurrency))
	if c.Scope == "" {
		opts = append(opts, consumer.WithScope(b.QueueURL))
	}
	if !c.Key.IsDefault() {
		opts = append(opts, sqsconsumer.WithKeyFunc(c.Key.SQSKey))
	}
	keyAttr := c.Key.HeaderOr(sqsconsumer.DefaultKeyAttribute)
	queue := b.Target
	sc, err := sqsconsumer.New(client, b.QueueURL, c.DeadLetter, exec, func(ctx context.Context, m types.Message) error {
		return c.Handler.Call(ctx, delivery.SQS(queue, keyAttr, m))
	}, opts...)
	if err != nil {
		return nil, cli.Usagef("consume: %v", err)
	}
	return &Source{Run: sc.Run, Stats: sc.Stats, Close: func() {}}, nil
}
