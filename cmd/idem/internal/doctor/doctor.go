// Package doctor holds the checks of `idem doctor`: whether a store is fit
// to hold idempotency records. Each check prints one line to a Report, OK,
// WARN or FAIL with the reason and, where there is one, the fix. The
// command opens the clients from its flags; the checks take them.
package doctor

import (
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/idemgo/idem"
	"github.com/idemgo/idem/cmd/idem/internal/size"
	"github.com/idemgo/idem/postgres/pggate"
	"github.com/idemgo/idem/postgres/pgstore"
	"github.com/idemgo/idem/redisstore"
	"github.com/idemgo/idem/redisstore/redisinfo"
	"github.com/idemgo/idem/storekit"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/redis/go-redis/v9"
)

// Verdict is the result of one check.
type Verdict uint8

// The verdicts.
const (
	OK Verdict = iota
	Warn
	Fail
)

var verdictNames = [...]string{"OK", "WARN", "FAIL"}

// Report prints one line per check and counts them.
type Report struct {
	W io.Writer
	// Hide hides the secrets of the command line in every line; nil
	// hides nothing.
	Hide   func(string) string
	counts [3]int
}

// Add prints the line of one check: its verdict, its name and what it
// found.
func (r *Report) Add(v Verdict, check, format string, args ...any) {
	r.counts[v]++
	line := fmt.Sprintf(format, args...)
	if r.Hide != nil {
		line = r.Hide(line)
	}
	fmt.Fprintf(r.W, "%-4s  %s: %s\n", verdictNames[v], check, line)
}

// Count returns the number of lines of verdict v.
func (r *Report) Count(v Verdict) int { return r.counts[v] }

// timeout bounds the calls of one check, as the proxy's start checks.
const timeout = 3 * time.Second

// rttWarn is the median PING time above which doctor warns: each request
// makes two or three store round trips.
const rttWarn = 5 * time.Millisecond

// Redis is what the Redis checks need beside the servers: the options the
// application will use.
type Redis struct {
	Prefix       string // the keys' prefix (redisstore.WithPrefix)
	WaitReplicas int    // redisstore.WithWait's replicas; 0: none
	WaitAOF      bool   // redisstore.WithWaitAOF
	// NotRedis names a server of the command line that is not a Redis
	// server, after a failure to talk to one; nil if none is found.
	NotRedis func(ctx context.Context) error
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
			f["maxmemory_human"] = size.Format(b)
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

// Node runs the checks of one server, whose lines start with label. It
// reports whether the server could be reached. A server that refuses INFO
// (an ACL without +info, a managed service) is checked with what CONFIG
// GET tells, with WARNs for the rest, as the proxy starts on it with one
// warning.
func (o *Redis) Node(ctx context.Context, r *Report, n *redis.Client, label string) bool {
	cctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	fields, refused, ok := o.fields(cctx, r, n, label)
	if !ok {
		return false
	}
	compat, known := o.version(r, fields, refused, label)
	eviction(r, fields, refused, label)
	if fields["maxmemory"] == "0" {
		r.Add(Warn, label+"maxmemory", "0 (no limit): Redis grows until the machine runs out of memory and the kernel kills it, losing the records written since the last fsync; set maxmemory below the machine's memory")
	} else if fields["maxmemory"] != "" {
		r.Add(OK, label+"maxmemory", "%s", fields["maxmemory_human"])
	}
	if persistence(cctx, r, n, fields, label) && o.WaitAOF && known && compat.AtLeast(7, 2) {
		waitAOF(ctx, r, n, o.Prefix, label)
	}
	o.replicas(r, fields, refused, label)
	if v, err := n.Eval(cctx, "return 1", nil).Int(); err != nil || v != 1 {
		r.Add(Fail, label+"lua", "EVAL 'return 1' failed (%v); the store needs Lua scripting", err)
	} else {
		r.Add(OK, label+"lua", "EVAL works")
	}
	functions(cctx, r, n, label)
	roundTrip(cctx, r, n, label)
	return true
}

// fields reads the server's INFO, or what CONFIG GET tells when INFO is
// refused (then refused is said in the lines that miss it). ok is false
// when the server cannot be reached.
func (o *Redis) fields(ctx context.Context, r *Report, n *redis.Client, label string) (fields map[string]string, refused string, ok bool) {
	info, err := n.Info(ctx).Result() // the default sections; several section names need Redis 7
	switch {
	case err == nil:
		return redisinfo.Parse(info), "", true
	case replyError(err):
		if redis.HasErrorPrefix(err, "NOPERM") {
			r.Add(Warn, label+"info", "the user may not run INFO: the version, persistence and replicas are read from it (the proxy starts with a warning that it cannot check the server); grant it (ACL SETUSER <user> +info)")
		} else {
			r.Add(Warn, label+"info", "INFO refused (%v): the version, persistence and replicas are read from it (the proxy starts with a warning that it cannot check the server)", err)
		}
		return configFields(ctx, n), " (INFO refused)", true
	}
	if nr := o.NotRedis(ctx); nr != nil {
		r.Add(Fail, label+"connect", "%v", nr)
	} else {
		r.Add(Fail, label+"connect", "%s: %v", n.Options().Addr, err)
	}
	return nil, "", false
}

// version checks the server's version; it returns it, and whether it is
// known.
func (o *Redis) version(r *Report, fields map[string]string, refused, label string) (redisinfo.Version, bool) {
	name, v := redisinfo.Server(fields)
	compat, ok := redisinfo.Compatible(fields)
	switch {
	case !ok:
		r.Add(Warn, label+"version", "cannot read the server version%s; idem needs Redis 7.0 or later, or Valkey", refused)
	case !compat.AtLeast(7, 0):
		r.Add(Fail, label+"version", "%s %s is older than 7.0; idem needs Redis 7.0 or later, or Valkey (SET ... NX GET, SPUBLISH); upgrade the server", name, v)
	case o.WaitAOF && !compat.AtLeast(7, 2):
		r.Add(Fail, label+"version", "%s %s has no WAITAOF (Redis 7.2 or later); a store with WithWaitAOF is refused", name, v)
	default:
		r.Add(OK, label+"version", "%s %s", name, v)
	}
	return compat, ok
}

// eviction checks maxmemory-policy.
func eviction(r *Report, fields map[string]string, refused, label string) {
	switch policy := fields["maxmemory_policy"]; {
	case policy == "noeviction":
		r.Add(OK, label+"maxmemory-policy", "noeviction")
	case policy == "" && refused != "":
		r.Add(Warn, label+"maxmemory-policy", "cannot read it (INFO and CONFIG GET refused); it must be noeviction")
	case policy == "":
		r.Add(Warn, label+"maxmemory-policy", "cannot read it from INFO memory; it must be noeviction")
	default:
		r.Add(Fail, label+"maxmemory-policy", "%s: Redis may evict idempotency records, and a retried request then runs again; set maxmemory-policy noeviction (use a separate Redis for caches)", policy)
	}
}

// persistence checks the AOF and the RDB save rules; it reports whether
// the AOF is on.
func persistence(ctx context.Context, r *Report, n *redis.Client, fields map[string]string, label string) bool {
	aofKnown, aof := fields["aof_enabled"] != "", fields["aof_enabled"] == "1"
	cfg, err := n.ConfigGet(ctx, "save").Result()
	save, saveKnown := strings.TrimSpace(cfg["save"]), err == nil
	switch {
	case aof:
		fsync := "everysec"
		if cfg, err := n.ConfigGet(ctx, "appendfsync").Result(); err == nil && cfg["appendfsync"] != "" {
			fsync = cfg["appendfsync"]
		}
		r.Add(OK, label+"persistence", "appendonly yes (appendfsync %s)", fsync)
	case !aofKnown:
		r.Add(Warn, label+"persistence", "cannot read it (INFO and CONFIG GET refused); records survive a restart with appendonly yes")
	case !saveKnown:
		r.Add(Warn, label+"persistence", "appendonly is off and the RDB save rules cannot be read (CONFIG GET refused); turn appendonly on")
	case save != "":
		r.Add(Warn, label+"persistence", "RDB snapshots only (save %q): records written since the last snapshot are lost on a crash; turn appendonly on", save)
	default:
		r.Add(Fail, label+"persistence", "off (appendonly no, no RDB save rules): a restart loses every record, and retried requests run again; set appendonly yes")
	}
	return aof
}

// replicas checks, when the application waits for replicas, that as many
// are connected.
func (o *Redis) replicas(r *Report, fields map[string]string, refused, label string) {
	if o.WaitReplicas == 0 {
		return
	}
	replicas, err := strconv.Atoi(fields["connected_slaves"])
	switch {
	case err != nil:
		r.Add(Warn, label+"replicas", "cannot count the connected replicas%s; WAIT %d needs them", refused, o.WaitReplicas)
	case replicas < o.WaitReplicas:
		r.Add(Fail, label+"replicas", "%d connected, fewer than the %d that WAIT needs: every acquire and complete would end in ErrNotDurable", replicas, o.WaitReplicas)
	default:
		r.Add(OK, label+"replicas", "%d connected (WAIT %d)", replicas, o.WaitReplicas)
	}
}

// roundTrip reports the median of 10 PINGs.
func roundTrip(ctx context.Context, r *Report, n *redis.Client, label string) {
	var rtts []time.Duration
	for range 10 {
		start := time.Now()
		if err := n.Ping(ctx).Err(); err != nil {
			r.Add(Fail, label+"round trip", "PING failed: %v", err)
			return
		}
		rtts = append(rtts, time.Since(start))
	}
	slices.Sort(rtts)
	med := (rtts[4] + rtts[5]) / 2
	if med > rttWarn {
		r.Add(Warn, label+"round trip", "median PING %s over 10; each request makes 2-3 round trips to the store", med.Round(time.Microsecond))
	} else {
		r.Add(OK, label+"round trip", "median PING %s over 10", med.Round(time.Microsecond))
	}
}

// waitAOF reports redisstore.CheckWaitAOF, the check a store with
// WithWaitAOF makes at start: under appendfsync everysec, a server whose
// WAITAOF counts writes as fsynced before they are fails (a release known
// to, from its version; another that may, Redis 7.4 and later and Valkey 8
// and later, from a watched write: twice before a FAIL); one that waits is
// a warning, as each acquire and complete waits up to a second. On Redis
// and Valkey 7.2, WAITAOF answers at the server's next cron tick even with
// appendfsync always: a warning with the cost.
func waitAOF(ctx context.Context, r *Report, n *redis.Client, keyPrefix, label string) {
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	chk, err := redisstore.CheckWaitAOF(ctx, n, keyPrefix)
	const tick = "; WAITAOF on %s answers at the server's next cron tick, about 100 ms per acquire and complete at the default hz 10 even with appendfsync always (Redis 7.4 and later answer within a millisecond)"
	switch {
	case err != nil:
		r.Add(Warn, label+"waitaof", "cannot tell whether WAITAOF waits for the fsync (%v)", err)
	case chk.Early:
		r.Add(Fail, label+"waitaof", "appendfsync everysec: %s acknowledges writes as fsynced before their fsync (WAITAOF %s); fixed upstream by redis/redis#13793: WithWaitAOF would acknowledge records that a crash of the machine can lose, and a store with it is refused; set appendfsync always, or upgrade the server",
			chk.Server, chk.Reason())
	case chk.Unknown != "":
		r.Add(Warn, label+"waitaof", "cannot tell whether WAITAOF waits for the fsync: %s", chk.Unknown)
	case chk.Fsync == "everysec":
		detail := ""
		if chk.Window > 0 {
			detail = fmt.Sprintf(" (a write was not acknowledged within %v, before the next fsync could start)", chk.Window.Round(time.Millisecond))
		}
		if chk.CronTick {
			detail += fmt.Sprintf(tick, chk.Server)
		}
		r.Add(Warn, label+"waitaof", "appendfsync everysec: WAITAOF waits for the next fsync%s, up to a second per acquire and complete; appendfsync always makes it return at once", detail)
	case chk.CronTick:
		r.Add(Warn, label+"waitaof", "appendfsync %s%s", chk.Fsync, fmt.Sprintf(tick, chk.Server))
	default:
		r.Add(OK, label+"waitaof", "appendfsync %s: WAITAOF returns once the write is fsynced", chk.Fsync)
	}
}

// functions reports which of idem's Functions libraries the server
// holds (redisstore.WithFunctions loads idem_<version> at first use), and
// whether the one of this version holds this version's code, as the store
// checks it (redisstore.CheckLibrary).
func functions(ctx context.Context, r *Report, n *redis.Client, label string) {
	want := redisstore.LibraryName()
	libs, err := n.FunctionList(ctx, redis.FunctionListQuery{LibraryNamePattern: "idem*"}).Result()
	if err == nil {
		var st redisstore.LibraryStatus
		if st, err = redisstore.CheckLibrary(ctx, n); err == nil && st == redisstore.LibraryForeign {
			r.Add(Warn, label+"functions", "library %s holds other code than this version's: every call in Functions mode fails (\"Function not found\") until the store replaces it, at its first call, with FUNCTION LOAD REPLACE (the user needs that right); or delete it (FUNCTION DELETE %s)", want, want)
			return
		}
	}
	if err != nil {
		r.Add(Warn, label+"functions", "FUNCTION LIST failed (%v); Functions mode needs FUNCTION LOAD, FUNCTION LIST, FCALL and FCALL_RO", err)
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
		r.Add(OK, label+"functions", "library %s of this version loaded (idem libraries: %s)", want, strings.Join(names, ", "))
	case len(names) > 0:
		r.Add(OK, label+"functions", "library %s of this version not loaded yet (loaded at first use in Functions mode); other idem libraries: %s", want, strings.Join(names, ", "))
	default:
		r.Add(OK, label+"functions", "no idem library loaded (script mode; Functions mode loads %s at first use)", want)
	}
}

// ClusterSlots checks that every slot of the cluster of n is assigned and
// the cluster is ok.
func ClusterSlots(ctx context.Context, r *Report, n *redis.Client) {
	cctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	info, err := n.ClusterInfo(cctx).Result()
	if err != nil {
		r.Add(Fail, "cluster", "CLUSTER INFO failed: %v", err)
		return
	}
	f := redisinfo.Parse(info)
	assigned, _ := strconv.Atoi(f["cluster_slots_assigned"])
	failing, _ := strconv.Atoi(f["cluster_slots_fail"])
	switch {
	case f["cluster_state"] != "ok":
		r.Add(Fail, "cluster", "cluster_state is %q, not ok", f["cluster_state"])
	case assigned != 16384:
		r.Add(Fail, "cluster", "%d of 16384 slots assigned: keys of the other slots cannot be stored", assigned)
	case failing > 0:
		r.Add(Fail, "cluster", "%d slots are failing", failing)
	default:
		r.Add(OK, "cluster", "state ok, all 16384 slots assigned, %s known nodes", f["cluster_known_nodes"])
	}
}

// rightCheck is one command the store sends, tried on its own with the
// user's ACL on a scratch key.
type rightCheck struct {
	args     []any
	neededBy string
	missing  Verdict // the verdict when the user may not run it
}

// Rights tries, with the user's ACL, each command idem's scripts and
// admin commands send, on a scratch key of the prefix, and names each one
// the user may not run; then, if none is missing, runs every transition the
// proxy uses on a scratch key through the store. (Inside a script, a denied
// command fails the script with an error that does not name it, so the
// commands are tried one by one first.) The scratch keys are deleted.
func Rights(ctx context.Context, r *Report, c redis.UniversalClient, prefix string) {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	st, err := redisstore.New(c, redisstore.WithPrefix(prefix), redisstore.WithAllowEviction(), redisstore.WithReplayCache(false),
		redisstore.WithLogger(slog.New(slog.NewTextHandler(io.Discard, nil))))
	if err != nil {
		r.Add(Fail, "rights", "not checked: %v", err)
		return
	}
	scratch := "idem-doctor-" + rand.Text()
	name := st.Key(scratch)
	defer c.Del(context.WithoutCancel(ctx), name)
	channel := name + ":w"
	pub, sub := "PUBLISH", "SUBSCRIBE"
	if _, ok := c.(*redis.ClusterClient); ok {
		pub, sub = "SPUBLISH", "SSUBSCRIBE"
	}
	checks := []rightCheck{
		{[]any{"EVAL", "return 1", "1", name}, "every transition (the scripts)", Fail},
		{[]any{"EVALSHA", "0000000000000000000000000000000000000000", "1", name}, "every transition (the cached scripts)", Fail},
		{[]any{"TIME"}, "every transition (the server's clock)", Fail},
		{[]any{"GET", name}, "every transition", Fail},
		{[]any{"SET", name, "doctor", "PX", "10000"}, "every transition", Fail},
		{[]any{"PTTL", name}, "get (replays)", Fail},
		{[]any{pub, channel, "doctor"}, "complete, fail and release (wake-ups)", Fail},
		{[]any{"DEL", name}, "idem rm", Warn},
		{[]any{"SCAN", "0", "MATCH", prefix + "{*", "COUNT", "1"}, "idem ls", Warn},
	}
	var missing []string
	for _, ch := range checks {
		err := c.Do(ctx, ch.args...).Err()
		if !redis.HasErrorPrefix(err, "NOPERM") {
			continue
		}
		cmd := ch.args[0].(string)
		missing = append(missing, cmd)
		r.Add(ch.missing, "rights", "the user may not run %s, which %s needs; grant it (ACL SETUSER <user> +%s)", cmd, ch.neededBy, strings.ToLower(cmd))
	}
	if err := trySubscribe(ctx, c, sub, channel); redis.HasErrorPrefix(err, "NOPERM") {
		r.Add(Warn, "rights", "the user may not run %s: waiters (--wait) poll the record instead of being woken; grant it (ACL SETUSER <user> +%s)", sub, strings.ToLower(sub))
	}
	if len(missing) > 0 {
		r.Add(Fail, "rights", "the transitions were not run: the user lacks %s", strings.Join(missing, ", "))
		return
	}
	if err := runTransitions(ctx, st, scratch); err != nil {
		r.Add(Fail, "rights", "a transition failed on the scratch key %s: %v", name, err)
		return
	}
	r.Add(OK, "rights", "acquire, extend, complete, get, release, fail and delete ran on a scratch key of prefix %q", prefix)
}

func trySubscribe(ctx context.Context, c redis.UniversalClient, cmd, channel string) error {
	var ps *redis.PubSub
	if cmd == "SSUBSCRIBE" {
		ps = c.SSubscribe(ctx, channel)
	} else {
		ps = c.Subscribe(ctx, channel)
	}
	defer ps.Close()
	_, err := ps.Receive(ctx)
	return err
}

// runTransitions runs every transition the proxy uses on key: acquire,
// extend, complete, get and delete; then acquire, release, acquire, fail
// and delete.
func runTransitions(ctx context.Context, st *redisstore.Store, key string) error {
	const d = 10 * time.Second
	req := storekit.AcquireRequest{Fingerprint: "doctor", Owner: "idem-doctor", Lease: d, Retention: d}
	acquire := func() (idem.Lease, error) {
		a, err := st.Acquire(ctx, key, req)
		if err != nil {
			return idem.Lease{}, fmt.Errorf("acquire: %w", err)
		}
		if a.Outcome != storekit.Acquired && a.Outcome != storekit.TakenOver {
			return idem.Lease{}, fmt.Errorf("acquire: got %v on a new key", a.Outcome)
		}
		return a.Lease, nil
	}
	steps := []func() error{
		func() error {
			l, err := acquire()
			if err != nil {
				return err
			}
			if err := st.Extend(ctx, key, l, d); err != nil {
				return fmt.Errorf("extend: %w", err)
			}
			if err := st.Complete(ctx, key, l, []byte("doctor"), d); err != nil {
				return fmt.Errorf("complete: %w", err)
			}
			return nil
		},
		func() error {
			if _, err := st.Get(ctx, key); err != nil {
				return fmt.Errorf("get: %w", err)
			}
			return st.Delete(ctx, key)
		},
		func() error {
			l, err := acquire()
			if err != nil {
				return err
			}
			if err := st.Release(ctx, key, l, d); err != nil {
				return fmt.Errorf("release: %w", err)
			}
			if l, err = acquire(); err != nil {
				return err
			}
			if _, err := st.Fail(ctx, key, l, storekit.Failure{Result: []byte("doctor"), Terminal: true, Retention: d}); err != nil {
				return fmt.Errorf("fail: %w", err)
			}
			return st.Delete(ctx, key)
		},
	}
	for _, step := range steps {
		if err := step(); err != nil {
			return err
		}
	}
	return nil
}

// invalidateChannel is where the server sends the invalidations of client
// tracking to a RESP2 connection (CLIENT TRACKING ... REDIRECT).
const invalidateChannel = "__redis__:invalidate"

// ReplayCache tries, with the user's ACL, what the connections of the
// proxy's replay cache send (see redisstore's package documentation,
// "Local replay cache"): CLIENT SETNAME, CLIENT ID and CLIENT TRACKING ON
// REDIRECT <id> (here its own) on a connection of its own, then SUBSCRIBE
// __redis__:invalidate. Without them the proxy serves, reads every replay
// from Redis and logs a warning, so a missing right is a WARN that names
// the ACL fix.
func ReplayCache(ctx context.Context, r *Report, c *redis.Client, prefix string) {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	opt := *c.Options() // as the tracking connection: the client's options, RESP2, one connection
	opt.Protocol, opt.PoolSize, opt.MinIdleConns, opt.MaxIdleConns, opt.ClientName = 2, 1, 0, 0, ""
	tc := redis.NewClient(&opt)
	defer tc.Close()
	t := &tracking{}
	t.client(ctx, tc)
	const fallback = "the proxy reads every replay from Redis"
	if len(t.missing) > 0 {
		r.Add(Warn, "replay cache", "the user may not run %s, which the replay cache's tracking connection needs: %s; grant it (ACL SETUSER <user> %s)",
			strings.Join(t.missing, ", "), fallback, strings.Join(t.grants, " "))
	}
	subscribeErr := trySubscribe(ctx, tc, "SUBSCRIBE", invalidateChannel)
	if redis.HasErrorPrefix(subscribeErr, "NOPERM") {
		grant := "&" + invalidateChannel
		if redis.HasErrorPrefix(trySubscribe(ctx, tc, "SUBSCRIBE", prefix+"idem-doctor"), "NOPERM") {
			grant = "+subscribe " + grant // SUBSCRIBE itself may be denied
		}
		r.Add(Warn, "replay cache", "the user may not subscribe to %s, where the server sends the replay cache's invalidations: %s; grant it (ACL SETUSER <user> %s)",
			invalidateChannel, fallback, grant)
		t.missing = append(t.missing, "SUBSCRIBE")
	} else if subscribeErr != nil {
		t.errs = append(t.errs, subscribeErr)
	}
	switch {
	case len(t.errs) > 0:
		r.Add(Warn, "replay cache", "the tracking connection's commands failed (%v): %s", errors.Join(t.errs...), fallback)
	case len(t.missing) == 0:
		r.Add(OK, "replay cache", "CLIENT TRACKING (redirected to a subscriber of %s) allowed", invalidateChannel)
	}
}

// tracking is what the tries of the tracking connection's commands found:
// the commands denied, the grants they need, and the other errors.
type tracking struct {
	missing, grants []string
	errs            []error
}

// note notes err of cmd: denied (grant would allow it), or another
// error.
func (t *tracking) note(err error, cmd, grant string) {
	switch {
	case redis.HasErrorPrefix(err, "NOPERM"):
		t.missing, t.grants = append(t.missing, cmd), append(t.grants, grant)
	case err != nil:
		t.errs = append(t.errs, err)
	}
}

// client tries CLIENT SETNAME, CLIENT ID and CLIENT TRACKING on a
// connection of tc, as the replay cache's connections send them.
func (t *tracking) client(ctx context.Context, tc *redis.Client) {
	cn := tc.Conn()
	defer cn.Close()
	t.note(cn.Do(ctx, "CLIENT", "SETNAME", "idem-doctor").Err(), "CLIENT SETNAME", "+client|setname")
	tracking := []any{"CLIENT", "TRACKING", "ON"}
	id, err := cn.ClientID(ctx).Result()
	t.note(err, "CLIENT ID", "+client|id")
	if err == nil {
		tracking = []any{"CLIENT", "TRACKING", "ON", "REDIRECT", id}
	}
	err = cn.Do(ctx, tracking...).Err()
	t.note(err, "CLIENT TRACKING", "+client|tracking")
	if err == nil {
		_ = cn.Do(ctx, "CLIENT", "TRACKING", "OFF").Err()
	}
}

// Postgres checks the database of pool (described as describe): the
// commit gate's table, its indexes and rights, pgstore's table and
// functions if present, and the relay's backlog.
func Postgres(ctx context.Context, r *Report, pool *pgxpool.Pool, describe string) {
	var version, schema, user string
	if err := pool.QueryRow(ctx, `SELECT current_setting('server_version'), coalesce(current_schema(), ''), current_user`).Scan(&version, &schema, &user); err != nil {
		r.Add(Fail, "postgres", "%s: %v", describe, err)
		return
	}
	r.Add(OK, "postgres", "%s, PostgreSQL %s, schema %q, user %q", describe, version, schema, user)
	var gate, records bool
	pool.QueryRow(ctx, `SELECT to_regclass($1) IS NOT NULL, to_regclass($2) IS NOT NULL`, pggate.Table, pgstore.Table).Scan(&gate, &records)
	if !gate && !records {
		r.Add(Fail, "tables", "neither %s (the commit gate) nor %s (pgstore) exists in the search_path: run Gate.Migrate / Store.Migrate, apply pggate/schema.sql or pgstore/schema.sql, or start the proxy with --postgres once", pggate.Table, pgstore.Table)
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
			r.Add(Fail, table+" indexes", "missing %v: apply the schema again (Migrate is idempotent)", missing)
		} else {
			r.Add(OK, table+" indexes", "%v", indexes)
		}
		var ok bool
		if err := pool.QueryRow(ctx, `SELECT has_table_privilege($1, $2)`, table, privs).Scan(&ok); err != nil || !ok {
			r.Add(Fail, table+" rights", "user %q lacks one of %s on %s", user, privs, table)
		} else {
			r.Add(OK, table+" rights", "%s", privs)
		}
	}
	if gate {
		checkTable(pggate.Table, []string{"idem_completions_pkey", "idem_completions_created_at", "idem_completions_unfinished", "idem_completions_relay_pkey"}, "SELECT, INSERT, UPDATE, DELETE")
		var backlog int64
		pool.QueryRow(ctx, `SELECT count(*) FROM idem_completions c, idem_completions_relay r
WHERE (c.created_at, c.digest) > (r.created_at, r.digest) AND NOT c.relayed AND c.progress IS NULL
  AND c.created_at < now() - interval '1 minute' AND c.expires_at > now()`).Scan(&backlog)
		if backlog > 0 {
			r.Add(Warn, "relay backlog", "%d completions older than 1m are not relayed to the store: is a Gate or `idem relay` running?", backlog)
		} else {
			r.Add(OK, "relay backlog", "no completion older than 1m waits for the relay")
		}
		var abandoned int64
		pool.QueryRow(ctx, `SELECT count(*) FROM idem_completions WHERE progress IS NOT NULL AND NOT progress ? 'failed'
  AND (progress->>'until')::timestamptz < now() - interval '1 minute' AND expires_at > now()`).Scan(&abandoned)
		if abandoned > 0 {
			r.Add(Warn, "abandoned multi-step requests", "%d requests stopped mid-way over 1m ago: is a Gate with their flow registered running (its completer finishes them)?", abandoned)
		} else {
			r.Add(OK, "abandoned multi-step requests", "none stopped mid-way over 1m ago")
		}
	} else {
		r.Add(Warn, pggate.Table, "does not exist: the commit gate is not set up in this schema (fine if only pgstore is used without the gate)")
	}
	if records {
		checkTable(pgstore.Table, []string{"idem_records_pkey", "idem_records_expires_at"}, "SELECT, INSERT, UPDATE, DELETE")
		var fns int
		pool.QueryRow(ctx, `SELECT count(*) FROM pg_proc WHERE proname IN ('idem_acquire','idem_complete','idem_fail','idem_extend','idem_release','idem_relay','idem_now') AND has_function_privilege(oid, 'EXECUTE')`).Scan(&fns)
		if fns < 7 {
			r.Add(Fail, "pgstore functions", "%d of 7 transition functions exist and are executable: apply pgstore/schema.sql (Store.Migrate)", fns)
		} else {
			r.Add(OK, "pgstore functions", "7 of 7 executable")
		}
	}
}
