package failover

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idemgo/idem"
	"github.com/idemgo/idem/chaos/chaostest"
	"github.com/idemgo/idem/internal/redistest"
	"github.com/idemgo/idem/redisstore"
	"github.com/redis/go-redis/v9"
)

const (
	// recoveryLimit bounds the wait for a successful Do after the fault.
	recoveryLimit = 20 * time.Second
	lease         = 2 * time.Second
	waitTimeout   = 500 * time.Millisecond
	workers       = 8
)

// durability is a store configuration of the scenario.
type durability struct {
	name string
	opts []redisstore.Option
}

var durabilities = []durability{
	{"none", nil},
	{"wait1", []redisstore.Option{redisstore.WithWait(1, waitTimeout)}},
	{"wait2", []redisstore.Option{redisstore.WithWait(2, waitTimeout)}},
}

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

// load is the Do load of one run.
type load struct {
	exec  *idem.Executor
	retry *idem.Executor // on a store without a durability option: the verification's retries
	c     chaostest.Counters

	mu       sync.Mutex
	runs     map[string]int  // executions per key
	acked    map[string]bool // keys whose Do returned nil
	errs     int64
	notDur   int64
	faultAt  atomic.Int64 // unix nanos of the fault, 0 before
	recovery atomic.Int64 // nanos from the fault to the first success started after it
}

func (l *load) key(id int) idem.Key { return idem.Key{Scope: "failover", ID: strconv.Itoa(id)} }

func (l *load) do(ctx context.Context, id int) error { return l.doWith(ctx, l.exec, id) }

func (l *load) doWith(ctx context.Context, exec *idem.Executor, id int) error {
	key := l.key(id)
	_, err := exec.Do(ctx, key, "", func(context.Context) ([]byte, error) {
		l.mu.Lock()
		l.runs[key.ID]++
		l.mu.Unlock()
		l.c.Executed.Add(1)
		return []byte("done " + key.ID), nil
	})
	return err
}

func (l *load) run(ctx context.Context, next *atomic.Int64) {
	for ctx.Err() == nil {
		id := int(next.Add(1))
		start := time.Now()
		cctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		err := l.do(cctx, id)
		cancel()
		if ctx.Err() != nil && err != nil {
			return // stopped mid-call: not counted
		}
		l.c.Attempted.Add(1)
		if err != nil {
			l.mu.Lock()
			l.errs++
			if errors.Is(err, idem.ErrNotDurable) {
				l.notDur++
			}
			l.mu.Unlock()
			continue
		}
		l.c.Acknowledged.Add(1)
		l.mu.Lock()
		l.acked[l.key(id).ID] = true
		l.mu.Unlock()
		if f := l.faultAt.Load(); f != 0 && start.UnixNano() > f {
			l.recovery.CompareAndSwap(0, time.Since(time.Unix(0, f)).Nanoseconds())
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
	l := &load{exec: exec, retry: retry, runs: make(map[string]int), acked: make(map[string]bool)}

	ctx, stop := context.WithCancel(t.Context())
	var next atomic.Int64
	var wg sync.WaitGroup
	for range workers {
		wg.Go(func() { l.run(ctx, &next) })
	}
	warm := time.Duration(chaostest.Size(1, 5)) * time.Second
	time.Sleep(warm) // load before the fault
	f.inject(t, s, func() { l.faultAt.Store(time.Now().UnixNano()) })
	// Load after the failover, until a Do that started after the fault
	// succeeded and for a while more. With WithWait(2, …) and one replica
	// left none may succeed: that is measured too.
	deadline := time.Now().Add(recoveryLimit)
	for l.recovery.Load() == 0 && time.Now().Before(deadline) {
		time.Sleep(20 * time.Millisecond) // poll the load's first success
	}
	time.Sleep(time.Duration(chaostest.Size(1, 5)) * time.Second) // load after recovery
	stop()
	wg.Wait()
	recovery := time.Duration(l.recovery.Load()).Round(time.Millisecond).String()
	if l.recovery.Load() == 0 {
		recovery = "none within " + recoveryLimit.String()
	}

	// Every acknowledged key must still be COMPLETED; a retry of each must
	// replay, not run.
	l.mu.Lock()
	acked := make([]string, 0, len(l.acked))
	for k := range l.acked {
		acked = append(acked, k)
	}
	l.mu.Unlock()
	lostKeys := 0
	for _, id := range acked {
		rec, err := store.Get(t.Context(), l.key(atoi(t, id)).Digest())
		if err != nil || rec.State != idem.StateCompleted {
			lostKeys++
		}
	}
	l.c.Lost.Store(int64(lostKeys))
	runsBefore := l.c.Executed.Load()
	var rw sync.WaitGroup
	for w := range workers {
		rw.Go(func() {
			for i := w; i < len(acked); i += workers {
				retryUntilDone(t, l, atoi(t, acked[i]))
			}
		})
	}
	rw.Wait()
	l.c.Duplicated.Store(l.c.Executed.Load() - runsBefore)
	l.c.Effects.Store(l.c.Executed.Load())

	chaostest.Report(t, "Sentinel failover, "+f.name+", "+d.name, "make chaos-long RUN='TestSentinelFailover/"+f.name+"/"+d.name+"'", &l.c, map[string]string{
		"errors surfaced": strconv.FormatInt(l.errs, 10),
		"ErrNotDurable":   strconv.FormatInt(l.notDur, 10),
		"recovery":        recovery,
		"acked lost":      fmt.Sprintf("%d of %d", lostKeys, len(acked)),
	})
	if d.name != "none" && f.name != "pause" && lostKeys != 0 {
		t.Errorf("%s with %s: %d acknowledged completions lost, want 0: the promoted replica has every write that enough replicas acknowledged", f.name, d.name, lostKeys)
	}
}

// retryUntilDone repeats the Do of key id, as a caller told of success
// never would, until it is no longer in progress (a record whose complete
// was lost stays IN_PROGRESS until its lease ends).
func retryUntilDone(t *testing.T, l *load, id int) {
	deadline := time.Now().Add(lease + 10*time.Second)
	for {
		ctx, cancel := context.WithTimeout(t.Context(), 5*time.Second)
		err := l.doWith(ctx, l.retry, id)
		cancel()
		if !errors.Is(err, idem.ErrInProgress) {
			return
		}
		if time.Now().After(deadline) {
			t.Errorf("key %d still in progress after %v", id, lease+10*time.Second)
			return
		}
		time.Sleep(50 * time.Millisecond) // poll until the lease of the lost attempt ends
	}
}

func atoi(t *testing.T, s string) int {
	n, err := strconv.Atoi(s)
	if err != nil {
		t.Fatal(err)
	}
	return n
}
