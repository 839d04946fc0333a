package main

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

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
	"github.com/jackc/pgx/v5/pgxpool"
)

// outboxHelp is the part of `idem help relay` about --outbox.
const outboxHelp = `

With --outbox, relay also sends the transactional outbox (package pgoutbox:
messages that pgoutbox.Publish wrote in the callers' transactions) to the
brokers: each unsent row whose destination names a route goes to that
route's broker with its idempotency key (where that broker's idem consumer
reads it), is marked sent once the broker confirmed it, and sent rows are
deleted after --outbox-retention. Several relays share the work; the rows of
one destination and key are sent in order, one at a time. --redis is then
optional (without it, only the outbox is relayed).

--outbox [NAME=]URL, repeated (or separated by spaces), routes the rows
published to destination NAME (by default the stream, topic, queue or
subject the URL names) to:

  redis-stream://[:PASSWORD@]HOST:PORT/STREAM[?db=N]  (rediss-stream:// for TLS)
  kafka://HOST:PORT[,HOST:PORT...]/TOPIC
  amqp://USER:PASSWORD@HOST:PORT/[VHOST/]QUEUE        (amqps:// for TLS)
  amqp://USER:PASSWORD@HOST:PORT/[VHOST/]EXCHANGE?routing-key=KEY
  nats://[USER:PASSWORD@]HOST:PORT/SUBJECT            (a JetStream stream must capture it)
  sqs://HOST/ACCOUNT/QUEUE[?region=R][&insecure=true] (the queue URL https://HOST/ACCOUNT/QUEUE;
                                                       credentials from the AWS SDK's default chain)`

// urlList is a flag that takes URLs, repeated or separated by spaces.
type urlList []string

func (l *urlList) String() string { return strings.Join(*l, " ") }

// Set implements flag.Value.
func (l *urlList) Set(v string) error {
	*l = append(*l, strings.Fields(v)...)
	return nil
}

// Values returns the URLs, for the hider of the secrets.
func (l *urlList) Values() []string { return *l }

// outboxFlags are relay's flags for the outbox.
type outboxFlags struct {
	routes    urlList
	interval  time.Duration
	retention time.Duration
}

func (o *outboxFlags) register(fs *cli.Set) {
	fs.Define(cli.Def{Name: "outbox", Placeholder: "[NAME=]URL", Value: &o.routes, Secret: cli.URLSecret,
		Usage: "send the outbox rows of destination NAME to the broker at URL (repeatable; see above)"})
	fs.Duration(&o.interval, "outbox-interval", pgoutbox.DefaultInterval, "time between two passes over the outbox when none is left")
	fs.Duration(&o.retention, "outbox-retention", pgoutbox.DefaultRetention, "how long sent outbox rows are kept")
}

// outboxRoute is one --outbox value.
type outboxRoute struct {
	name  string // the destination
	raw   string // the URL as given
	open  func(context.Context) (pgoutbox.Sender, func(), error)
	where string // the broker and destination, without secrets
}

// parseOutbox parses an --outbox value: [NAME=]URL (brokerurl.Parse).
func parseOutbox(v string) (outboxRoute, error) {
	name, raw := "", v
	if i, j := strings.IndexByte(v, '='), strings.Index(v, "://"); i > 0 && (j < 0 || i < j) {
		name, raw = v[:i], v[i+1:]
	}
	b, err := brokerurl.Parse("--outbox", raw)
	if err != nil {
		return outboxRoute{}, err
	}
	r := outboxRoute{raw: raw, name: b.Target, where: b.Where}
	if err := outboxSenders[b.Kind](&r, b); err != nil {
		return outboxRoute{}, err
	}
	if name != "" {
		r.name = name
	}
	return r, nil
}

// outboxSenders set the opener of a route's sender, by broker kind
// (brokerurl.URL.Kind).
var outboxSenders = map[string]func(r *outboxRoute, b *brokerurl.URL) error{
	"redis-stream": outboxRedisStream,
	"kafka":        outboxKafka,
	"amqp":         outboxAMQP,
	"nats":         outboxNATS,
	"sqs":          outboxSQS,
}

func outboxRedisStream(r *outboxRoute, b *brokerurl.URL) error {
	opts, target := b.Redis, b.Target
	r.open = func(context.Context) (pgoutbox.Sender, func(), error) {
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

func outboxKafka(r *outboxRoute, b *brokerurl.URL) error {
	brokers, target := b.Brokers, b.Target
	r.open = func(context.Context) (pgoutbox.Sender, func(), error) {
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

func outboxAMQP(r *outboxRoute, b *brokerurl.URL) error {
	dial, exchange, key := b.AMQPDial, b.Exchange, b.RoutingKey
	if _, err := rabbitmq.NewSender(dial, exchange, key); err != nil {
		return fmt.Errorf("--outbox %s: %v", redact.URL(r.raw), cli.Cause(err))
	}
	r.open = func(context.Context) (pgoutbox.Sender, func(), error) {
		s, err := rabbitmq.NewSender(dial, exchange, key)
		if err != nil {
			return nil, nil, err
		}
		return s, func() { s.Close() }, nil
	}
	return nil
}

func outboxNATS(r *outboxRoute, b *brokerurl.URL) error {
	server, target := b.NATSServer, b.Target
	r.where = fmt.Sprintf("NATS subject %s at %s", target, redact.URL(server))
	r.open = func(context.Context) (pgoutbox.Sender, func(), error) {
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

func outboxSQS(r *outboxRoute, b *brokerurl.URL) error {
	r.open = func(ctx context.Context) (pgoutbox.Sender, func(), error) {
		client, err := b.SQSClient(ctx)
		if err != nil {
			return nil, nil, err
		}
		s, err := sqsconsumer.NewSender(client, b.QueueURL)
		return s, func() {}, err
	}
	return nil
}

// outboxRelay is a pgoutbox.Relay on the --outbox routes.
type outboxRelay struct {
	relay  *pgoutbox.Relay
	routes []outboxRoute
	closes []func()
}

// start opens the --outbox routes' senders and runs the relay on pool: one
// pass with once, whose error finish returns, or else passes every
// --outbox-interval until finish is called or ctx ends. finish closes the
// senders.
func (o *outboxFlags) start(ctx context.Context, e *env, pool *pgxpool.Pool, db string, once bool) (finish func() error, err error) {
	r, err := o.open(ctx, pool)
	if err != nil {
		return nil, err
	}
	if once {
		err := r.pass(ctx, e, db, true)
		return func() error { r.close(); return err }, nil
	}
	rctx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() { defer close(done); r.run(rctx, e, db, o.interval) }()
	return func() error { cancel(); <-done; r.close(); return nil }, nil
}

// open parses the --outbox routes and opens their senders.
func (o *outboxFlags) open(ctx context.Context, pool *pgxpool.Pool) (*outboxRelay, error) {
	if o.interval <= 0 || o.retention <= 0 {
		return nil, cli.Usagef("relay: --outbox-interval and --outbox-retention must be positive")
	}
	out := &outboxRelay{}
	senders := make(map[string]pgoutbox.Sender)
	for _, v := range o.routes {
		r, err := parseOutbox(v)
		if err != nil {
			out.close()
			return nil, cli.Usagef("relay: %v", err)
		}
		if _, dup := senders[r.name]; dup {
			out.close()
			return nil, cli.Usagef("relay: two --outbox routes for destination %q: name one of them (--outbox NAME=URL)", r.name)
		}
		s, closeFn, err := r.open(ctx)
		if err != nil {
			out.close()
			return nil, fmt.Errorf("relay: --outbox %s: %v", redact.URL(r.raw), err)
		}
		senders[r.name] = s
		out.routes = append(out.routes, r)
		out.closes = append(out.closes, closeFn)
	}
	relay, err := pgoutbox.New(pool, senders, pgoutbox.WithInterval(o.interval), pgoutbox.WithRetention(o.retention))
	if err != nil {
		out.close()
		return nil, err
	}
	out.relay = relay
	return out, nil
}

func (r *outboxRelay) close() {
	for _, c := range r.closes {
		c()
	}
}

// describe names the routes, for relay's lines.
func (r *outboxRelay) describe() string {
	var parts []string
	for _, rt := range r.routes {
		parts = append(parts, fmt.Sprintf("%s → %s", rt.name, rt.where))
	}
	return strings.Join(parts, ", ")
}

// pass sends what is due and deletes the sent rows past the retention,
// and prints what it did.
func (r *outboxRelay) pass(ctx context.Context, e *env, db string, once bool) error {
	n, serr := r.relay.Send(ctx)
	d, derr := r.relay.Sweep(ctx)
	if n > 0 || d > 0 || once {
		fmt.Fprintf(e.stdout, "%s sent %d outbox messages from %s (%s), deleted %d sent rows\n",
			time.Now().UTC().Format(time.RFC3339), n, db, r.describe(), d)
	}
	return errors.Join(serr, derr)
}

// run passes every interval until ctx ends, printing errors.
func (r *outboxRelay) run(ctx context.Context, e *env, db string, interval time.Duration) {
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		if err := r.pass(ctx, e, db, false); err != nil && ctx.Err() == nil {
			fmt.Fprintf(e.stderr, "idem: relay: outbox: %s\n", oneLine(e.hider.Hide(err.Error())))
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}
