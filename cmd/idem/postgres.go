package main

import (
	"context"
	"fmt"
	"time"

	"github.com/idemgo/idem"
	"github.com/idemgo/idem/postgres/pggate"
	"github.com/idemgo/idem/postgres/pgstore"
	"github.com/jackc/pgx/v5/pgxpool"
)

// openPool opens and pings the --postgres database.
func (s *storeFlags) openPool(ctx context.Context) (*pgxpool.Pool, string, error) {
	cfg, err := pgxpool.ParseConfig(s.postgres)
	if err != nil {
		return nil, "", urlFlagError("--postgres", s.postgres, err, "postgres")
	}
	describe := fmt.Sprintf("postgres %s:%d/%s", cfg.ConnConfig.Host, cfg.ConnConfig.Port, cfg.ConnConfig.Database)
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return nil, "", fmt.Errorf("%s: %s", describe, scrub(err.Error(), s.postgres))
	}
	pctx, cancel := context.WithTimeout(ctx, connectTimeout)
	defer cancel()
	if err := pool.Ping(pctx); err != nil {
		pool.Close()
		return nil, "", fmt.Errorf("%s is not reachable: %s", describe, scrub(err.Error(), s.postgres))
	}
	return pool, describe, nil
}

// openPostgres opens pgstore on --postgres. The proxy (create) creates or
// updates its table and functions; admin commands need them to exist.
func (s *storeFlags) openPostgres(ctx context.Context, create bool) (*openedStore, error) {
	pool, describe, err := s.openPool(ctx)
	if err != nil {
		return nil, err
	}
	st, err := pgstore.New(pool)
	if err != nil {
		pool.Close()
		return nil, err
	}
	if create {
		if err := st.Migrate(ctx); err != nil {
			st.Close()
			pool.Close()
			return nil, fmt.Errorf("%s: %v", describe, err)
		}
	}
	return &openedStore{
		store:    st,
		describe: describe,
		list: func(ctx context.Context, limit int) ([]listEntry, error) {
			es, err := st.List(ctx, limit)
			out := make([]listEntry, len(es))
			for i, e := range es {
				out[i] = listEntry{key: e.Key, record: e.Record}
			}
			return out, err
		},
		close: func() error {
			st.Close()
			pool.Close()
			return nil
		},
	}, nil
}

func relayCommand() *command {
	return &command{
		name:    "relay",
		args:    "--postgres URL --redis URL [flags]",
		summary: "copy the commit gate's completions that Redis did not get into Redis",
		doc: `
The commit gate (package pggate) writes each completion in the caller's
Postgres transaction, then into Redis. When the second write fails or the
process dies first, the completion row stays unrelayed; every Gate relays
such rows in the background, and this command does the same for operators:
it copies every unrelayed completion older than --delay into Redis (a
record that is not COMPLETED becomes COMPLETED with the committed result; a
COMPLETED one is left as it is), marks it relayed, and deletes the rows past
their retention. It runs until interrupted, or once with --once, and prints
what it did.`,
		flags: func(fs *flagSet) func(context.Context, *env, []string) error {
			s := storeFlags{hybrid: true}
			fs.define(s.flags()...)
			var once bool
			var interval, delay time.Duration
			fs.Bool(&once, "once", false, "relay and sweep once, then exit")
			fs.Duration(&interval, "interval", pggate.DefaultRelayInterval, "time between two passes")
			fs.Duration(&delay, "delay", 0, "relay only completions older than this")
			return func(ctx context.Context, e *env, args []string) error {
				if len(args) > 0 {
					return usagef("relay: unexpected argument %q", args[0])
				}
				if s.postgres == "" || !s.redis() {
					return usagef("relay needs --postgres (the gate's database) and --redis, --redis-cluster or --redis-sentinel")
				}
				if interval <= 0 || delay < 0 {
					return usagef("relay: --interval must be positive and --delay not negative")
				}
				if err := s.validate(); err != nil {
					return err
				}
				pool, describe, err := s.openPool(ctx)
				if err != nil {
					return err
				}
				defer pool.Close()
				rs, err := s.open(ctx, false) // Redis: --postgres is the gate's database here
				if err != nil {
					return err
				}
				defer rs.close()
				exec, err := idem.New(rs.store)
				if err != nil {
					return err
				}
				g, err := pggate.New(exec, pool, pggate.WithRelayInterval(0), pggate.WithSweepInterval(0), pggate.WithRelayDelay(delay))
				if err != nil {
					return err
				}
				defer g.Close()
				pass := func() error {
					n, rerr := g.Relay(ctx)
					d, serr := g.Sweep(ctx)
					if n > 0 || d > 0 || once {
						fmt.Fprintf(e.stdout, "%s relayed %d completions from %s to %s, deleted %d expired rows\n",
							time.Now().UTC().Format(time.RFC3339), n, describe, rs.describe, d)
					}
					if rerr != nil {
						return rerr
					}
					return serr
				}
				if once {
					return pass()
				}
				t := time.NewTicker(interval)
				defer t.Stop()
				for {
					if err := pass(); err != nil && ctx.Err() == nil {
						fmt.Fprintf(e.stderr, "idem: relay: %s\n", oneLine(e.hider.hide(err.Error())))
					}
					select {
					case <-ctx.Done():
						return nil
					case <-t.C:
					}
				}
			}
		},
	}
}

// doctorPostgres checks the --postgres database: the commit gate's table,
// its indexes and rights, pgstore's table and functions if present, and
// the relay's backlog.
func doctorPostgres(ctx context.Context, r *report, s *storeFlags) {
	pool, describe, err := s.openPool(ctx)
	if err != nil {
		r.add(vFail, "postgres", "%v", err)
		return
	}
	defer pool.Close()
	var version, schema, user string
	if err := pool.QueryRow(ctx, `SELECT current_setting('server_version'), coalesce(current_schema(), ''), current_user`).Scan(&version, &schema, &user); err != nil {
		r.add(vFail, "postgres", "%s: %v", describe, err)
		return
	}
	r.add(vOK, "postgres", "%s, PostgreSQL %s, schema %q, user %q", describe, version, schema, user)
	var gate, records bool
	pool.QueryRow(ctx, `SELECT to_regclass($1) IS NOT NULL, to_regclass($2) IS NOT NULL`, pggate.Table, pgstore.Table).Scan(&gate, &records)
	if !gate && !records {
		r.add(vFail, "tables", "neither %s (the commit gate) nor %s (pgstore) exists in the search_path: run Gate.Migrate / Store.Migrate, apply pggate/schema.sql or pgstore/schema.sql, or start the proxy with --postgres once", pggate.Table, pgstore.Table)
		return
	}
	checkTable := func(table string, indexes []string, privs string) {
		var missing []string
		for _, ix := range indexes {
			var ok bool
			pool.QueryRow(ctx, `SELECT to_regclass($1) IS NOT NULL`, ix).Scan(&ok)
			if !ok {
				missing = append(missing, ix)
			}
		}
		if len(missing) > 0 {
			r.add(vFail, table+" indexes", "missing %v: apply the schema again (Migrate is idempotent)", missing)
		} else {
			r.add(vOK, table+" indexes", "%v", indexes)
		}
		var ok bool
		if err := pool.QueryRow(ctx, `SELECT has_table_privilege($1, $2)`, table, privs).Scan(&ok); err != nil || !ok {
			r.add(vFail, table+" rights", "user %q lacks one of %s on %s", user, privs, table)
		} else {
			r.add(vOK, table+" rights", "%s", privs)
		}
	}
	if gate {
		checkTable(pggate.Table, []string{"idem_completions_pkey", "idem_completions_expires_at", "idem_completions_unrelayed"}, "SELECT, INSERT, UPDATE, DELETE")
		var backlog int64
		pool.QueryRow(ctx, `SELECT count(*) FROM idem_completions WHERE NOT relayed AND created_at < now() - interval '1 minute' AND expires_at > now()`).Scan(&backlog)
		if backlog > 0 {
			r.add(vWarn, "relay backlog", "%d completions older than 1m are not relayed to the store: is a Gate or `idem relay` running?", backlog)
		} else {
			r.add(vOK, "relay backlog", "no completion older than 1m waits for the relay")
		}
	} else {
		r.add(vWarn, pggate.Table, "does not exist: the commit gate is not set up in this schema (fine if only pgstore is used without the gate)")
	}
	if records {
		checkTable(pgstore.Table, []string{"idem_records_pkey", "idem_records_expires_at"}, "SELECT, INSERT, UPDATE, DELETE")
		var fns int
		pool.QueryRow(ctx, `SELECT count(*) FROM pg_proc WHERE proname IN ('idem_acquire','idem_complete','idem_fail','idem_extend','idem_release','idem_relay','idem_now') AND has_function_privilege(oid, 'EXECUTE')`).Scan(&fns)
		if fns < 7 {
			r.add(vFail, "pgstore functions", "%d of 7 transition functions exist and are executable: apply pgstore/schema.sql (Store.Migrate)", fns)
		} else {
			r.add(vOK, "pgstore functions", "7 of 7 executable")
		}
	}
}
