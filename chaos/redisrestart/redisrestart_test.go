package redisrestart

import (
	"context"
	"errors"
	"fmt"
	"net"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idemgo/idem"
	"github.com/idemgo/idem/chaos/chaostest"
	"github.com/idemgo/idem/redisstore"
	"github.com/idemgo/idem/redisstore/redisinfo"
	"github.com/idemgo/idem/storekit"
	"github.com/idemgo/idem/testkit/redistest"
	"github.com/redis/go-redis/v9"
	"github.com/redis/rueidis"
)

const (
	// lease is the Executor's lease: a key whose owner's complete was lost
	// with the server is taken over this long after its acquisition.
	lease = time.Second
	// doTimeout bounds one Do call, so that a call never hangs on a dead
	// server.
	doTimeout = 5 * time.Second
	// waitLimit bounds every wait on a condition (acknowledgements, errors,
	// reconnection). It is generous: the machine may be loaded.
	waitLimit = 60 * time.Second
	// workers is the number of goroutines per client library.
	workers = 3
	// waitAOFWorkers replaces workers in the WAITAOF variant. With
	// appendfsync everysec, WAITAOF holds each acquire and complete until
	// the server's next fsync of its AOF, which comes once a second: a Do
	// takes about a second (Redis 7.2.6), and 3 goroutines per client
	// would need minutes for the long variant's 1,000 acknowledgements
	// per round, far beyond waitLimit. A store that waits for fsyncs gets
	// its throughput from concurrent callers, and so does this variant.
	waitAOFWorkers = 100
	// waitAOFTimeout is the variant's WAITAOF timeout: an fsync comes a
	// second after the one before, and takes its own time. Two waits fit
	// in doTimeout.
	waitAOFTimeout = 2 * time.Second
	// waitAOFLease is the variant's lease: an acquire that waits for an
	// fsync returns up to a second later, and with the 1 s lease of the
	// other variants the Executor found the lease over before the
	// operation could start (Redis 7.2.6).
	waitAOFLease = 5 * time.Second
	// retryPause is the back-off before a caller retries a key whose Do
	// failed: the retry policy of a well-behaved client.
	retryPause = 20 * time.Millisecond
)

// variant is one persistence configuration of the killed server.
type variant struct {
	name string
	// scenario names the report row.
	scenario string
	args     []string
	waitAOF  bool
	// mustKeep says the configuration promises that no acknowledged
	// completion is lost to a crash of the redis-server process.
	mustKeep bool
	// mustLose marks the negative control: without persistence every
	// record is lost, and the checks must see it.
	mustLose bool
}

// lease returns the Executor's lease.
func (v variant) lease() time.Duration {
	if v.waitAOF {
		return waitAOFLease
	}
	return lease
}

// workers returns the number of goroutines per client library.
func (v variant) workers() int {
	if v.waitAOF {
		return waitAOFWorkers
	}
	return workers
}

// TestRedisRestart is scenario 4: redis-server runs with AOF persistence
// while two clients (go-redis and rueidis, three goroutines each) run
// Executor.Do on fresh keys, retrying a key whose Do failed until it is
// acknowledged. The test injects SIGKILL of redis-server (2 times in the
// short variant, 10 in the long one) after every client acknowledged a
// batch of completions, waits until every client saw the outage as an error,
// and restarts the server on the same port and directory. It asserts:
//
//   - the clients reconnect by themselves (the same client objects), and
//     every key in flight at a kill is resolved afterwards;
//   - every error a caller saw is wrapped ("idem: ...");
//   - no key is executed again after a caller was told it completed (the
//     final pass calls Do again on every acknowledged key: it must replay);
//   - a key executed twice is one whose Do had failed (its complete may have
//     been lost with the server), and the second execution holds a higher
//     fence: it is the documented takeover after the lease, never a silent
//     overwrite;
//   - with appendfsync always (and with WAITAOF where the server has it), no
//     completed record acknowledged before a kill is missing after the
//     restart. With everysec the loss is measured and reported, not
//     asserted: it is the documented limit of that setting;
//   - negative control: without persistence the checks do see the lost
//     records and the keys that run again after an acknowledgement.
func TestRedisRestart(t *testing.T) {
	// go-redis logs every failed dial of its pool; during an outage that is
	// expected, and the test counts the errors callers see instead.
	redis.SetLogger(quietLogger{})
	variants := []variant{
		{name: "always", scenario: "Redis kill -9, appendfsync always", args: []string{"--appendonly", "yes", "--appendfsync", "always"}, mustKeep: true},
		{name: "everysec", scenario: "Redis kill -9, appendfsync everysec", args: []string{"--appendonly", "yes", "--appendfsync", "everysec"}},
		{name: "none", scenario: "Redis kill -9, no persistence (negative control)", args: []string{"--appendonly", "no", "--save", ""}, mustLose: true},
		{name: "everysec_waitaof", scenario: "Redis kill -9, everysec + WAITAOF", args: []string{"--appendonly", "yes", "--appendfsync", "everysec"}, waitAOF: true, mustKeep: true},
	}
	for _, v := range variants {
		t.Run(v.name, func(t *testing.T) {
			t.Parallel()
			runVariant(t, v)
		})
	}
}

func runVariant(t *testing.T, v variant) {
	command := "make chaos-long RUN=TestRedisRestart/" + v.name
	srv := redistest.Start(t, v.args...)
	var opts []redisstore.Option
	if v.waitAOF {
		fields := serverInfo(t, srv)
		if ver, ok := redisinfo.Compatible(fields); !ok || !ver.AtLeast(7, 2) {
			checkWaitAOFRefused(t, srv)
			var c chaostest.Counters
			chaostest.Report(t, v.scenario, command, &c, map[string]string{
				"waitaof": fmt.Sprintf("not supported by this server (%s); WAITAOF needs Redis 7.2", fields["redis_version"]),
			})
			return
		}
		chk, err := redisstore.CheckWaitAOF(t.Context(), srv.GoRedis(t), "idem:")
		if err != nil {
			t.Fatal(err)
		}
		if chk.Early {
			checkEarlyWaitAOFRefused(t, srv)
			var c chaostest.Counters
			chaostest.Report(t, v.scenario, command, &c, map[string]string{
				"waitaof": fmt.Sprintf("refused: %s counts writes as fsynced before they are under appendfsync everysec", chk.Server),
			})
			return
		}
		opts = append(opts, redisstore.WithWaitAOF(1, 0, waitAOFTimeout))
	}

	var c chaostest.Counters
	loads := []*load{
		newLoad(t, "go-redis", goRedisStore(t, srv.Addr(), opts), v.lease(), &c),
		newLoad(t, "rueidis", rueidisStore(t, srv.Addr(), opts), v.lease(), &c),
	}
	stop := make(chan struct{})
	var wg sync.WaitGroup
	for _, l := range loads {
		for range v.workers() {
			wg.Go(func() { l.run(stop) })
		}
	}
	stopped := false
	stopLoad := func() {
		if !stopped {
			stopped = true
			close(stop)
			wg.Wait()
		}
	}
	defer stopLoad() // on a failed wait, before the server is killed

	kills := chaostest.Size(2, 10)
	perRound := int64(chaostest.Size(150, 1000))
	var outages []time.Duration
	var ackedBeforeLastKill int64
	for range kills {
		waitFor(t, "acknowledgements before the kill", func() bool {
			return allLoads(loads, func(l *load) bool { return l.acksSinceRestart() >= perRound })
		})
		ackedBeforeLastKill = 0
		for _, l := range loads {
			ackedBeforeLastKill += l.acknowledged()
		}
		killed := time.Now()
		srv.Kill(t) // SIGKILL, by the server's own PID
		for _, l := range loads {
			l.killed()
		}
		waitFor(t, "an error in every client during the outage", func() bool {
			return allLoads(loads, func(l *load) bool { return l.outageErrors() > 0 })
		})
		srv.Restart(t) // same port, same directory, same options
		outages = append(outages, time.Since(killed))
		for _, l := range loads {
			l.restarted()
		}
	}
	waitFor(t, "acknowledgements after the last restart", func() bool {
		return allLoads(loads, func(l *load) bool { return l.acksSinceRestart() >= perRound })
	})
	stopLoad()

	figures := map[string]string{
		"kills":                  strconv.Itoa(kills),
		"outage":                 fmt.Sprintf("p50 %v", chaostest.Percentile(outages, 50).Round(time.Millisecond)),
		"redis":                  serverInfo(t, srv)["redis_version"],
		"persistence":            strings.Join(v.args, " "),
		"lease":                  v.lease().String(),
		"acked_before_last_kill": strconv.FormatInt(ackedBeforeLastKill, 10),
	}
	if v.waitAOF {
		figures["waitaof"] = fmt.Sprintf("WAITAOF 1 0 %d after acquire and complete", waitAOFTimeout.Milliseconds())
	}
	var dupAfterAck, reexec, lost int64
	for _, l := range loads {
		r := l.check(t)
		dupAfterAck += r.dupAfterAck
		reexec += r.reexecuted
		lost += r.lost
		figures["reconnect_p50_"+l.name] = chaostest.Percentile(l.reconnects, 50).Round(10 * time.Microsecond).String()
		figures["reconnect_max_"+l.name] = chaostest.Percentile(l.reconnects, 100).Round(10 * time.Microsecond).String()
		figures["do_errors_"+l.name] = strconv.FormatInt(l.errs, 10)
		figures["resolved_by_replay_"+l.name] = strconv.FormatInt(l.resolvedByReplay, 10)
		if l.leaseLost > 0 {
			figures["lease_lost_"+l.name] = strconv.FormatInt(l.leaseLost, 10)
		}
	}
	c.Lost.Store(lost)
	c.Duplicated.Store(dupAfterAck + reexec)
	figures["lost_completed_records"] = strconv.FormatInt(lost, 10)
	figures["dup_after_ack"] = strconv.FormatInt(dupAfterAck, 10)
	figures["reexecuted_after_failed_do"] = strconv.FormatInt(reexec, 10)
	chaostest.Report(t, v.scenario, command, &c, figures)

	if v.mustKeep {
		if lost != 0 {
			t.Errorf("%d completed records acknowledged before a kill were lost after the restart, want 0 with %s", lost, v.scenario)
		}
		if dupAfterAck != 0 {
			t.Errorf("%d executions after the key's completion was acknowledged, want 0 with %s", dupAfterAck, v.scenario)
		}
	} else if v.mustLose && (lost == 0 || dupAfterAck == 0) {
		t.Errorf("negative control: %d lost records and %d executions after an acknowledgement, want both above 0", lost, dupAfterAck)
	} else if dupAfterAck > lost {
		// Without durability a lost record may run again, but a kept one
		// must not.
		t.Errorf("%d executions after an acknowledged completion, but only %d records were lost", dupAfterAck, lost)
	}
}

// keyState is what the test knows of one key.
type keyState struct {
	fences []int64 // the fence of each execution, in order
	acked  bool    // a Do returned success
	failed int     // Do calls that returned an error (outcome unknown)
}

// load runs Do on fresh keys from several goroutines through one client.
type load struct {
	t     *testing.T
	name  string
	exec  *idem.Executor
	store *redisstore.Store
	lease time.Duration
	c     *chaostest.Counters
	seq   atomic.Int64

	mu               sync.Mutex
	keys             map[string]*keyState
	acks             int64 // acknowledged keys
	roundAcks        int64 // acknowledged since the last restart
	errs             int64 // failed Do calls (in progress not counted)
	roundErrs        int64 // failed since the last kill
	leaseLost        int64
	resolvedByReplay int64 // a failed Do's retry replayed: the completion had happened
	dupAfterAck      int64 // executions of a key already acknowledged
	bad              []string
	restartedAt      time.Time
	reconnecting     bool
	reconnects       []time.Duration
}

func newLoad(t *testing.T, name string, store *redisstore.Store, lease time.Duration, c *chaostest.Counters) *load {
	exec, err := idem.New(store, idem.WithLease(lease))
	if err != nil {
		t.Fatal(err)
	}
	return &load{t: t, name: name, exec: exec, store: store, lease: lease, c: c, keys: make(map[string]*keyState)}
}

func goRedisStore(t *testing.T, addr string, opts []redisstore.Option) *redisstore.Store {
	// The library's default retries are kept: that is how users run it.
	// A call that waits for WAITAOF holds its connection meanwhile: the
	// default pool (10 per CPU) would let 20 of the WAITAOF variant's
	// goroutines wait at a time.
	return chaostest.GoRedisStore(t, redis.NewClient(&redis.Options{Addr: addr, DialTimeout: 500 * time.Millisecond, PoolSize: waitAOFWorkers}), opts...)
}

func rueidisStore(t *testing.T, addr string, opts []redisstore.Option) *redisstore.Store {
	s, _ := chaostest.RueidisStore(t, rueidis.ClientOption{
		InitAddress: []string{addr}, DisableCache: true,
		Dialer: net.Dialer{Timeout: 500 * time.Millisecond},
	}, opts...)
	return s
}

func (l *load) key(id string) idem.Key { return idem.Key{Scope: "redisrestart/" + l.name, ID: id} }

// run resolves fresh keys until stop is closed; the key in hand is always
// resolved first.
func (l *load) run(stop <-chan struct{}) {
	for {
		select {
		case <-stop:
			return
		default:
		}
		l.resolve(strconv.FormatInt(l.seq.Add(1), 10))
	}
}

// resolve calls Do on id until a call succeeds, as a client that retries
// with the same idempotency key does.
func (l *load) resolve(id string) {
	deadline := time.Now().Add(waitLimit)
	for {
		l.c.Attempted.Add(1)
		ctx, cancel := context.WithTimeout(context.Background(), doTimeout)
		res, err := l.exec.Do(ctx, l.key(id), "fp", func(ctx context.Context) ([]byte, error) {
			return l.execute(ctx, id), nil
		})
		cancel()
		if err == nil {
			l.ack(id, res)
			return
		}
		var ip *idem.InProgressError
		if errors.As(err, &ip) {
			// Held by an earlier attempt whose complete was lost: wait for
			// its lease, as the error says.
			time.Sleep(min(max(ip.RetryAfter, time.Millisecond), l.lease))
		} else {
			l.failed(id, err)
			time.Sleep(retryPause)
		}
		if time.Now().After(deadline) {
			l.mu.Lock()
			l.bad = append(l.bad, fmt.Sprintf("key %s unresolved after %v: %v", id, waitLimit, err))
			l.mu.Unlock()
			return
		}
	}
}

func (l *load) state(id string) *keyState {
	ks := l.keys[id]
	if ks == nil {
		ks = &keyState{}
		l.keys[id] = ks
	}
	return ks
}

// execute is the operation: it records its execution and fence.
func (l *load) execute(ctx context.Context, id string) []byte {
	fence, _ := idem.FenceFrom(ctx)
	l.mu.Lock()
	ks := l.state(id)
	if ks.acked {
		l.dupAfterAck++
	}
	ks.fences = append(ks.fences, fence)
	l.mu.Unlock()
	l.c.Executed.Add(1)
	l.c.Effects.Add(1)
	return []byte(id)
}

func (l *load) ack(id string, res idem.Result) {
	l.c.Acknowledged.Add(1)
	l.mu.Lock()
	defer l.mu.Unlock()
	ks := l.state(id)
	if string(res.Value) != id {
		l.bad = append(l.bad, fmt.Sprintf("key %s: Do returned %q", id, res.Value))
	}
	if res.Replayed && ks.failed > 0 && !ks.acked {
		l.resolvedByReplay++
	}
	ks.acked = true
	l.acks++
	l.roundAcks++
	if l.reconnecting {
		l.reconnecting = false
		l.reconnects = append(l.reconnects, time.Since(l.restartedAt))
	}
}

func (l *load) failed(id string, err error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.state(id).failed++
	l.errs++
	l.roundErrs++
	if errors.Is(err, idem.ErrLeaseLost) {
		l.leaseLost++
	}
	if !strings.HasPrefix(err.Error(), "idem: ") || errors.Unwrap(err) == nil {
		l.bad = append(l.bad, fmt.Sprintf("key %s: unwrapped error %v", id, err))
	}
}

func (l *load) killed() {
	l.mu.Lock()
	l.roundErrs = 0
	l.mu.Unlock()
}

func (l *load) restarted() {
	l.mu.Lock()
	l.roundAcks = 0
	l.restartedAt = time.Now()
	l.reconnecting = true
	l.mu.Unlock()
}

func (l *load) acksSinceRestart() int64 {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.roundAcks
}

func (l *load) acknowledged() int64 {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.acks
}

func (l *load) outageErrors() int64 {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.roundErrs
}

// checkResult is what check found for one load.
type checkResult struct {
	lost        int64 // acknowledged keys whose COMPLETED record is gone
	dupAfterAck int64 // executions after an acknowledgement
	reexecuted  int64 // executions beyond the first of keys never acknowledged before them
}

// check runs once the load has stopped. It reads back every acknowledged
// key, then calls Do on it again (which must replay unless the record was
// lost), and checks the executions of every key.
func (l *load) check(t *testing.T) checkResult {
	t.Helper()
	for _, b := range l.bad {
		t.Errorf("%s: %s", l.name, b)
	}
	var r checkResult
	ctx := t.Context()
	for id, ks := range l.keys {
		if !ks.acked {
			t.Errorf("%s: key %s was never acknowledged", l.name, id)
			continue
		}
		key := l.key(id)
		rec, err := l.store.Get(ctx, key.Digest())
		switch {
		case errors.Is(err, storekit.ErrNotFound):
			r.lost++
		case err != nil:
			t.Fatalf("%s: Get %s: %v", l.name, id, err)
		case rec.State != storekit.StateCompleted:
			r.lost++
		}
		executions := len(ks.fences)
		if executions == 0 {
			t.Errorf("%s: key %s was acknowledged without an execution", l.name, id)
		}
		for i := 1; i < executions; i++ {
			if ks.fences[i] <= ks.fences[i-1] {
				t.Errorf("%s: key %s executed with fences %v, want strictly increasing", l.name, id, ks.fences)
			}
		}
		if executions > 1 && ks.failed == 0 {
			t.Errorf("%s: key %s executed %d times although no Do on it failed", l.name, id, executions)
		}
	}
	// Every acknowledged key again: a replay, unless its record was lost.
	before := l.dupAfterAck
	for id := range l.keys {
		res, err := l.exec.Do(ctx, l.key(id), "fp", func(ctx context.Context) ([]byte, error) {
			return l.execute(ctx, id), nil
		})
		if err != nil {
			t.Fatalf("%s: final Do %s: %v", l.name, id, err)
		}
		if string(res.Value) != id {
			t.Errorf("%s: final Do %s returned %q", l.name, id, res.Value)
		}
	}
	if l.dupAfterAck-before > r.lost {
		t.Errorf("%s: %d keys executed again in the final pass, but only %d records were missing", l.name, l.dupAfterAck-before, r.lost)
	}
	r.dupAfterAck = l.dupAfterAck
	for _, ks := range l.keys {
		r.reexecuted += int64(len(ks.fences)) - 1
	}
	r.reexecuted -= r.dupAfterAck
	return r
}

func allLoads(loads []*load, f func(*load) bool) bool {
	for _, l := range loads {
		if !f(l) {
			return false
		}
	}
	return true
}

// waitFor polls cond until it holds, failing the test after waitLimit.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(waitLimit)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("no %s within %v", what, waitLimit)
		}
		time.Sleep(10 * time.Millisecond) // poll the load's counters
	}
}

// serverInfo returns the fields of INFO server, which must have a
// redis_version.
func serverInfo(t *testing.T, srv *redistest.Server) map[string]string {
	t.Helper()
	info := srv.Do(t, "INFO", "server")
	fields := redisinfo.Parse(info)
	if fields["redis_version"] == "" {
		t.Fatalf("INFO server has no redis_version:\n%s", info)
	}
	return fields
}

// checkWaitAOFRefused checks that on a server without WAITAOF a store
// configured with it is refused when it is built (a *VersionError), instead
// of pretending the write was durable.
func checkWaitAOFRefused(t *testing.T, srv *redistest.Server) {
	t.Helper()
	for _, err := range newWaitAOFStores(t, srv) {
		var ve *redisstore.VersionError
		if !errors.As(err, &ve) {
			t.Fatalf("a store with WithWaitAOF on a server without WAITAOF: got %v, want a *VersionError", err)
		}
	}
}

// checkEarlyWaitAOFRefused checks that on a server whose WAITAOF counts
// writes as fsynced before they are (redisstore.CheckWaitAOF), run with
// appendfsync everysec, a store configured with WithWaitAOF is refused (a
// *WaitAOFError).
func checkEarlyWaitAOFRefused(t *testing.T, srv *redistest.Server) {
	t.Helper()
	for _, err := range newWaitAOFStores(t, srv) {
		var we *redisstore.WaitAOFError
		if !errors.As(err, &we) {
			t.Fatalf("a store with WithWaitAOF on a server whose WAITAOF acknowledges early: got %v, want a *WaitAOFError", err)
		}
	}
}

// newWaitAOFStores builds a store with WithWaitAOF on each client library
// and returns their errors.
func newWaitAOFStores(t *testing.T, srv *redistest.Server) []error {
	t.Helper()
	aof := redisstore.WithWaitAOF(1, 0, time.Second)
	_, grErr := redisstore.New(srv.GoRedis(t), aof)
	_, ruErr := redisstore.NewRueidis(srv.Rueidis(t), aof)
	return []error{grErr, ruErr}
}

// quietLogger drops go-redis's log lines.
type quietLogger struct{}

func (quietLogger) Printf(context.Context, string, ...any) {}
