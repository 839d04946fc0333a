// Package outboxroute parses the routes of `idem relay --outbox`
// ([NAME=]URL, the URL a broker URL of package brokerurl) into the
// destination and the opener of its pgoutbox.Sender.
package outboxroute

import (
	"context"
	"fmt"
	"strings"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/redis/go-redis/v9"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/idemgo/idem/cmd/idem/internal/brokerurl"
	"github.com/idemgo/idem/cmd/idem/internal/cli"
	"github.com/idemgo/idem/cmd/idem/internal/redact"
	"github.com/idemgo/idem/consumer/kafka"
	natsconsumer "github.com/idemgo/idem/consumer/nats"
	"github.com/idemgo/idem/consumer/rabbitmq"
	"github.com/idemgo/idem/consumer/redisstream"
	sqsconsumer "github.com/idemgo/idem/consumer/sqs"
	"github.com/idemgo/idem/postgres/pgoutbox"
)

// Route is one --outbox value.
type Route struct {
	Name string // the destination
	Raw  string // the URL as given
	// Open opens the route's sender, and returns the function that
	// closes it.
	Open  func(context.Context) (pgoutbox.Sender, func(), error)
	Where string // the broker and destination, without secrets
}

// Parse parses an --outbox value: [NAME=]URL (brokerurl.Parse). The
// destination is NAME, by default the stream, topic, queue or subject of
// the URL.
func Parse(v string) (Route, error) {
	name, raw := "", v
	if i, j := strings.IndexByte(v, '='), strings.Index(v, "://"); i > 0 && (j < 0 || i < j) {
		name, raw = v[:i], v[i+1:]
	}
	b, err := brokerurl.Parse("--outbox", raw)
	if err != nil {
		return Route{}, err
	}
	r := Route{Raw: raw, Name: b.Target, Where: b.Where}
	if err := senders[b.Kind](&r, b); err != nil {
		return Route{}, err
	}
	if name != "" {
		r.Name = name
	}
	return r, nil
}

// senders set the opener of a route's sender, by broker kind
// (brokerurl.URL.Kind).
var senders = map[string]func(r *Route, b *brokerurl.URL) error{
	"redis-stream": redisStreamSender,
	"kafka":        kafkaSender,
	"amqp":         amqpSender,
	"nats":         natsSender,
	"sqs":          sqsSender,
}

func redisStreamSender(r *Route, b *brokerurl.URL) error {
	opts, target := b.Redis, b.Target
	r.Open = func(context.Context) (pgoutbox.Sender, func(), error) {
		rdb := redis.NewClient(opts)
		s, err := redisstream.NewSender(rdb, target)
		if err != nil {
			rdb.Close()
			return nil, nil, err
		}
		return s, func() { rdb.Close() }, nil
	}
	return nil
}

func kafkaSender(r *Route, b *brokerurl.URL) error {
	brokers, target := b.Brokers, b.Target
	r.Open = func(context.Context) (pgoutbox.Sender, func(), error) {
		cl, err := kgo.NewClient(kgo.SeedBrokers(brokers...))
		if err != nil {
			return nil, nil, err
		}
		s, err := kafka.NewSender(cl, target)
		if err != nil {
			cl.Close()
			return nil, nil, err
		}
		return s, cl.Close, nil
	}
	return nil
}

func amqpSender(r *Route, b *brokerurl.URL) error {
	dial, exchange, key := b.AMQPDial, b.Exchange, b.RoutingKey
	if _, err := rabbitmq.NewSender(dial, exchange, key); err != nil {
		return fmt.Errorf("--outbox %s: %v", redact.URL(r.Raw), cli.Cause(err))
	}
	r.Open = func(context.Context) (pgoutbox.Sender, func(), error) {
		s, err := rabbitmq.NewSender(dial, exchange, key)
		if err != nil {
			return nil, nil, err
		}
		return s, func() { s.Close() }, nil
	}
	return nil
}

func natsSender(r *Route, b *brokerurl.URL) error {
	server, target := b.NATSServer, b.Target
	r.Where = fmt.Sprintf("NATS subject %s at %s", target, redact.URL(server))
	r.Open = func(context.Context) (pgoutbox.Sender, func(), error) {
		nc, err := nats.Connect(server, nats.Name("idem outbox relay"), nats.MaxReconnects(-1))
		if err != nil {
			return nil, nil, err
		}
		js, err := jetstream.New(nc)
		if err == nil {
			var s *natsconsumer.Sender
			if s, err = natsconsumer.NewSender(js, target); err == nil {
				return s, nc.Close, nil
			}
		}
		nc.Close()
		return nil, nil, err
	}
	return nil
}

func sqsSender(r *Route, b *brokerurl.URL) error {
	r.Open = func(ctx context.Context) (pgoutbox.Sender, func(), error) {
		client, err := b.SQSClient(ctx)
		if err != nil {
			return nil, nil, err
		}
		s, err := sqsconsumer.NewSender(client, b.QueueURL)
		return s, func() {}, err
	}
	return nil
}
