package main

import (
	"context"
	"fmt"

	"github.com/idemgo/idem/cmd/idem/internal/cli"
	"github.com/idemgo/idem/cmd/idem/internal/doctor"
	"github.com/idemgo/idem/cmd/idem/internal/storeopen"
	"github.com/redis/go-redis/v9"
)

// doctorFlags are doctor's flags: the store, and the durability options
// the application will use.
type doctorFlags struct {
	store        storeFlags
	waitReplicas int
	waitAOF      bool
}

func doctorCommand() *command {
	return &command{
		name:    "doctor",
		args:    "[flags]",
		summary: "check that the store is fit for idempotency records",
		doc: `
Checks the store and prints one line per check: OK, WARN or FAIL with the
reason. Exits with status 1 if any check FAILs.

For Redis (on a Cluster, on every primary):
  version           Redis 7.0 or later, or Valkey (FAIL below: idem's scripts
                    use SET ... NX GET, SPUBLISH); 7.2 with --wait-aof (WAITAOF)
  maxmemory-policy  must be noeviction (FAIL otherwise): an evicted record lets
                    a retried request run again
  maxmemory         WARN when 0 (no limit): the kernel kills Redis instead
  persistence       OK with appendonly yes; WARN with RDB snapshots only (the
                    writes since the last snapshot are lost on a crash); FAIL
                    when both are off (a restart loses every record)
  waitaof           with --wait-aof, the check a store with WithWaitAOF
                    makes at start: under appendfsync everysec WAITAOF must
                    wait for the fsync: FAIL on Redis 7.4.0 and 7.4.1 and
                    Valkey 8.0.0 and 8.0.1, which count a write as fsynced
                    before it is; on other servers that may (Redis 7.4 and
                    later, Valkey 8 and later) a scratch key is written
                    twice, and FAIL if WAITAOF counts the second write as
                    fsynced before the next fsync could start; WARN
                    otherwise, as each acquire and complete waits up to a
                    second. WARN on Redis and Valkey 7.2, whose WAITAOF
                    answers at the next cron tick (about 100 ms), even with
                    appendfsync always
  replicas          with --wait-replicas N, FAIL when fewer than N replicas
                    are connected (every WAIT would fall short)
  lua               EVAL must run (the store's transitions are Lua scripts)
  cluster           every one of the 16384 slots assigned, cluster_state ok
  round trip        median of 10 PINGs; WARN above 5ms
  rights            every transition script runs on a scratch key of the
                    prefix, and each command they need is tried with the
                    user's ACL; a missing right is named (FAIL; WARN for
                    SUBSCRIBE, without which waiters poll)
  replay cache      with --redis or --redis-sentinel and neither --wait-replicas
                    nor --wait-aof: CLIENT SETNAME, CLIENT ID, CLIENT TRACKING
                    and SUBSCRIBE __redis__:invalidate, which the replay cache
                    needs; WARN with the ACL fix without them (the proxy then
                    reads every replay from Redis)
  info              WARN when the server refuses INFO (an ACL without +info, a
                    managed service): the checks read what CONFIG GET tells,
                    and WARN where it refuses too; the proxy starts on such a
                    server with one warning

For PostgreSQL (--postgres; with --redis too for the hybrid commit gate):
  tables            idem_completions (pggate) or idem_records (pgstore) exist
                    in the search_path (FAIL when neither does)
  indexes, rights   each table's indexes, and SELECT, INSERT, UPDATE, DELETE
  relay backlog     WARN when completions older than 1m are not relayed
  abandoned multi-step requests
                    WARN when requests of Gate.Run stopped mid-way over 1m ago
                    (no completer with their flow registered finished them)
  pgstore functions the 7 transition functions exist and are executable

For the embedded store: the file opens (or is in use by a running proxy).`,
		flags: func(fs *cli.Set) func(context.Context, *env, []string) error {
			var d doctorFlags
			d.store.hybrid = true
			fs.Define(d.store.flags()...)
			fs.Int(&d.waitReplicas, "wait-replicas", "N", 0, "the replicas the application waits for (redisstore.WithWait): FAIL when fewer are connected")
			fs.Bool(&d.waitAOF, "wait-aof", false, "the application waits for the AOF fsync (redisstore.WithWaitAOF): FAIL below Redis 7.2, and when WAITAOF does not wait for the fsync; WARN with appendfsync everysec")
			return func(ctx context.Context, e *env, args []string) error {
				if len(args) > 0 {
					return cli.Usagef("doctor: unexpected argument %q", args[0])
				}
				if err := d.store.validate(); err != nil {
					return err
				}
				r := &doctor.Report{W: e.stdout, Hide: e.hider.Hide}
				switch {
				case d.store.redis():
					doctorRedis(ctx, r, &d)
				case d.store.postgres == "":
					doctor.Bolt(r, d.store.dataPath())
				}
				if d.store.postgres != "" {
					doctorPostgres(ctx, r, &d.store)
				}
				fmt.Fprintf(e.stdout, "%d OK, %d WARN, %d FAIL\n", r.Count(doctor.OK), r.Count(doctor.Warn), r.Count(doctor.Fail))
				if r.Count(doctor.Fail) > 0 {
					return &exitError{code: exitRuntime}
				}
				return nil
			}
		},
	}
}

// doctorRedis connects to the Redis servers of the flags and runs the
// checks of package doctor: each server's (on a Cluster, each primary's),
// the cluster's slots, the user's rights, and the rights of the replay
// cache where the proxy keeps one.
func doctorRedis(ctx context.Context, r *doctor.Report, d *doctorFlags) {
	s := &d.store
	c, nodes, err := s.doctorClients(ctx)
	if err != nil {
		r.Add(doctor.Fail, "connect", "%v", err)
		return
	}
	defer c.Close()
	o := &doctor.Redis{Prefix: s.prefix, WaitReplicas: d.waitReplicas, WaitAOF: d.waitAOF, NotRedis: s.target.Probe().NotRedis}
	o.Run(ctx, r, c, nodes)
}

// doctorClients returns the client of the flags' Redis and the clients of
// its servers: the one server, or each primary of a Cluster.
func (s *storeFlags) doctorClients(ctx context.Context) (redis.UniversalClient, []*redis.Client, error) {
	c, _, err := s.target.Client()
	if err != nil {
		return nil, nil, err
	}
	if rc, ok := c.(*redis.Client); ok { // one server, or behind Sentinels
		return rc, []*redis.Client{rc}, nil
	}
	cc := c.(*redis.ClusterClient)
	nodes, err := doctor.Primaries(ctx, cc)
	if err != nil {
		cc.Close()
		if nr := s.target.Probe().NotRedis(ctx); nr != nil {
			err = nr
		}
		return nil, nil, fmt.Errorf("cannot reach the cluster: %v", err)
	}
	return cc, nodes, nil
}

// doctorPostgres opens the --postgres database and runs its checks.
func doctorPostgres(ctx context.Context, r *doctor.Report, s *storeFlags) {
	pool, describe, err := storeopen.Pool(ctx, "--postgres", s.postgres)
	if err != nil {
		r.Add(doctor.Fail, "postgres", "%v", err)
		return
	}
	defer pool.Close()
	doctor.Postgres(ctx, r, pool, describe)
}
