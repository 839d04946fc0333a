package main

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/idemgo/idem/cmd/idem/internal/cli"
	"github.com/idemgo/idem/cmd/idem/internal/relaying"
	"github.com/idemgo/idem/cmd/idem/internal/storeopen"
	"github.com/idemgo/idem/postgres/pggate"
	"github.com/jackc/pgx/v5/pgxpool"
)

func relayCommand() *command {
	return &command{
		name:    "relay",
		args:    "--postgres URL (--redis URL | --outbox [NAME=]URL...) [flags]",
		summary: "copy the commit gate's completions that Redis did not get into Redis; send the outbox",
		doc: `
The commit gate (package pggate) writes each completion in the caller's
Postgres transaction, then into Redis. When the second write fails or the
process dies first, Redis lacks it until the relay copies it; every Gate
relays in the background, and this command does the same for operators:
it copies every completion written since the relay's cursor and older
than --delay into Redis (a record that is not COMPLETED becomes COMPLETED
with the committed result; a COMPLETED one is left as it is), moves the
cursor past it, and deletes the rows past their retention. It runs until interrupted, or once with --once, and prints
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
	pool, describe, err := storeopen.Pool(ctx, "--postgres", s.postgres)
	if err != nil {
		return err
	}
	defer pool.Close()
	if outbox {
		ob, err := r.outbox.open(ctx, pool, describe)
		if err != nil {
			return err
		}
		defer ob.Close()
		finish := r.loop(e, r.outbox.interval, "outbox: ").Start(ctx, ob)
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
// by describe) to the Redis store of the flags (--postgres is the gate's
// database here).
func (r *relayFlags) relayGate(ctx context.Context, e *env, pool *pgxpool.Pool, describe string) error {
	rs, err := r.store.open(ctx, false)
	if err != nil {
		return err
	}
	defer rs.Close()
	g, err := relaying.OpenGate(rs.Store, pool, r.delay, describe, rs.Describe)
	if err != nil {
		return err
	}
	defer g.Close()
	return r.loop(e, r.interval, "").Run(ctx, g)
}

// loop is how relay runs a pass: once with --once, or else every interval,
// printing its errors after "idem: relay: " and what.
func (r *relayFlags) loop(e *env, interval time.Duration, what string) relaying.Loop {
	return relaying.Loop{Once: r.once, Interval: interval, Out: e.stdout, Report: func(err error) {
		fmt.Fprintf(e.stderr, "idem: relay: %s%s\n", what, oneLine(e.hider.Hide(err.Error())))
	}}
}
