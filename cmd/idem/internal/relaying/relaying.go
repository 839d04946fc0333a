// Package relaying runs the passes of `idem relay`: the commit gate's
// completions copied into the store (pggate.Gate's Relay and Sweep) and
// the transactional outbox sent to the brokers of its --outbox routes
// (pgoutbox.Relay's Send and Sweep, on the routes of package
// outboxroute), once (--once) or every interval until the command is
// interrupted. The flags are main's; this package takes their values.
//
// The libraries run such loops themselves (a Gate's background relay,
// pgoutbox.Relay.Run) and log through slog; relay instead prints a line for
// each pass that moved or deleted rows, and each failed pass's error, so it
// drives the passes here.
package relaying

import (
	"context"
	"errors"
	"fmt"
	"io"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemgo/idem"
	"github.com/idemgo/idem/cmd/idem/internal/cli"
	"github.com/idemgo/idem/cmd/idem/internal/outboxroute"
	"github.com/idemgo/idem/cmd/idem/internal/redact"
	"github.com/idemgo/idem/postgres/pggate"
	"github.com/idemgo/idem/postgres/pgoutbox"
)

// A Passer does one pass: it relays what is due and deletes the rows past
// their retention, and prints a line to w when it did either, or always.
type Passer interface {
	Pass(ctx context.Context, w io.Writer, always bool) error
}

// Loop is how a Passer runs.
type Loop struct {
	Once     bool          // one pass, whose line is always printed
	Interval time.Duration // otherwise the time between two passes
	Out      io.Writer     // the passes' lines
	Report   func(error)   // the error of a failed pass of a loop
}

// Run runs p: one pass with Once, whose error it returns; otherwise a pass
// every Interval until ctx is done, each error to Report, then nil.
func (l Loop) Run(ctx context.Context, p Passer) error {
	if l.Once {
		return p.Pass(ctx, l.Out, true)
	}
	t := time.NewTicker(l.Interval)
	defer t.Stop()
	for {
		if err := p.Pass(ctx, l.Out, false); err != nil && ctx.Err() == nil {
			l.Report(err)
		}
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		}
	}
}

// Start runs p as Run does, in the background unless Once (the pass then
// runs before Start returns). finish stops the loop, waits for it and
// returns Run's error.
func (l Loop) Start(ctx context.Context, p Passer) (finish func() error) {
	if l.Once {
		err := l.Run(ctx, p)
		return func() error { return err }
	}
	ctx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- l.Run(ctx, p) }()
	return func() error { cancel(); return <-done }
}

// Gate is a commit gate's database whose completions a pass copies into a
// store.
type Gate struct {
	gate     *pggate.Gate[pgx.Tx]
	from, to string
}

// OpenGate returns the Gate of the completion table on pool (from
// describes it) into store (to describes it), relaying only the
// completions older than delay. It has no background relay or janitor: its
// passes do their work.
func OpenGate(store idem.Store, pool *pgxpool.Pool, delay time.Duration, from, to string) (*Gate, error) {
	exec, err := idem.New(store)
	if err != nil {
		return nil, err
	}
	g, err := pggate.New(exec, pool, pggate.WithRelayInterval(0), pggate.WithSweepInterval(0), pggate.WithRelayDelay(delay))
	if err != nil {
		return nil, err
	}
	return &Gate{gate: g, from: from, to: to}, nil
}

// Pass implements Passer.
func (g *Gate) Pass(ctx context.Context, w io.Writer, always bool) error {
	n, rerr := g.gate.Relay(ctx)
	d, serr := g.gate.Sweep(ctx)
	if n > 0 || d > 0 || always {
		fmt.Fprintf(w, "%s relayed %d completions from %s to %s, deleted %d expired rows\n",
			time.Now().UTC().Format(time.RFC3339), n, g.from, g.to, d)
	}
	return errors.Join(rerr, serr)
}

// Close stops the gate.
func (g *Gate) Close() error { return g.gate.Close() }

// Outbox is a pgoutbox.Relay on the --outbox routes.
type Outbox struct {
	relay  *pgoutbox.Relay
	db     string // the database, described
	routes []outboxroute.Route
	closes []func()
}

// OpenOutbox parses the --outbox values (outboxroute.Parse), opens their
// senders, and returns the relay of the outbox on pool (db describes it)
// to them, with opts. Two routes of one destination are a usage error.
func OpenOutbox(ctx context.Context, pool *pgxpool.Pool, db string, values []string, opts ...pgoutbox.Option) (*Outbox, error) {
	o := &Outbox{db: db}
	senders := make(map[string]pgoutbox.Sender)
	for _, v := range values {
		r, err := outboxroute.Parse(v)
		if err != nil {
			o.Close()
			return nil, cli.Usagef("relay: %v", err)
		}
		if _, dup := senders[r.Name]; dup {
			o.Close()
			return nil, cli.Usagef("relay: two --outbox routes for destination %q: name one of them (--outbox NAME=URL)", r.Name)
		}
		s, closeFn, err := r.Open(ctx)
		if err != nil {
			o.Close()
			return nil, fmt.Errorf("relay: --outbox %s: %v", redact.URL(r.Raw), err)
		}
		senders[r.Name] = s
		o.routes = append(o.routes, r)
		o.closes = append(o.closes, closeFn)
	}
	relay, err := pgoutbox.New(pool, senders, opts...)
	if err != nil {
		o.Close()
		return nil, err
	}
	o.relay = relay
	return o, nil
}

// Close closes the routes' senders.
func (o *Outbox) Close() {
	for _, c := range o.closes {
		c()
	}
}

// Describe names the routes: destination → broker, without secrets.
func (o *Outbox) Describe() string {
	var parts []string
	for _, rt := range o.routes {
		parts = append(parts, fmt.Sprintf("%s → %s", rt.Name, rt.Where))
	}
	return strings.Join(parts, ", ")
}

// Pass implements Passer: it sends what is due and deletes the sent rows
// past the retention.
func (o *Outbox) Pass(ctx context.Context, w io.Writer, always bool) error {
	n, serr := o.relay.Send(ctx)
	d, derr := o.relay.Sweep(ctx)
	if n > 0 || d > 0 || always {
		fmt.Fprintf(w, "%s sent %d outbox messages from %s (%s), deleted %d sent rows\n",
			time.Now().UTC().Format(time.RFC3339), n, o.db, o.Describe(), d)
	}
	return errors.Join(serr, derr)
}
