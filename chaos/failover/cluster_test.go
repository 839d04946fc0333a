package failover

import (
	"context"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/idemgo/idem"
	"github.com/idemgo/idem/chaos/chaostest"
	"github.com/idemgo/idem/testkit/redistest"
	"github.com/redis/go-redis/v9"
	"github.com/redis/rueidis"
)

// clusterNodeTimeout is the Cluster's cluster-node-timeout: how long a
// master must not answer before its replica is promoted.
const clusterNodeTimeout = "2000"

// TestClusterFailover kills a master of a 3-master Redis Cluster with one
// replica each under Do load through both clients (go-redis ClusterClient
// and rueidis), with no durability option and with WithWait(1, …).
// The "rejoin" variant (make chaos-long) restarts the killed master after
// the promotion: it rejoins as the promoted master's replica, which ends the
// window in which WithWait(1, …) cannot acknowledge.
func TestClusterFailover(t *testing.T) {
	faults := []string{"kill"}
	if chaostest.Long() {
		faults = append(faults, "rejoin")
	}
	for _, f := range faults {
		for _, d := range durabilities[:2] {
			t.Run(f+"/"+d.name, func(t *testing.T) { runCluster(t, f, d) })
		}
	}
}

func runCluster(t *testing.T, fault string, d durability) {
	c := redistest.StartClusterReplicas(t, 3, 1, "--cluster-node-timeout", clusterNodeTimeout)
	addrs := c.Addrs()
	newGoRedis := func() *redis.ClusterClient {
		return redis.NewClusterClient(&redis.ClusterOptions{
			Addrs: addrs, DialTimeout: time.Second, ReadTimeout: time.Second, WriteTimeout: time.Second,
		})
	}
	ruOpt := rueidis.ClientOption{
		InitAddress: addrs, DisableCache: true,
		Dialer: net.Dialer{Timeout: time.Second}, ConnWriteTimeout: time.Second,
	}
	grStore := chaostest.GoRedisStore(t, newGoRedis(), d.opts...)
	ruStore, _ := chaostest.RueidisStore(t, ruOpt, d.opts...)
	var clients []*client
	for _, cl := range []struct {
		name  string
		store idem.Store
	}{{"go-redis", grStore}, {"rueidis", ruStore}} {
		exec, err := idem.New(cl.store, idem.WithLease(lease))
		if err != nil {
			t.Fatal(err)
		}
		clients = append(clients, &client{name: cl.name, exec: exec})
	}
	// The verification's own clients, without a durability option, made
	// before the fault: they must follow the promotion too.
	checkClient := newGoRedis()
	checkStore := chaostest.GoRedisStore(t, checkClient)
	retry, err := idem.New(checkStore, idem.WithLease(lease))
	if err != nil {
		t.Fatal(err)
	}

	l := newLoad(clients...)
	l.start(t)
	time.Sleep(time.Duration(chaostest.Size(1, 5)) * time.Second) // load before the fault
	old := c.Masters()[0]
	dead := ownSlots(t, old)
	l.affected = func(k idem.Key) bool { return dead[chaostest.KeySlot(k)] }
	old.Kill(t)
	l.markFault()
	start := time.Now()
	promoted := c.WaitFailover(t, old)
	failover := time.Since(start)
	var rejoined time.Duration
	if fault == "rejoin" {
		old.Restart(t)
		c.WaitOK(t) // every node ok, the old master a connected replica
		rejoined = time.Since(start)
	}
	// Both clients must reach the promoted master: a Do started after the
	// kill succeeds through each.
	if !l.awaitRecovery() {
		t.Errorf("not every client had an answer (success or ErrNotDurable) on a key of the killed master within %v of the kill (cluster ok, %s promoted, after %v): %s; after the kill: %s",
			recoveryLimit, promoted.Addr(), failover.Round(time.Millisecond), l.reachedTimes(), l.errorsAfter())
	}
	time.Sleep(time.Duration(chaostest.Size(1, 5)) * time.Second) // load after recovery
	l.halt()
	// The verification's client was idle since the kill: go-redis reloads
	// its slot map on MOVED, not on a refused dial, so it would send a third
	// of the reads to the dead node. Refresh it as an application would
	// after a failover it was told of.
	ctx, cancel := context.WithTimeout(context.Background(), callTimeout)
	checkClient.ReloadState(ctx)
	cancel()

	lost, acked := l.verify(t, checkStore, retry)
	figures := l.figures(lost, acked)
	figures["promotion"] = failover.Round(time.Millisecond).String()
	scenario := "Cluster failover, kill a master, " + d.name
	if fault == "rejoin" {
		figures["rejoined as a replica"] = rejoined.Round(time.Millisecond).String()
		scenario = "Cluster failover, kill a master and restart it, " + d.name
	}
	chaostest.Report(t, scenario, "make chaos-long RUN='TestClusterFailover/"+fault+"/"+d.name+"'", &l.c, figures)
	if fault == "rejoin" {
		for _, cl := range l.clients {
			if cl.recovery.Load() == 0 {
				t.Errorf("%s: no Do on a key of the killed master succeeded after it rejoined as a replica: %s", cl.name, l.errorsAfter())
			}
		}
	}
	if d.name != "none" && lost != 0 {
		t.Errorf("kill with %s: %d acknowledged completions lost, want 0: the promoted replica has every write WAIT counted", d.name, lost)
	}
}

// ownSlots returns the slots n serves, from its own line of CLUSTER NODES
// ("<id> <addr> myself,master - … <first>-<last> <slot> …").
func ownSlots(t *testing.T, n *redistest.Server) map[int]bool {
	t.Helper()
	out := make(map[int]bool)
	for line := range strings.Lines(n.Do(t, "CLUSTER", "NODES")) {
		fields := strings.Fields(line)
		if len(fields) < 8 || !strings.Contains(fields[2], "myself") {
			continue
		}
		for _, r := range fields[8:] {
			if strings.HasPrefix(r, "[") {
				continue // a slot being migrated
			}
			first, last, ok := strings.Cut(r, "-")
			if !ok {
				last = first
			}
			for s := atoi(t, first); s <= atoi(t, last); s++ {
				out[s] = true
			}
		}
	}
	if len(out) == 0 {
		t.Fatalf("%s serves no slot", n.Addr())
	}
	return out
}
