package failover

import (
	"strings"
	"testing"
	"time"

	"github.com/idemgo/idem"
	"github.com/idemgo/idem/chaos/chaostest"
	"github.com/idemgo/idem/testkit/redistest"
	"github.com/redis/go-redis/v9"
)

// healLimit bounds the wait for the old primary to rejoin as a replica
// once the partition heals.
const healLimit = 60 * time.Second

// TestSentinelPartition is Jepsen's Redis Sentinel case: the primary is cut
// off from its replicas and the Sentinels while its clients still reach it
// and keep writing, until the Sentinels promote a replica; then the
// partition heals and the old primary rejoins as a replica, dropping what
// it took alone. The replicas and the Sentinels reach the primary through
// an in-test TCP proxy, which the test closes; the clients connect to the
// primary directly.
//
// It is also the scenario's deterministic negative control: without a
// durability option every completion acknowledged during the partition
// exists on the old primary only, so the counters must see losses; with
// WithWait(1, …) the old primary has no replica to count, and every Do
// during the partition must end in ErrNotDurable instead, losing nothing.
func TestSentinelPartition(t *testing.T) {
	for _, d := range durabilities[:2] {
		t.Run(d.name, func(t *testing.T) { runPartition(t, d) })
	}
}

func runPartition(t *testing.T, d durability) {
	var cut *chaostest.NetProxy
	s := redistest.StartSentinelVia(t, 2, func(addr string) string {
		cut = chaostest.StartNetProxy(t, addr)
		return cut.Addr()
	})
	old := s.Data()[0]
	newClient := func(addr string) *redis.Client {
		return redis.NewClient(&redis.Options{
			Addr: addr, ReadTimeout: time.Second, WriteTimeout: time.Second, DialTimeout: time.Second,
		})
	}
	exec, err := idem.New(chaostest.GoRedisStore(t, newClient(old.Addr()), d.opts...), idem.WithLease(lease))
	if err != nil {
		t.Fatal(err)
	}
	l := newLoad(&client{name: "go-redis", exec: exec})
	l.start(t)
	time.Sleep(time.Duration(chaostest.Size(1, 5)) * time.Second) // load before the partition
	cut.Disable()
	l.markFault()
	start := time.Now()
	promoted := s.WaitFailover(t, old)
	promotion := time.Since(start)
	l.halt()
	cut.Enable(t)

	// The promoted replica is the primary now: read every acknowledged key
	// there, and retry it there.
	store := chaostest.GoRedisStore(t, newClient(promoted.Addr()))
	retry, err := idem.New(store, idem.WithLease(lease))
	if err != nil {
		t.Fatal(err)
	}
	lost, acked := l.verify(t, store, retry)
	healed := waitReplica(t, old)
	figures := l.figures(lost, acked)
	figures["promotion"] = promotion.Round(time.Millisecond).String()
	figures["old primary rejoined as a replica"] = healed
	chaostest.Report(t, "Sentinel partition of the primary, "+d.name, "make chaos-long RUN='TestSentinelPartition/"+d.name+"'", &l.c, figures)

	l.mu.Lock()
	duringCut, notDur := len(l.ackedAt), l.notDur
	l.mu.Unlock()
	switch d.name {
	case "none":
		if duringCut == 0 {
			t.Fatal("no Do was acknowledged by the cut-off primary: the scenario did not test a partition")
		}
		if lost == 0 {
			t.Errorf("no acknowledged completion lost although %d were acknowledged by the cut-off primary only: the counters cannot see a loss", duringCut)
		}
	default:
		if lost != 0 {
			t.Errorf("%d acknowledged completions lost with %s", lost, d.name)
		}
		if notDur == 0 {
			t.Error("no ErrNotDurable while the primary was cut off from its replicas")
		}
	}
}

// waitReplica waits, at most healLimit, until old answers as a replica (the
// Sentinels reconfigure it once they reach it again) and returns the time
// it took, or what it is instead.
func waitReplica(t *testing.T, old *redistest.Server) string {
	t.Helper()
	start := time.Now()
	var last string
	for time.Since(start) < healLimit {
		info, err := old.Command("INFO", "replication")
		if err == nil && strings.Contains(info, "role:slave") && strings.Contains(info, "master_link_status:up") {
			return time.Since(start).Round(time.Millisecond).String() + " after the verification started"
		}
		last = info
		if err != nil {
			last = err.Error()
		}
		time.Sleep(100 * time.Millisecond) // poll until the Sentinels reconfigure it
	}
	t.Errorf("the old primary %s is not a connected replica %v after the partition healed:\n%s", old.Addr(), healLimit, last)
	return "no, within " + healLimit.String()
}
