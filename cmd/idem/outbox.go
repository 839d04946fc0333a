package main

import (
	"context"
	"strings"
	"time"

	"github.com/idemgo/idem/cmd/idem/internal/cli"
	"github.com/idemgo/idem/cmd/idem/internal/relaying"
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

// open opens the relay of the outbox on pool (db describes it) to the
// --outbox routes.
func (o *outboxFlags) open(ctx context.Context, pool *pgxpool.Pool, db string) (*relaying.Outbox, error) {
	if o.interval <= 0 || o.retention <= 0 {
		return nil, cli.Usagef("relay: --outbox-interval and --outbox-retention must be positive")
	}
	return relaying.OpenOutbox(ctx, pool, db, o.routes, pgoutbox.WithInterval(o.interval), pgoutbox.WithRetention(o.retention))
}
