package main

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/idemgo/idem"
	"github.com/idemgo/idem/cmd/idem/internal/cli"
	"github.com/idemgo/idem/cmd/idem/internal/redact"
	"github.com/idemgo/idem/postgres/pggate"
	"github.com/jackc/pgx/v5/pgxpool"
)

// openPool opens and pings the --postgres database.
func (s *storeFlags) openPool(ctx context.Context) (*pgxpool.Pool, string, error) {
	return openPool(ctx, "--postgres", s.postgres)
}

// openPool opens and pings the database at raw, the value of flag.
func openPool(ctx context.Context, flag, raw string) (*pgxpool.Pool, string, error) {
	cfg, err := pgxpool.ParseConfig(raw)
	if err != nil {
		return nil, "", urlFlagError(flag, raw, err, "postgres")
	}
	describe := fmt.Sprintf("postgres %s:%d/%s", cfg.ConnConfig.Host, cfg.ConnConfig.Port, cfg.ConnConfig.Database)
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return nil, "", fmt.Errorf("%s: %s", describe, redact.Scrub(err.Error(), raw))
	}
	pctx, cancel := context.WithTimeout(ctx, connectTimeout)
	defer cancel()
	if err := pool.Ping(pctx); err != nil {
		pool.Close()
		return nil, "", fmt.Errorf("%s is not reachable: %s", describe, redact.Scrub(err.Error(), raw))
	}
	return pool, describe, nil
}

func relayCommand() *command {
	return &command{
		name:    "relay",
		args:    "--postgres URL (--redis URL | --outbox [NAME=]URL...) [flags]",
		summary: "copy the commit gate's completions that Redis did not get into Redis; send the outbox",
		doc: `
The commit gate (package pggate) writes each completion in the caller's
Postgres transaction, then into Redis. When the second write fails or the
process dies first, the completion row stays unrelayed; every Gate relays
such rows in the background, and this command does the same for operators:
it copies every unrelayed completion older than --delay into Redis (a
record that is not COMPLETED becomes COMPLETED with the committed result; a
COMPLETED one is left as it is), marks it relayed, and deletes the rows past
their retention. It runs until interrupted, or once with --once, and prints
what it did.` + outboxHelp,
		flags: func(fs *cli.Set) func(context.Context, *env, []string) error {
			r := &relayFlags{store: storeFlags{hybrid: true}}
			fs.Define(r.store.flags()...)
			fs.Bool(&r.once, "once", false, "relay and sweep once, then exit")
			fs.Duration(&r.interval, "interval", pggate.DefaultRelayInterval, "time between two passes")
			fs.Duration(&r.delay, "delay", 0, "relay only completions older than this")
			r.outbox.register(fs)
			return r.run
		},
	}
}

// relayFlags are relay's flags.
type relayFlags struct {
	store           storeFlags
	once            bool
	interval, delay time.Duration
	outbox          outboxFlags
}

func (r *relayFlags) run(ctx context.Context, e *env, args []string) (err error) {
	s := &r.store
	outbox := len(r.outbox.routes) > 0
	err = cli.FirstError(
		cli.Check(len(args) > 0, "relay: unexpected argument %q", strings.Join(args, " ")),
		cli.Check(s.postgres == "" || !(s.redis() || outbox), "relay needs --postgres (the gate's database) and --redis, --redis-cluster or --redis-sentinel, or --outbox"),
		cli.Check(r.interval <= 0 || r.delay < 0, "relay: --interval must be positive and --delay not negative"),
		s.validate())
	if err != nil {
		return err
	}
	pool, describe, err := s.openPool(ctx)
	if err != nil {
		return err
	}
	defer pool.Close()
	if outbox {
		finish, err := r.outbox.start(ctx, e, pool, describe, r.once)
		if err != nil {
			return err
		}
		if !s.redis() {
			if !r.once {
				<-ctx.Done()
			}
			return finish()
		}
		defer func() { err = errors.Join(err, finish()) }()
	}
	return r.relayGate(ctx, e, pool, describe)
}

// relayGate relays the completions of the gate's database (pool, described
// by describe) to the Redis store of the flags: once with --once, or else
// every --interval until ctx ends.
func (r *relayFlags) relayGate(ctx context.Context, e *env, pool *pgxpool.Pool, describe string) error {
	rs, err := r.store.open(ctx, false) // Redis: --postgres is the gate's database here
	if err != nil {
		return err
	}
	defer rs.Close()
	exec, err := idem.New(rs.Store)
	if err != nil {
		return err
	}
	g, err := pggate.New(exec, pool, pggate.WithRelayInterval(0), pggate.WithSweepInterval(0), pggate.WithRelayDelay(r.delay))
	if err != nil {
		return err
	}
	defer g.Close()
	pass := func() error {
		n, rerr := g.Relay(ctx)
		d, serr := g.Sweep(ctx)
		if n > 0 || d > 0 || r.once {
			fmt.Fprintf(e.stdout, "%s relayed %d completions from %s to %s, deleted %d expired rows\n",
				time.Now().UTC().Format(time.RFC3339), n, describe, rs.Describe, d)
		}
		return errors.Join(rerr, serr)
	}
	if r.once {
		return pass()
	}
	return r.loop(ctx, e, pass)
}

// loop runs pass every interval until ctx is done, printing its errors.
func (r *relayFlags) loop(ctx context.Context, e *env, pass func() error) error {
	t := time.NewTicker(r.interval)
	defer t.Stop()
	for {
		if err := pass(); err != nil && ctx.Err() == nil {
			fmt.Fprintf(e.stderr, "idem: relay: %s\n", oneLine(e.hider.Hide(err.Error())))
		}
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		}
	}
}
