package failover

import (
	"testing"
	"time"

	"github.com/idemgo/idem"
	"github.com/idemgo/idem/chaos/chaostest"
	"github.com/idemgo/idem/testkit/redistest"
	"github.com/redis/go-redis/v9"
)

// fault is what happens to the deployment once the load runs; it returns
// once the Sentinels promoted a replica (and the old primary is back as a
// replica where it survives).
type fault struct {
	name string
	// inject injects the fault, calling mark at its moment (the kill, the
	// stop), and returns once a replica is promoted.
	inject func(t *testing.T, s *redistest.Sentinel, mark func())
}

var faults = []fault{
	{"kill", func(t *testing.T, s *redistest.Sentinel, mark func()) {
		old := s.Primary()
		old.Kill(t)
		mark()
		s.WaitFailover(t, old)
	}},
	{"pause", func(t *testing.T, s *redistest.Sentinel, mark func()) {
		old := s.Primary()
		old.Pause(t)
		mark()
		s.WaitFailover(t, old)
		old.Resume(t)
	}},
}

// TestSentinelFailover runs every fault with every durability setting.
func TestSentinelFailover(t *testing.T) {
	fs := faults
	if !chaostest.Long() {
		fs = faults[:1] // kill; make chaos-long adds the pause
	}
	for _, f := range fs {
		for _, d := range durabilities {
			t.Run(f.name+"/"+d.name, func(t *testing.T) { runSentinel(t, f, d) })
		}
	}
}

func runSentinel(t *testing.T, f fault, d durability) {
	s := redistest.StartSentinel(t, 2)
	rdb := redis.NewFailoverClient(&redis.FailoverOptions{
		MasterName: s.MasterName, SentinelAddrs: s.SentinelAddrs(),
		ReadTimeout: time.Second, WriteTimeout: time.Second, DialTimeout: time.Second,
	})
	t.Cleanup(func() { rdb.Close() })
	store := chaostest.GoRedisStore(t, rdb, d.opts...)
	exec, err := idem.New(store, idem.WithLease(lease))
	if err != nil {
		t.Fatal(err)
	}
	retry, err := idem.New(chaostest.GoRedisStore(t, rdb), idem.WithLease(lease))
	if err != nil {
		t.Fatal(err)
	}
	l := newLoad(&client{name: "go-redis", exec: exec})
	l.start(t)
	time.Sleep(time.Duration(chaostest.Size(1, 5)) * time.Second) // load before the fault
	f.inject(t, s, l.markFault)
	// Load after the failover, until a Do that started after the fault
	// succeeded and for a while more. With WithWait(2, …) and one replica
	// left none may succeed: that is measured too.
	l.awaitRecovery()
	time.Sleep(time.Duration(chaostest.Size(1, 5)) * time.Second) // load after recovery
	l.halt()

	// Every acknowledged key must still be COMPLETED; a retry of each must
	// replay, not run.
	lost, acked := l.verify(t, store, retry)
	chaostest.Report(t, "Sentinel failover, "+f.name+", "+d.name, "make chaos-long RUN='TestSentinelFailover/"+f.name+"/"+d.name+"'", &l.c, l.figures(lost, acked))
	if d.name != "none" && f.name != "pause" && lost != 0 {
		t.Errorf("%s with %s: %d acknowledged completions lost, want 0: the promoted replica has every write that enough replicas acknowledged", f.name, d.name, lost)
	}
}
