package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"sync"
	"time"

	"github.com/aws/aws-sdk-go-v2/service/sqs/types"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	amqp "github.com/rabbitmq/amqp091-go"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/idemgo/idem"
	"github.com/idemgo/idem/cmd/idem/internal/cli"
	"github.com/idemgo/idem/consumer"
	"github.com/idemgo/idem/consumer/kafka"
	natsconsumer "github.com/idemgo/idem/consumer/nats"
	"github.com/idemgo/idem/consumer/rabbitmq"
	"github.com/idemgo/idem/consumer/sidecar"
	sqsconsumer "github.com/idemgo/idem/consumer/sqs"
)

// The brokers other than Redis Streams (consume.go): each translates its
// messages into sidecar.Delivery and --key into its adapter's key
// function; the adapters do the rest.

// openKafka builds the member of the consumer group ?group= of the topic.
func (c *consumeConfig) openKafka(exec *idem.Executor, log *slog.Logger) (*source, error) {
	b := c.broker
	group := b.Query.Get("group")
	if group == "" {
		return nil, cli.Usagef("consume: --from %s has no group: add ?group=NAME", b.Where)
	}
	opts := append(c.options(log), consumer.WithConcurrency(c.concurrency))
	if !c.keySpec.isDefault() {
		k := c.keySpec
		opts = append(opts, kafka.WithKeyFunc(func(r *kgo.Record) string {
			return k.key(func(name string) []string { return kafkaHeader(r, name) }, r.Value, kafkaID(r))
		}))
	}
	keyHeader := kafka.DefaultKeyHeader
	if h := c.keySpec.header(); h != "" {
		keyHeader = h
	}
	kopts := []kgo.Opt{kgo.SeedBrokers(b.Brokers...), kgo.ConsumerGroup(group), kgo.ConsumeTopics(b.Target)}
	kc, err := kafka.New(kopts, exec, func(ctx context.Context, r *kgo.Record) error {
		h := deliveryHeader("kafka", r.Topic)
		h.Set(sidecar.HeaderPartition, strconv.Itoa(int(r.Partition)))
		h.Set(sidecar.HeaderOffset, strconv.FormatInt(r.Offset, 10))
		h.Set(sidecar.HeaderMessageID, kafkaID(r))
		for _, rh := range r.Headers {
			if rh.Key != keyHeader {
				addMessageHeader(h, rh.Key, string(rh.Value))
			}
		}
		return c.handler.Call(ctx, sidecar.Delivery{Body: r.Value, Header: h})
	}, opts...)
	if err != nil {
		return nil, cli.Usagef("consume: %v", err)
	}
	return &source{run: kc.Run, stats: kc.Stats, close: func() {}}, nil
}

// kafkaID is a record's partition and offset: the same on every
// redelivery of the record, another for another send of the same message.
func kafkaID(r *kgo.Record) string {
	return strconv.Itoa(int(r.Partition)) + "-" + strconv.FormatInt(r.Offset, 10)
}

func kafkaHeader(r *kgo.Record, name string) []string {
	var out []string
	for _, h := range r.Headers {
		if h.Key == name {
			out = append(out, string(h.Value))
		}
	}
	return out
}

// openAMQP builds the consumer of the queue.
func (c *consumeConfig) openAMQP(exec *idem.Executor, log *slog.Logger) (*source, error) {
	b := c.broker
	queue := b.Target
	opts := append(c.options(log), consumer.WithConcurrency(c.concurrency))
	if !c.keySpec.isDefault() {
		k := c.keySpec
		opts = append(opts, rabbitmq.WithKeyFunc(func(d *amqp.Delivery) string {
			return k.key(func(name string) []string { return amqpHeader(d, name) }, d.Body, d.MessageId)
		}))
	}
	rc, err := rabbitmq.New(b.AMQPDial, queue, exec, func(ctx context.Context, d *amqp.Delivery) error {
		h := deliveryHeader("amqp", queue)
		if d.MessageId != "" {
			h.Set(sidecar.HeaderMessageID, d.MessageId)
		}
		if d.ContentType != "" {
			h.Set("Content-Type", d.ContentType)
		}
		for name := range d.Headers {
			if vs := amqpHeader(d, name); len(vs) == 1 {
				addMessageHeader(h, name, vs[0])
			}
		}
		return c.handler.Call(ctx, sidecar.Delivery{Body: d.Body, Header: h})
	}, opts...)
	if err != nil {
		return nil, cli.Usagef("consume: %v", err)
	}
	return &source{run: rc.Run, stats: rc.Stats, close: func() {}}, nil
}

func amqpHeader(d *amqp.Delivery, name string) []string {
	switch v := d.Headers[name].(type) {
	case string:
		return []string{v}
	case []byte:
		return []string{string(v)}
	case int, int8, int16, int32, int64, uint8, uint16, uint32, uint64:
		return []string{fmt.Sprint(v)}
	}
	return nil
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
	if !c.keySpec.isDefault() {
		k := c.keySpec
		opts = append(opts, natsconsumer.WithKeyFunc(func(m jetstream.Msg) string {
			return k.key(func(name string) []string { return m.Headers().Values(name) }, m.Data(), natsID(m))
		}))
	}
	keyHeader := natsconsumer.DefaultKeyHeader
	if h := c.keySpec.header(); h != "" {
		keyHeader = h
	}
	stream := b.Target
	var ncs []*natsconsumer.Consumer
	for range c.concurrency {
		n, err := natsconsumer.New(js, cons, exec, func(ctx context.Context, m jetstream.Msg) error {
			h := deliveryHeader("nats", stream)
			h.Set(sidecar.HeaderMessageID, natsID(m))
			h.Set("Idem-Subject", m.Subject())
			for name, vs := range m.Headers() {
				if name != keyHeader {
					for _, v := range vs {
						addMessageHeader(h, name, v)
					}
				}
			}
			return c.handler.Call(ctx, sidecar.Delivery{Body: m.Data(), Header: h})
		}, opts...)
		if err != nil {
			nc.Close()
			return nil, cli.Usagef("consume: %v", err)
		}
		ncs = append(ncs, n)
	}
	return &source{
		run: func(ctx context.Context) error {
			errs := make([]error, len(ncs))
			var wg sync.WaitGroup
			for i, n := range ncs {
				wg.Go(func() {
					if err := n.Run(ctx); !errors.Is(err, natsconsumer.ErrStopped) {
						errs[i] = err
					}
				})
			}
			wg.Wait()
			return errors.Join(errs...)
		},
		stats: func() consumer.Stats {
			var s consumer.Stats
			for _, n := range ncs {
				s = addStats(s, n.Stats())
			}
			return s
		},
		close: nc.Close,
	}, nil
}

// natsID is a message's sequence in its stream: the same on every
// redelivery.
func natsID(m jetstream.Msg) string {
	md, err := m.Metadata()
	if err != nil {
		return ""
	}
	return strconv.FormatUint(md.Sequence.Stream, 10)
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
	if !c.keySpec.isDefault() {
		k := c.keySpec
		opts = append(opts, sqsconsumer.WithKeyFunc(func(m types.Message) string {
			return k.key(func(name string) []string { return sqsAttribute(m, name) }, []byte(deref(m.Body)), deref(m.MessageId))
		}))
	}
	keyAttr := sqsconsumer.DefaultKeyAttribute
	if h := c.keySpec.header(); h != "" {
		keyAttr = h
	}
	queue := b.Target
	sc, err := sqsconsumer.New(client, b.QueueURL, c.deadLetter, exec, func(ctx context.Context, m types.Message) error {
		h := deliveryHeader("sqs", queue)
		h.Set(sidecar.HeaderMessageID, deref(m.MessageId))
		for name := range m.MessageAttributes {
			if vs := sqsAttribute(m, name); len(vs) == 1 && name != keyAttr {
				addMessageHeader(h, name, vs[0])
			}
		}
		return c.handler.Call(ctx, sidecar.Delivery{Body: []byte(deref(m.Body)), Header: h})
	}, opts...)
	if err != nil {
		return nil, cli.Usagef("consume: %v", err)
	}
	return &source{run: sc.Run, stats: sc.Stats, close: func() {}}, nil
}

func sqsAttribute(m types.Message, name string) []string {
	if a, ok := m.MessageAttributes[name]; ok && a.StringValue != nil {
		return []string{*a.StringValue}
	}
	return nil
}

func deref(s *string) string {
	if s == nil {
		return ""
	}
	return *s
}
