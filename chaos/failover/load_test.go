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
	"github.com/idemgo/idem/redisstore"
	"github.com/idemgo/idem/storekit"
)

const (
	// recoveryLimit bounds the wait for a successful Do after the fault.
	recoveryLimit = 20 * time.Second
	lease         = 2 * time.Second
	waitTimeout   = 500 * time.Millisecond
	workers       = 8
	// callTimeout bounds every Do and every verification read, so that a
	// client stuck on a dead node fails the test instead of hanging it.
	callTimeout = 5 * time.Second
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

// client is one client library's executor in the load.
type client struct {
	name string
	exec *idem.Executor
	// recovery is the nanos from the fault to this client's first success
	// of a Do that started after it (on an affected key); 0 before.
	recovery atomic.Int64
	// reached is the same for the first Do that succeeded or returned
	// ErrNotDurable: the store answered from the (new) primary, which did
	// the transition but had too few replicas to acknowledge it.
	reached atomic.Int64
	errs    atomic.Int64           // errors surfaced after the fault
	example atomic.Pointer[string] // the first of them
}

// load is the Do load of one run: workers share the key sequence, worker
// w calls Do through clients[w % len(clients)].
type load struct {
	clients []*client
	c       chaostest.Counters
	// affected, if set, says which keys the fault touches (on a Cluster:
	// those in the killed master's slots); only they count for recovery.
	affected func(idem.Key) bool

	mu      sync.Mutex
	runs    map[string]int  // executions per key
	acked   map[string]bool // keys whose Do returned nil
	ackedAt map[string]bool // keys acknowledged after the fault
	errs    int64
	notDur  int64

	faultAt atomic.Int64 // unix nanos of the fault, 0 before
	next    atomic.Int64
	stop    context.CancelFunc
	wg      sync.WaitGroup
}

func newLoad(clients ...*client) *load {
	return &load{clients: clients, runs: make(map[string]int), acked: make(map[string]bool), ackedAt: make(map[string]bool)}
}

func (l *load) key(id int) idem.Key { return idem.Key{Scope: "failover", ID: strconv.Itoa(id)} }

// markFault records the moment of the fault.
func (l *load) markFault() { l.faultAt.Store(time.Now().UnixNano()) }

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

// start starts the workers; the test's cleanup stops them if it ends
// first.
func (l *load) start(t *testing.T) {
	ctx, stop := context.WithCancel(context.Background())
	l.stop = stop
	for w := range workers {
		c := l.clients[w%len(l.clients)]
		l.wg.Go(func() { l.run(ctx, c) })
	}
	t.Cleanup(l.halt)
}

// halt stops the workers and waits for them.
func (l *load) halt() {
	l.stop()
	l.wg.Wait()
}

func (l *load) run(ctx context.Context, c *client) {
	for ctx.Err() == nil {
		id := int(l.next.Add(1))
		start := time.Now()
		cctx, cancel := context.WithTimeout(ctx, callTimeout)
		err := l.doWith(cctx, c.exec, id)
		cancel()
		if ctx.Err() != nil && err != nil {
			return // stopped mid-call: not counted
		}
		l.c.Attempted.Add(1)
		f := l.faultAt.Load()
		if err != nil {
			l.mu.Lock()
			l.errs++
			if errors.Is(err, idem.ErrNotDurable) {
				l.notDur++
			}
			if f != 0 && start.UnixNano() > f && errors.Is(err, idem.ErrNotDurable) && (l.affected == nil || l.affected(l.key(id))) {
				c.reached.CompareAndSwap(0, time.Since(time.Unix(0, f)).Nanoseconds())
			}
			if f != 0 {
				c.errs.Add(1)
				msg := err.Error()
				c.example.CompareAndSwap(nil, &msg)
			}
			l.mu.Unlock()
			continue
		}
		l.c.Acknowledged.Add(1)
		l.mu.Lock()
		l.acked[l.key(id).ID] = true
		if f != 0 && start.UnixNano() > f {
			l.ackedAt[l.key(id).ID] = true
		}
		l.mu.Unlock()
		if f != 0 && start.UnixNano() > f && (l.affected == nil || l.affected(l.key(id))) {
			c.recovery.CompareAndSwap(0, time.Since(time.Unix(0, f)).Nanoseconds())
			c.reached.CompareAndSwap(0, time.Since(time.Unix(0, f)).Nanoseconds())
		}
	}
}

// awaitRecovery waits, at most recoveryLimit, until every client had a Do
// that started after the fault succeed or return ErrNotDurable (see
// client.reached); it reports whether they all did.
func (l *load) awaitRecovery() bool {
	deadline := time.Now().Add(recoveryLimit)
	for time.Now().Before(deadline) {
		all := true
		for _, c := range l.clients {
			all = all && c.reached.Load() != 0
		}
		if all {
			return true
		}
		time.Sleep(20 * time.Millisecond) // poll the load's first successes
	}
	return false
}

// recovery returns each client's recovery time as a figure.
func (l *load) recovery() string { return l.times(func(c *client) int64 { return c.recovery.Load() }) }

// reachedTimes returns each client's reached time as a figure.
func (l *load) reachedTimes() string {
	return l.times(func(c *client) int64 { return c.reached.Load() })
}

func (l *load) times(get func(*client) int64) string {
	s := ""
	for i, c := range l.clients {
		if i > 0 {
			s += ", "
		}
		if len(l.clients) > 1 {
			s += c.name + " "
		}
		if r := get(c); r != 0 {
			s += time.Duration(r).Round(time.Millisecond).String()
		} else {
			s += "none within " + recoveryLimit.String()
		}
	}
	return s
}

// errorsAfter describes each client's errors after the fault.
func (l *load) errorsAfter() string {
	s := ""
	for _, c := range l.clients {
		s += fmt.Sprintf("%s: %d errors", c.name, c.errs.Load())
		if e := c.example.Load(); e != nil {
			s += " (first: " + *e + ")"
		}
		s += "; "
	}
	return s
}

// ackedKeys returns the acknowledged keys.
func (l *load) ackedKeys() []string {
	l.mu.Lock()
	defer l.mu.Unlock()
	out := make([]string, 0, len(l.acked))
	for k := range l.acked {
		out = append(out, k)
	}
	return out
}

// verify counts the acknowledged keys whose record, read through store with
// every read bounded by callTimeout, is not COMPLETED (Counters.Lost), then
// repeats the Do of each through retry, as a caller told of success never
// would, and counts the executions that causes (Counters.Duplicated). A
// read or retry that fails is a test error with its diagnostic.
func (l *load) verify(t *testing.T, store *redisstore.Store, retry *idem.Executor) (lost, acked int) {
	t.Helper()
	keys := l.ackedKeys()
	var readErrs int
	var firstErr error
	for _, id := range keys {
		ctx, cancel := context.WithTimeout(context.Background(), callTimeout)
		rec, err := store.Get(ctx, l.key(atoi(t, id)).Digest())
		cancel()
		switch {
		case err != nil && !errors.Is(err, storekit.ErrNotFound):
			readErrs++
			if firstErr == nil {
				firstErr = fmt.Errorf("key %s: %w", id, err)
			}
		case err != nil || rec.State != storekit.StateCompleted:
			lost++
		}
	}
	if readErrs > 0 {
		t.Errorf("%d of %d verification reads failed after the failover (first: %v): the client did not follow the new topology", readErrs, len(keys), firstErr)
	}
	l.c.Lost.Store(int64(lost))
	runsBefore := l.c.Executed.Load()
	var rw sync.WaitGroup
	var retryErrs atomic.Int64
	for w := range workers {
		rw.Go(func() {
			for i := w; i < len(keys); i += workers {
				if err := l.retryUntilDone(retry, atoi(t, keys[i])); err != nil && retryErrs.Add(1) == 1 {
					t.Errorf("retry of an acknowledged key: %v", err)
				}
			}
		})
	}
	rw.Wait()
	if n := retryErrs.Load(); n > 1 {
		t.Errorf("%d retries of acknowledged keys failed", n)
	}
	l.c.Duplicated.Store(l.c.Executed.Load() - runsBefore)
	l.c.Effects.Store(l.c.Executed.Load())
	return lost, len(keys)
}

// retryUntilDone repeats the Do of key id until it is no longer in
// progress (a record whose complete was lost stays IN_PROGRESS until its
// lease ends), within a bounded time.
func (l *load) retryUntilDone(retry *idem.Executor, id int) error {
	deadline := time.Now().Add(lease + 10*time.Second)
	for {
		ctx, cancel := context.WithTimeout(context.Background(), callTimeout)
		err := l.doWith(ctx, retry, id)
		cancel()
		if !errors.Is(err, idem.ErrInProgress) {
			if err != nil {
				return fmt.Errorf("key %d: %w", id, err)
			}
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("key %d still in progress after %v", id, lease+10*time.Second)
		}
		time.Sleep(50 * time.Millisecond) // poll until the lease of the lost attempt ends
	}
}

// figures are the figures every failover row reports.
func (l *load) figures(lost, acked int) map[string]string {
	l.mu.Lock()
	defer l.mu.Unlock()
	f := map[string]string{
		"errors surfaced":       strconv.FormatInt(l.errs, 10),
		"ErrNotDurable":         strconv.FormatInt(l.notDur, 10),
		"recovery":              l.recovery(),
		"answered":              l.reachedTimes(),
		"acked lost":            fmt.Sprintf("%d of %d", lost, acked),
		"acked after the fault": strconv.Itoa(len(l.ackedAt)),
	}
	return f
}

func atoi(t *testing.T, s string) int {
	n, err := strconv.Atoi(s)
	if err != nil {
		t.Fatal(err)
	}
	return n
}
