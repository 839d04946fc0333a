package reshard

import (
	"context"
	"errors"
	"fmt"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idemgo/idem"
	"github.com/idemgo/idem/chaos/chaostest"
	"github.com/idemgo/idem/redisstore"
	"github.com/idemgo/idem/storekit"
	"github.com/idemgo/idem/testkit/redistest"
	"github.com/redis/go-redis/v9"
	"github.com/redis/rueidis"
)

const (
	// slots is the number of hash slots of a Redis Cluster.
	slots = 16384
	// lease is the Executor's lease. An execution whose complete failed
	// would be taken over (and run again) after it, which the execution
	// count would show.
	lease = 2 * time.Second
	// doTimeout bounds one Do call.
	doTimeout = 10 * time.Second
	// waitLimit bounds every wait on a condition; generous, as the machine
	// may be loaded.
	waitLimit = 90 * time.Second
	// reshardTimeout bounds one redis-cli --cluster reshard.
	reshardTimeout = 3 * time.Minute
	// groups is the number of key sequences run at once.
	groups = 4
	// racers is the number of goroutines that run each key at the same
	// time: half through go-redis, half through rueidis.
	racers = 4
	// pollPause is how long a caller that found the key in progress waits
	// before asking again: the owner's operation takes about a millisecond.
	pollPause = 2 * time.Millisecond
	// work is how long the operation takes, so that the records are in
	// progress while their slot moves.
	work = 500 * time.Microsecond
)

// TestClusterReshard is scenario 9. It starts a 3-master Redis Cluster and
// runs load through a go-redis ClusterClient and a rueidis cluster client:
// 4 sequences of keys, each key run by 4 goroutines at once (two per client),
// each retrying until its Do is acknowledged. While the load runs it
// injects two slot migrations with redis-cli --cluster reshard (node 1 to
// node 2, then node 2 to node 3; 2,000 slots each in the short variant,
// 5,000 in the long one), so that records move between nodes while they are
// in progress, completed, or being acquired. It asserts that every key was
// executed exactly once and acknowledged to every racer with its own value,
// that the slots did move (and keys with them), and that no caller saw a
// MOVED or ASK error (the clients must follow redirections). Other errors
// are counted and reported.
func TestClusterReshard(t *testing.T) {
	cluster := redistest.StartCluster(t, 3)
	nodes := cluster.Nodes()
	ids := make([]string, len(nodes))
	for i, n := range nodes {
		ids[i] = n.Do(t, "CLUSTER", "MYID")
	}
	addrs := cluster.Addrs()

	gr := redis.NewClusterClient(&redis.ClusterOptions{Addrs: addrs})
	grStore := chaostest.GoRedisStore(t, gr)
	ruStore, _ := chaostest.RueidisStore(t, rueidis.ClientOption{InitAddress: addrs, DisableCache: true})
	checkSlotFunction(t, gr)

	r := &run{
		minKeys: chaostest.Size(400, 4000),
		execs:   make(map[string]int),
		started: make(map[string]int),
		acks:    make(map[string]int),
		errs:    make(map[string]int),
		example: make(map[string]string),
		clients: []*client{{name: "go-redis", store: grStore}, {name: "rueidis", store: ruStore}},
	}
	for _, c := range r.clients {
		var err error
		if c.exec, err = idem.New(c.store, idem.WithLease(lease)); err != nil {
			t.Fatal(err)
		}
	}

	before := slotOwners(t, gr)
	var wg sync.WaitGroup
	for g := range groups {
		for i := range racers {
			wg.Go(func() { r.worker(g, r.clients[i%len(r.clients)]) })
		}
	}
	stopped := false
	defer func() {
		if !stopped {
			r.reshardsDone.Store(true)
			r.abort.Store(true)
			wg.Wait()
		}
	}()

	// Move slots only once the load is running.
	waitFor(t, "the load to start", func() bool { return r.c.Acknowledged.Load() >= 100 })
	n := chaostest.Size(2000, 5000)
	start := time.Now()
	reshard(t, addrs[0], ids[0], ids[1], n)
	afterFirst := time.Since(start)
	mid := slotOwners(t, gr)
	ackedDuringFirst := r.c.Acknowledged.Load()
	reshard(t, addrs[1], ids[1], ids[2], n)
	reshardTime := time.Since(start)
	r.reshardsDone.Store(true)
	wg.Wait()
	stopped = true
	after := slotOwners(t, gr)

	moved := movedSlots(before, mid) + movedSlots(mid, after)
	if moved < 2*n {
		t.Errorf("%d slots changed owner, want at least %d", moved, 2*n)
	}
	// Assert on every key: one execution, and its racers all acknowledged.
	var keysMoved int
	for id := range r.started {
		execs := r.execs[id]
		if execs != 1 {
			t.Errorf("key %s executed %d times, want 1", id, execs)
			r.c.Duplicated.Add(int64(max(execs-1, 0)))
		}
		slot := keySlot(id)
		if before[slot] != mid[slot] || mid[slot] != after[slot] {
			keysMoved++
		}
	}
	for _, b := range r.bad {
		t.Error(b)
	}
	for id, n := range r.started {
		if r.acks[id] != n {
			t.Errorf("key %s: %d of its %d racers got an acknowledgement", id, r.acks[id], n)
		}
	}
	if keysMoved == 0 {
		t.Error("no key lived in a moved slot: the scenario did not test a migration")
	}
	for _, c := range r.clients {
		for _, kind := range []string{"MOVED", "ASK"} {
			class := c.name + "_" + kind
			if n := r.errs[class]; n > 0 {
				t.Errorf("%d Do calls through %s failed with %s (e.g. %s): the client did not follow the redirection", n, c.name, kind, r.example[class])
			}
		}
	}
	// A record read after the moves: every key is COMPLETED where it lives now.
	for id := range r.started {
		rec, err := grStore.Get(t.Context(), idem.Key{Scope: "reshard", ID: id}.Digest())
		if err != nil || rec.State != storekit.StateCompleted {
			t.Errorf("key %s after the reshards: %+v, %v, want COMPLETED", id, rec.State, err)
		}
	}

	figures := map[string]string{
		"slots_moved":            strconv.Itoa(moved),
		"reshards":               "2 (node 1 → 2, node 2 → 3)",
		"reshard_time":           reshardTime.Round(time.Millisecond).String(),
		"first_reshard_time":     afterFirst.Round(time.Millisecond).String(),
		"keys":                   strconv.Itoa(len(r.started)),
		"keys_in_moved_slots":    strconv.Itoa(keysMoved),
		"racers_per_key":         strconv.Itoa(racers),
		"acked_by_first_reshard": strconv.FormatInt(ackedDuringFirst, 10),
		"in_progress_retries":    strconv.FormatInt(r.inProgress.Load(), 10),
		"errors":                 strconv.Itoa(r.errorCount()),
	}
	for class, n := range r.errs {
		figures["errors_"+class] = strconv.Itoa(n)
	}
	redirects := errorStats(t, nodes)
	figures["redirects_MOVED"] = strconv.Itoa(redirects["MOVED"])
	figures["redirects_ASK"] = strconv.Itoa(redirects["ASK"])
	if redirects["MOVED"]+redirects["ASK"] == 0 {
		t.Error("the nodes sent no MOVED or ASK reply: no call met a moved slot")
	}
	chaostest.Report(t, "cluster reshard under load", "make chaos-long RUN=TestClusterReshard", &r.c, figures)
	for class, ex := range r.example {
		t.Logf("first %s error: %s", class, ex)
	}
}

// client is one client library's store and executor.
type client struct {
	name  string
	store *redisstore.Store
	exec  *idem.Executor
}

// run is the shared state of the load.
type run struct {
	c            chaostest.Counters
	clients      []*client
	minKeys      int
	reshardsDone atomic.Bool
	abort        atomic.Bool
	inProgress   atomic.Int64

	mu      sync.Mutex
	execs   map[string]int    // executions per key ID
	started map[string]int    // racers that ran the key
	acks    map[string]int    // acknowledgements per key
	errs    map[string]int    // failed Do calls per error class
	example map[string]string // the first error of each class
	bad     []string
}

// worker runs group g's keys, in order, through c, until the reshards are
// over and it has run at least minKeys keys. The other racers of the group
// run the same keys at the same time.
func (r *run) worker(g int, c *client) {
	for i := 0; !r.abort.Load() && (i < r.minKeys || !r.reshardsDone.Load()); i++ {
		r.resolve(c, fmt.Sprintf("%d-%d", g, i))
	}
}

// resolve calls Do on id until it is acknowledged.
func (r *run) resolve(c *client, id string) {
	key := idem.Key{Scope: "reshard", ID: id}
	r.mu.Lock()
	r.started[id]++
	r.mu.Unlock()
	deadline := time.Now().Add(waitLimit)
	for !r.abort.Load() {
		r.c.Attempted.Add(1)
		ctx, cancel := context.WithTimeout(context.Background(), doTimeout)
		res, err := c.exec.Do(ctx, key, "fp", func(context.Context) ([]byte, error) {
			r.mu.Lock()
			r.execs[id]++
			r.mu.Unlock()
			r.c.Executed.Add(1)
			r.c.Effects.Add(1)
			time.Sleep(work) // the operation's own work
			return []byte(id), nil
		})
		cancel()
		if err == nil {
			r.c.Acknowledged.Add(1)
			r.mu.Lock()
			r.acks[id]++
			r.mu.Unlock()
			if string(res.Value) != id {
				r.fail(fmt.Sprintf("%s: key %s: Do returned %q", c.name, id, res.Value))
			}
			return
		}
		var ip *idem.InProgressError
		if errors.As(err, &ip) {
			r.inProgress.Add(1)
			time.Sleep(pollPause)
		} else {
			r.mu.Lock()
			class := c.name + "_" + classify(err)
			r.errs[class]++
			if _, ok := r.example[class]; !ok {
				r.example[class] = err.Error()
			}
			r.mu.Unlock()
			time.Sleep(5 * time.Millisecond) // back off before retrying
		}
		if time.Now().After(deadline) {
			r.fail(fmt.Sprintf("%s: key %s not acknowledged within %v; last error: %v", c.name, id, waitLimit, err))
			return
		}
	}
}

func (r *run) fail(msg string) {
	r.mu.Lock()
	r.bad = append(r.bad, msg)
	r.mu.Unlock()
}

func (r *run) errorCount() int {
	n := 0
	for _, v := range r.errs {
		n += v
	}
	return n
}

// classify names the kind of a Do error, with each client library's own
// error type.
func classify(err error) string {
	var re *rueidis.RedisError
	if errors.As(err, &re) {
		if _, ok := re.IsMoved(); ok {
			return "MOVED"
		}
		if _, ok := re.IsAsk(); ok {
			return "ASK"
		}
		if re.IsTryAgain() {
			return "TRYAGAIN"
		}
		if re.IsClusterDown() {
			return "CLUSTERDOWN"
		}
		return "redis_error"
	}
	for _, p := range []string{"MOVED", "ASK", "TRYAGAIN", "CLUSTERDOWN"} {
		if redis.HasErrorPrefix(err, p) {
			return p
		}
	}
	var ge redis.Error
	if errors.As(err, &ge) {
		return "redis_error"
	}
	if errors.Is(err, context.DeadlineExceeded) {
		return "timeout"
	}
	return "other"
}

// reshard moves n slots from the node with ID from to the node with ID to.
func reshard(t *testing.T, addr, from, to string, n int) {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), reshardTimeout)
	defer cancel()
	args := []string{"--cluster", "reshard", addr,
		"--cluster-from", from, "--cluster-to", to,
		"--cluster-slots", strconv.Itoa(n), "--cluster-yes"}
	out, err := exec.CommandContext(ctx, "redis-cli", args...).CombinedOutput()
	if err != nil {
		t.Fatalf("redis-cli %s: %v\n%s", strings.Join(args, " "), err, tail(string(out), 20))
	}
}

func tail(s string, lines int) string {
	l := strings.Split(strings.TrimRight(s, "\n"), "\n")
	if len(l) > lines {
		l = l[len(l)-lines:]
	}
	return strings.Join(l, "\n")
}

// slotOwners returns the ID of the primary of every slot.
func slotOwners(t *testing.T, c *redis.ClusterClient) [slots]string {
	t.Helper()
	var owners [slots]string
	ranges, err := c.ClusterSlots(t.Context()).Result()
	if err != nil {
		t.Fatalf("CLUSTER SLOTS: %v", err)
	}
	for _, r := range ranges {
		for s := r.Start; s <= r.End; s++ {
			owners[s] = r.Nodes[0].ID
		}
	}
	for s, o := range owners {
		if o == "" {
			t.Fatalf("slot %d has no owner", s)
		}
	}
	return owners
}

func movedSlots(a, b [slots]string) int {
	n := 0
	for s := range a {
		if a[s] != b[s] {
			n++
		}
	}
	return n
}

// keySlot returns the slot of the record of key ID id.
func keySlot(id string) int {
	return chaostest.KeySlot(idem.Key{Scope: "reshard", ID: id})
}

// checkSlotFunction checks keySlot against the server's CLUSTER KEYSLOT for
// a few keys, so that the count of keys in moved slots is right.
func checkSlotFunction(t *testing.T, c *redis.ClusterClient) {
	t.Helper()
	s, err := redisstore.New(c)
	if err != nil {
		t.Fatal(err)
	}
	for i := range 20 {
		id := "check-" + strconv.Itoa(i)
		name := s.Key(idem.Key{Scope: "reshard", ID: id}.Digest())
		want, err := c.ClusterKeySlot(t.Context(), name).Result()
		if err != nil {
			t.Fatal(err)
		}
		if got := keySlot(id); int64(got) != want {
			t.Fatalf("keySlot(%s) = %d, CLUSTER KEYSLOT %s = %d", id, got, name, want)
		}
	}
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

// errorStats sums the errorstat_<KIND> counts of INFO errorstats over the
// nodes: how many MOVED and ASK replies the nodes sent, which the clients
// had to follow.
func errorStats(t *testing.T, nodes []*redistest.Server) map[string]int {
	t.Helper()
	stats := make(map[string]int)
	for _, n := range nodes {
		for line := range strings.Lines(n.Do(t, "INFO", "errorstats")) {
			name, rest, ok := strings.Cut(strings.TrimSpace(line), ":")
			kind, isStat := strings.CutPrefix(name, "errorstat_")
			count, hasCount := strings.CutPrefix(rest, "count=")
			if !ok || !isStat || !hasCount {
				continue
			}
			v, err := strconv.Atoi(count)
			if err != nil {
				t.Fatalf("INFO errorstats on %s: bad line %q", n.Addr(), line)
			}
			stats[kind] += v
		}
	}
	return stats
}
