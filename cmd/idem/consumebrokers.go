package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/aws/aws-sdk-go-v2/service/sqs/types"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	amqp "github.com/rabbitmq/amqp091-go"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/idemgo/idem"
	"github.com/idemgo/idem/cmd/idem/internal/cli"
	"github.com/idemgo/idem/cmd/idem/internal/delivery"
	"github.com/idemgo/idem/consumer"
	"github.com/idemgo/idem/consumer/kafka"
	natsconsumer "github.com/idemgo/idem/consumer/nats"
	"github.com/idemgo/idem/consumer/rabbitmq"
	sqsconsumer "github.com/idemgo/idem/consumer/sqs"
)

// The brokers other than Redis Streams (consume.go): package delivery
// translates each one's messages into sidecar.Delivery and --key into its
// adapter's key function; the adapters do the rest.

// openKafka builds the member of the consumer group ?group= of the topic.
func (c *consumeConfig) openKafka(exec *idem.Executor, log *slog.Logger) (*source, error) {
	b := c.broker
	group := b.Query.Get("group")
	if group == "" {
		return nil, cli.Usagef("consume: --from %s has no group: add ?group=NAME", b.Where)
	}
	opts := append(c.options(log), consumer.WithConcurrency(c.concurrency))
	if !c.keySpec.IsDefault() {
		opts = append(opts, kafka.WithKeyFunc(c.keySpec.KafkaKey))
	}
	keyHeader := c.keySpec.HeaderOr(kafka.DefaultKeyHeader)
	kopts := []kgo.Opt{kgo.SeedBrokers(b.Brokers...), kgo.ConsumerGroup(group), kgo.ConsumeTopics(b.Target)}
	kc, err := kafka.New(kopts, exec, func(ctx context.Context, r *kgo.Record) error {
		return c.handler.Call(ctx, delivery.Kafka(keyHeader, r))
	}, opts...)
	if err != nil {
		return nil, cli.Usagef("consume: %v", err)
	}
	return &source{run: kc.Run, stats: kc.Stats, close: func() {}}, nil
}

// openAMQP builds the consumer of the queue.
func (c *consumeConfig) openAMQP(exec *idem.Executor, log *slog.Logger) (*source, error) {
	b := c.broker
	queue := b.Target
	opts := append(c.options(log), consumer.WithConcurrency(c.concurrency))
	if !c.keySpec.IsDefault() {
		opts = append(opts, rabbitmq.WithKeyFunc(c.keySpec.AMQPKey))
	}
	rc, err := rabbitmq.New(b.AMQPDial, queue, exec, func(ctx context.Context, d *amqp.Delivery) error {
		return c.handler.Call(ctx, delivery.AMQP(queue, d))
	}, opts...)
	if err != nil {
		return nil, cli.Usagef("consume: %v", err)
	}
	return &source{run: rc.Run, stats: rc.Stats, close: func() {}}, nil
}

// natsDurable connects to the NATS server of --from and returns the
// JetStream stream's durable consumer, created (explicit acks, no
// server-side maximum of deliveries, AckWait of --lease) if it does not
// exist. The caller closes nc.
func (c *consumeConfig) natsDurable(ctx context.Context, durable string) (*nats.Conn, jetstream.JetStream, jetstream.Consumer, error) {
	b := c.broker
	nc, err := nats.Connect(b.NATSServer, nats.Name("idem consume"), nats.MaxReconnects(-1))
	if err != nil {
		return nil, nil, nil, fmt.Errorf("consume: %s: %v", b.Where, err)
	}
	js, err := jetstream.New(nc)
	if err != nil {
		nc.Close()
		return nil, nil, nil, err
	}
	cctx, cancel := context.WithTimeout(ctx, connectTimeout)
	defer cancel()
	cons, err := js.Consumer(cctx, b.Target, durable)
	if errors.Is(err, jetstream.ErrConsumerNotFound) {
		cons, err = js.CreateConsumer(cctx, b.Target, jetstream.ConsumerConfig{
			Durable: durable, AckPolicy: jetstream.AckExplicitPolicy, MaxDeliver: -1, AckWait: max(c.lease, time.Second),
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
func (c *consumeConfig) openNATS(ctx context.Context, exec *idem.Executor, log *slog.Logger) (*source, error) {
	b := c.broker
	durable := b.Query.Get("consumer")
	if durable == "" {
		return nil, cli.Usagef("consume: --from %s has no consumer: add ?consumer=DURABLE", b.Where)
	}
	nc, js, cons, err := c.natsDurable(ctx, durable)
	if err != nil {
		return nil, err
	}
	opts := c.options(log)
	if !c.keySpec.IsDefault() {
		opts = append(opts, natsconsumer.WithKeyFunc(c.keySpec.NATSKey))
	}
	keyHeader := c.keySpec.HeaderOr(natsconsumer.DefaultKeyHeader)
	stream := b.Target
	var ncs []*natsconsumer.Consumer
	for range c.concurrency {
		n, err := natsconsumer.New(js, cons, exec, func(ctx context.Context, m jetstream.Msg) error {
			return c.handler.Call(ctx, delivery.NATS(stream, keyHeader, m))
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
func (c *consumeConfig) openSQS(ctx context.Context, exec *idem.Executor, log *slog.Logger) (*source, error) {
	b := c.broker
	client, err := b.SQSClient(ctx)
	if err != nil {
		return nil, fmt.Errorf("consume: %s: %v", b.Where, err)
	}
	opts := append(c.options(log), consumer.WithConcurrency(c.concurrency))
	if c.scope == "" {
		opts = append(opts, consumer.WithScope(b.QueueURL))
	}
	if !c.keySpec.IsDefault() {
		opts = append(opts, sqsconsumer.WithKeyFunc(c.keySpec.SQSKey))
	}
	keyAttr := c.keySpec.HeaderOr(sqsconsumer.DefaultKeyAttribute)
	queue := b.Target
	sc, err := sqsconsumer.New(client, b.QueueURL, c.deadLetter, exec, func(ctx context.Context, m types.Message) error {
		return c.handler.Call(ctx, delivery.SQS(queue, keyAttr, m))
	}, opts...)
	if err != nil {
		return nil, cli.Usagef("consume: %v", err)
	}
	return &source{run: sc.Run, stats: sc.Stats, close: func() {}}, nil
}
