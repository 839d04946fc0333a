package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/idemgo/idem/boltstore"
	"github.com/idemgo/idem/internal/redisinfo"
	"github.com/idemgo/idem/redisstore"
	"github.com/redis/go-redis/v9"
)

// verdict is the result of one doctor check.
type verdict uint8

const (
	vOK verdict = iota
	vWarn
	vFail
)

var verdictNames = [...]string{"OK", "WARN", "FAIL"}

// report prints one line per check and counts them.
type report struct {
	w      io.Writer
	hider  *hider // the secrets of the command line, hidden in every line
	counts [3]int
}

func (r *report) add(v verdict, check, format string, args ...any) {
	r.counts[v]++
	fmt.Fprintf(r.w, "%-4s  %s: %s\n", verdictNames[v], check, r.hider.hide(fmt.Sprintf(format, args...)))
}

// doctorFlags are doctor's flags: the store, and the durability options
// the application will use.
type doctorFlags struct {
	store        storeFlags
	waitReplicas int
	waitAOF      bool
}

// rttWarn is the median PING time above which doctor warns: each request
// makes two or three store round trips.
const rttWarn = 5 * time.Millisecond

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
  pgstore functions the 7 transition functions exist and are executable

For the embedded store: the file opens (or is in use by a running proxy).`,
		flags: func(fs *flagSet) func(context.Context, *env, []string) error {
			var d doctorFlags
			d.store.hybrid = true
			fs.define(d.store.flags()...)
			fs.Int(&d.waitReplicas, "wait-replicas", "N", 0, "the replicas the application waits for (redisstore.WithWait): FAIL when fewer are connected")
			fs.Bool(&d.waitAOF, "wait-aof", false, "the application waits for the AOF fsync (redisstore.WithWaitAOF): FAIL below Redis 7.2, and when WAITAOF does not wait for the fsync; WARN with appendfsync everysec")
			return func(ctx context.Context, e *env, args []string) error {
				if len(args) > 0 {
					return usagef("doctor: unexpected argument %q", args[0])
				}
				if err := d.store.validate(); err != nil {
					return err
				}
				if d.waitReplicas < 0 {
					return usagef("--wait-replicas %d is negative", d.waitReplicas)
				}
				r := &report{w: e.stdout, hider: e.hider}
				switch {
				case d.store.redis():
					doctorRedis(ctx, r, &d)
				case d.store.postgres == "":
					doctorBolt(r, &d.store)
				}
				if d.store.postgres != "" {
					doctorPostgres(ctx, r, &d.store)
				}
				fmt.Fprintf(e.stdout, "%d OK, %d WARN, %d FAIL\n", r.counts[vOK], r.counts[vWarn], r.counts[vFail])
				if r.counts[vFail] > 0 {
					return &exitError{code: exitRuntime}
				}
				return nil
			}
		},
	}
}

func doctorBolt(r *report, s *storeFlags) {
	path := s.dataPath()
	if _, err := os.Stat(path); errors.Is(err, os.ErrNotExist) {
		r.add(vWarn, "embedded store", "%s does not exist yet; the proxy creates it (Redis checks do not apply)", path)
		return
	}
	st, err := boltstore.Open(path, boltstore.WithSweepInterval(0))
	switch {
	case errors.Is(err, boltstore.ErrLocked):
		r.add(vOK, "embedded store", "%s is in use by a running proxy (Redis checks do not apply)", path)
	case err != nil:
		r.add(vFail, "embedded store", "%v", openBoltError(path, err))
	default:
		st.Close()
		r.add(vOK, "embedded store", "%s opens (Redis checks do not apply)", path)
	}
}

func doctorRedis(ctx context.Context, r *report, d *doctorFlags) {
	s := &d.store
	var c redis.UniversalClient
	var nodes []*redis.Client
	if s.redisURL != "" {
		opt, err := redis.ParseURL(s.redisURL)
		if err != nil {
			r.add(vFail, "connect", "%v", urlFlagError("--redis", s.redisURL, err, "redis"))
			return
		}
		rc := redis.NewClient(opt)
		c, nodes = rc, []*redis.Client{rc}
	} else if s.sentinel != "" {
		opt, err := s.sentinelOptions()
		if err != nil {
			r.add(vFail, "connect", "%v", err)
			return
		}
		rc := redis.NewFailoverClient(opt)
		c, nodes = rc, []*redis.Client{rc}
	} else {
		opt, err := s.clusterOptions()
		if err != nil {
			r.add(vFail, "connect", "%v", err)
			return
		}
		cc := redis.NewClusterClient(opt)
		c = cc
		var mu sync.Mutex
		cctx, cancel := context.WithTimeout(ctx, connectTimeout)
		err = cc.ForEachMaster(cctx, func(_ context.Context, n *redis.Client) error {
			mu.Lock()
			nodes = append(nodes, n)
			mu.Unlock()
			return nil
		})
		cancel()
		if err != nil {
			cc.Close()
			if nr := s.notRedis(ctx); nr != nil {
				err = nr
			}
			r.add(vFail, "connect", "cannot reach the cluster: %v", err)
			return
		}
		slices.SortFunc(nodes, func(a, b *redis.Client) int { return strings.Compare(a.Options().Addr, b.Options().Addr) })
	}
	defer c.Close()
	cluster := s.cluster != ""
	for _, n := range nodes {
		prefix := ""
		if cluster {
			prefix = n.Options().Addr + " "
		}
		if !doctorNode(ctx, r, d, n, prefix) {
			return // the rights cannot be tried either
		}
	}
	if cluster {
		doctorClusterSlots(ctx, r, nodes[0])
	}
	doctorRights(ctx, r, c, s.prefix)
	// The proxy's store keeps a replay cache on a go-redis client that is
	// not a Cluster's, unless it waits for replicas or the AOF.
	if rc, ok := c.(*redis.Client); ok && d.waitReplicas == 0 && !d.waitAOF {
		doctorReplayCache(ctx, r, rc, s.prefix)
	}
}

// replyError reports whether err is an error reply of the server (NOPERM,
// an unknown command), not a failure to reach it.
func replyError(err error) bool {
	var re redis.Error
	return errors.As(err, &re)
}

// configFields reads with CONFIG GET what doctorNode reads from INFO when
// the server refuses INFO: maxmemory-policy, maxmemory and appendonly, as
// INFO's fields (maxmemory_policy, maxmemory, aof_enabled). What CONFIG GET
// refuses too is left out.
func configFields(ctx context.Context, n *redis.Client) map[string]string {
	f := make(map[string]string)
	get := func(name string) string {
		m, err := n.ConfigGet(ctx, name).Result()
		if err != nil {
			return ""
		}
		return m[name]
	}
	if v := get("maxmemory-policy"); v != "" {
		f["maxmemory_policy"] = v
	}
	if v := get("maxmemory"); v != "" {
		f["maxmemory"] = v
		if b, err := strconv.ParseInt(v, 10, 64); err == nil && b > 0 {
			f["maxmemory_human"] = formatSize(b)
		}
	}
	switch get("appendonly") {
	case "yes":
		f["aof_enabled"] = "1"
	case "no":
		f["aof_enabled"] = "0"
	}
	return f
}

// doctorNode runs the checks of one server. It reports whether the server
// could be reached. A server that refuses INFO (an ACL without +info, a
// managed service) is checked with what CONFIG GET tells, with WARNs for
// the rest, as the proxy starts on it with one warning.
func doctorNode(ctx context.Context, r *report, d *doctorFlags, n *redis.Client, prefix string) bool {
	cctx, cancel := context.WithTimeout(ctx, connectTimeout)
	defer cancel()
	info, err := n.Info(cctx).Result() // the default sections; several section names need Redis 7
	var fields map[string]string
	refused := ""
	switch {
	case err == nil:
		fields = redisinfo.Parse(info)
	case replyError(err):
		refused = " (INFO refused)"
		if redis.HasErrorPrefix(err, "NOPERM") {
			r.add(vWarn, prefix+"info", "the user may not run INFO: the version, persistence and replicas are read from it (the proxy starts with a warning that it cannot check the server); grant it (ACL SETUSER <user> +info)")
		} else {
			r.add(vWarn, prefix+"info", "INFO refused (%v): the version, persistence and replicas are read from it (the proxy starts with a warning that it cannot check the server)", err)
		}
		fields = configFields(cctx, n)
	default:
		if nr := d.store.notRedis(ctx); nr != nil {
			r.add(vFail, prefix+"connect", "%v", nr)
		} else {
			r.add(vFail, prefix+"connect", "%s: %v", n.Options().Addr, err)
		}
		return false
	}

	// Version.
	name, v := redisinfo.Server(fields)
	compat, ok := redisinfo.Compatible(fields)
	switch {
	case !ok:
		r.add(vWarn, prefix+"version", "cannot read the server version%s; idem needs Redis 7.0 or later, or Valkey", refused)
	case !compat.AtLeast(7, 0):
		r.add(vFail, prefix+"version", "%s %s is older than 7.0; idem needs Redis 7.0 or later, or Valkey (SET ... NX GET, SPUBLISH); upgrade the server", name, v)
	case d.waitAOF && !compat.AtLeast(7, 2):
		r.add(vFail, prefix+"version", "%s %s has no WAITAOF (Redis 7.2 or later); a store with WithWaitAOF is refused", name, v)
	default:
		r.add(vOK, prefix+"version", "%s %s", name, v)
	}

	// Eviction.
	switch policy := fields["maxmemory_policy"]; policy {
	case "noeviction":
		r.add(vOK, prefix+"maxmemory-policy", "noeviction")
	case "":
		if refused != "" {
			r.add(vWarn, prefix+"maxmemory-policy", "cannot read it (INFO and CONFIG GET refused); it must be noeviction")
		} else {
			r.add(vWarn, prefix+"maxmemory-policy", "cannot read it from INFO memory; it must be noeviction")
		}
	default:
		r.add(vFail, prefix+"maxmemory-policy", "%s: Redis may evict idempotency records, and a retried request then runs again; set maxmemory-policy noeviction (use a separate Redis for caches)", policy)
	}

	// Memory limit.
	if fields["maxmemory"] == "0" {
		r.add(vWarn, prefix+"maxmemory", "0 (no limit): Redis grows until the machine runs out of memory and the kernel kills it, losing the records written since the last fsync; set maxmemory below the machine's memory")
	} else if fields["maxmemory"] != "" {
		r.add(vOK, prefix+"maxmemory", "%s", fields["maxmemory_human"])
	}

	// Persistence.
	aofKnown, aof := fields["aof_enabled"] != "", fields["aof_enabled"] == "1"
	var save string
	saveKnown := true
	if cfg, err := n.ConfigGet(cctx, "save").Result(); err == nil {
		save = strings.TrimSpace(cfg["save"])
	} else {
		saveKnown = false
	}
	switch {
	case aof:
		fsync := "everysec"
		if cfg, err := n.ConfigGet(cctx, "appendfsync").Result(); err == nil && cfg["appendfsync"] != "" {
			fsync = cfg["appendfsync"]
		}
		r.add(vOK, prefix+"persistence", "appendonly yes (appendfsync %s)", fsync)
		if d.waitAOF && ok && compat.AtLeast(7, 2) {
			doctorWaitAOF(ctx, r, n, d.store.prefix, prefix)
		}
	case !aofKnown:
		r.add(vWarn, prefix+"persistence", "cannot read it (INFO and CONFIG GET refused); records survive a restart with appendonly yes")
	case !saveKnown:
		r.add(vWarn, prefix+"persistence", "appendonly is off and the RDB save rules cannot be read (CONFIG GET refused); turn appendonly on")
	case save != "":
		r.add(vWarn, prefix+"persistence", "RDB snapshots only (save %q): records written since the last snapshot are lost on a crash; turn appendonly on", save)
	default:
		r.add(vFail, prefix+"persistence", "off (appendonly no, no RDB save rules): a restart loses every record, and retried requests run again; set appendonly yes")
	}

	// Replicas, when the application waits for them.
	if d.waitReplicas > 0 {
		replicas, err := strconv.Atoi(fields["connected_slaves"])
		if err != nil {
			r.add(vWarn, prefix+"replicas", "cannot count the connected replicas%s; WAIT %d needs them", refused, d.waitReplicas)
		} else if replicas < d.waitReplicas {
			r.add(vFail, prefix+"replicas", "%d connected, fewer than the %d that WAIT needs: every acquire and complete would end in ErrNotDurable", replicas, d.waitReplicas)
		} else {
			r.add(vOK, prefix+"replicas", "%d connected (WAIT %d)", replicas, d.waitReplicas)
		}
	}

	// Lua.
	if v, err := n.Eval(cctx, "return 1", nil).Int(); err != nil || v != 1 {
		r.add(vFail, prefix+"lua", "EVAL 'return 1' failed (%v); the store needs Lua scripting", err)
	} else {
		r.add(vOK, prefix+"lua", "EVAL works")
	}
	doctorFunctions(cctx, r, n, prefix)

	// Round trip.
	var rtts []time.Duration
	for range 10 {
		start := time.Now()
		if err := n.Ping(cctx).Err(); err != nil {
			r.add(vFail, prefix+"round trip", "PING failed: %v", err)
			return true
		}
		rtts = append(rtts, time.Since(start))
	}
	slices.Sort(rtts)
	med := (rtts[4] + rtts[5]) / 2
	if med > rttWarn {
		r.add(vWarn, prefix+"round trip", "median PING %s over 10; each request makes 2-3 round trips to the store", med.Round(time.Microsecond))
	} else {
		r.add(vOK, prefix+"round trip", "median PING %s over 10", med.Round(time.Microsecond))
	}
	return true
}

// doctorWaitAOF reports redisstore.CheckWaitAOF, the check a store with
// WithWaitAOF makes at start: under appendfsync everysec, a server whose
// WAITAOF counts writes as fsynced before they are fails (a release known
// to, from its version; another that may, Redis 7.4 and later and Valkey 8
// and later, from a watched write: twice before a FAIL); one that waits is
// a warning, as each acquire and complete waits up to a second. On Redis
// and Valkey 7.2, WAITAOF answers at the server's next cron tick even with
// appendfsync always: a warning with the cost.
func doctorWaitAOF(ctx context.Context, r *report, n *redis.Client, keyPrefix, prefix string) {
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	chk, err := redisstore.CheckWaitAOF(ctx, n, keyPrefix)
	const tick = "; WAITAOF on %s answers at the server's next cron tick, about 100 ms per acquire and complete at the default hz 10 even with appendfsync always (Redis 7.4 and later answer within a millisecond)"
	switch {
	case err != nil:
		r.add(vWarn, prefix+"waitaof", "cannot tell whether WAITAOF waits for the fsync (%v)", err)
	case chk.Early:
		r.add(vFail, prefix+"waitaof", "appendfsync everysec: %s acknowledges writes as fsynced before their fsync (WAITAOF %s); fixed upstream by redis/redis#13793: WithWaitAOF would acknowledge records that a crash of the machine can lose, and a store with it is refused; set appendfsync always, or upgrade the server",
			chk.Server, chk.Reason())
	case chk.Unknown != "":
		r.add(vWarn, prefix+"waitaof", "cannot tell whether WAITAOF waits for the fsync: %s", chk.Unknown)
	case chk.Fsync == "everysec":
		detail := ""
		if chk.Window > 0 {
			detail = fmt.Sprintf(" (a write was not acknowledged within %v, before the next fsync could start)", chk.Window.Round(time.Millisecond))
		}
		if chk.CronTick {
			detail += fmt.Sprintf(tick, chk.Server)
		}
		r.add(vWarn, prefix+"waitaof", "appendfsync everysec: WAITAOF waits for the next fsync%s, up to a second per acquire and complete; appendfsync always makes it return at once", detail)
	case chk.CronTick:
		r.add(vWarn, prefix+"waitaof", "appendfsync %s%s", chk.Fsync, fmt.Sprintf(tick, chk.Server))
	default:
		r.add(vOK, prefix+"waitaof", "appendfsync %s: WAITAOF returns once the write is fsynced", chk.Fsync)
	}
}

// doctorFunctions reports which of idem's Functions libraries the server
// holds (redisstore.WithFunctions loads idem_<version> at first use), and
// whether the one of this version holds this version's code, as the store
// checks it (redisstore.CheckLibrary).
func doctorFunctions(ctx context.Context, r *report, n *redis.Client, prefix string) {
	want := redisstore.LibraryName()
	libs, err := n.FunctionList(ctx, redis.FunctionListQuery{LibraryNamePattern: "idem*"}).Result()
	if err == nil {
		var st redisstore.LibraryStatus
		if st, err = redisstore.CheckLibrary(ctx, n); err == nil && st == redisstore.LibraryForeign {
			r.add(vWarn, prefix+"functions", "library %s holds other code than this version's: every call in Functions mode fails (\"Function not found\") until the store replaces it, at its first call, with FUNCTION LOAD REPLACE (the user needs that right); or delete it (FUNCTION DELETE %s)", want, want)
			return
		}
	}
	if err != nil {
		r.add(vWarn, prefix+"functions", "FUNCTION LIST failed (%v); Functions mode needs FUNCTION LOAD, FUNCTION LIST, FCALL and FCALL_RO", err)
		return
	}
	var names []string
	loaded := false
	for _, l := range libs {
		names = append(names, l.Name)
		loaded = loaded || l.Name == want
	}
	switch {
	case loaded:
		r.add(vOK, prefix+"functions", "library %s of this version loaded (idem libraries: %s)", want, strings.Join(names, ", "))
	case len(names) > 0:
		r.add(vOK, prefix+"functions", "library %s of this version not loaded yet (loaded at first use in Functions mode); other idem libraries: %s", want, strings.Join(names, ", "))
	default:
		r.add(vOK, prefix+"functions", "no idem library loaded (script mode; Functions mode loads %s at first use)", want)
	}
}

func doctorClusterSlots(ctx context.Context, r *report, n *redis.Client) {
	cctx, cancel := context.WithTimeout(ctx, connectTimeout)
	defer cancel()
	info, err := n.ClusterInfo(cctx).Result()
	if err != nil {
		r.add(vFail, "cluster", "CLUSTER INFO failed: %v", err)
		return
	}
	f := redisinfo.Parse(info)
	assigned, _ := strconv.Atoi(f["cluster_slots_assigned"])
	failing, _ := strconv.Atoi(f["cluster_slots_fail"])
	switch {
	case f["cluster_state"] != "ok":
		r.add(vFail, "cluster", "cluster_state is %q, not ok", f["cluster_state"])
	case assigned != 16384:
		r.add(vFail, "cluster", "%d of 16384 slots assigned: keys of the other slots cannot be stored", assigned)
	case failing > 0:
		r.add(vFail, "cluster", "%d slots are failing", failing)
	default:
		r.add(vOK, "cluster", "state ok, all 16384 slots assigned, %s known nodes", f["cluster_known_nodes"])
	}
}
