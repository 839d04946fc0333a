package main

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/idemgo/idem/cmd/idem/internal/cli"
	"github.com/idemgo/idem/cmd/idem/internal/outboxroute"
	"github.com/idemgo/idem/cmd/idem/internal/redact"
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

// outboxRelay is a pgoutbox.Relay on the --outbox routes.
type outboxRelay struct {
	relay  *pgoutbox.Relay
	routes []outboxroute.Route
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
		r, err := outboxroute.Parse(v)
		if err != nil {
			out.close()
			return nil, cli.Usagef("relay: %v", err)
		}
		if _, dup := senders[r.Name]; dup {
			out.close()
			return nil, cli.Usagef("relay: two --outbox routes for destination %q: name one of them (--outbox NAME=URL)", r.Name)
		}
		s, closeFn, err := r.Open(ctx)
		if err != nil {
			out.close()
			return nil, fmt.Errorf("relay: --outbox %s: %v", redact.URL(r.Raw), err)
		}
		senders[r.Name] = s
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
		parts = append(parts, fmt.Sprintf("%s → %s", rt.Name, rt.Where))
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
