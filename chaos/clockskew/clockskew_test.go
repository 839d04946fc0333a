package clockskew

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/idemgo/idem"
	"github.com/idemgo/idem/boltstore"
	"github.com/idemgo/idem/chaos/chaostest"
	"github.com/idemgo/idem/idemhttp"
	"github.com/idemgo/idem/memstore"
	"github.com/idemgo/idem/observe"
	"github.com/idemgo/idem/storekit"
)

const (
	// waitLimit bounds every wait on a condition; generous, as the machine
	// may be loaded.
	waitLimit = 60 * time.Second
	// skew is the clock offset of the scenario.
	skew = time.Hour
	// The lease and retention of the store-clock scenarios: short, so that
	// expiry happens within the test.
	traceLease     = 500 * time.Millisecond
	traceRetention = 1500 * time.Millisecond
)

// TestClockSkew is scenario 6: "client clocks ±1 hour → no effect, because
// only server time is used". It runs two parts (see the package doc):
//
//   - redis_commands injects nothing but records every command the go-redis
//     and rueidis clients send during a full lifecycle, and asserts that no
//     argument is a timestamp other than a fence the server handed out (a
//     negative control proves the scan flags a client timestamp);
//   - store_clock_offset injects a store clock one hour behind and one hour
//     ahead of the process's clock into memstore and boltstore, runs the
//     lease, takeover, heartbeat, retention and HTTP 409 Retry-After
//     scenarios, and asserts that every outcome is identical to the run
//     without an offset.
//
// The long variant repeats the store scenarios 5 times per offset.
func TestClockSkew(t *testing.T) {
	var c chaostest.Counters
	figures := map[string]string{}
	t.Run("redis_commands", func(t *testing.T) { redisCommands(t, &c, figures) })
	t.Run("store_clock_offset", func(t *testing.T) { storeClockOffset(t, &c, figures) })
	if _, err := exec.LookPath("faketime"); err != nil {
		figures["redis_under_faketime"] = "not run (faketime not installed)"
	} else {
		figures["redis_under_faketime"] = "not run (not part of the suite)"
	}
	if t.Failed() {
		return
	}
	c.Effects.Store(c.Executed.Load()) // every execution is its effect; no sink
	chaostest.Report(t, "clock skew ±1h", "make chaos-long RUN=TestClockSkew", &c, figures)
}

// storeKind opens a store with the given clock.
type storeKind struct {
	name string
	open func(t *testing.T, clock func() time.Time) idem.Store
}

var storeKinds = []storeKind{
	{"memstore", func(t *testing.T, clock func() time.Time) idem.Store {
		s, err := memstore.New(memstore.WithClock(clock))
		if err != nil {
			t.Fatal(err)
		}
		return s
	}},
	{"boltstore", func(t *testing.T, clock func() time.Time) idem.Store {
		s, err := boltstore.Open(filepath.Join(t.TempDir(), "idem.db"), boltstore.WithClock(clock))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { s.Close() })
		return s
	}},
}

// storeClockOffset is the store-clock half of the scenario.
func storeClockOffset(t *testing.T, c *chaostest.Counters, figures map[string]string) {
	offsets := []time.Duration{-skew, 0, skew}
	rounds := chaostest.Size(1, 5)
	compared := 0
	for _, kind := range storeKinds {
		traces := make([][]string, len(offsets))
		t.Run(kind.name, func(t *testing.T) {
			for i, offset := range offsets {
				t.Run(fmt.Sprintf("offset%+v", offset), func(t *testing.T) {
					t.Parallel()
					for range rounds {
						clock := func() time.Time { return time.Now().Add(offset) }
						tr := trace(t, kind.open(t, clock), offset, c)
						if traces[i] != nil && !slices.Equal(traces[i], tr) {
							t.Errorf("two rounds with offset %v differ:\n%s\n---\n%s", offset, strings.Join(traces[i], "\n"), strings.Join(tr, "\n"))
						}
						traces[i] = tr
					}
				})
			}
		})
		if t.Failed() {
			return
		}
		want := traces[1] // no offset
		for i, offset := range offsets {
			if !slices.Equal(traces[i], want) {
				t.Errorf("%s: outcomes with the store clock %v off differ from no offset:\n%s\n--- without an offset:\n%s",
					kind.name, offset, strings.Join(traces[i], "\n"), strings.Join(want, "\n"))
			}
			compared++
		}
		figures["outcomes_per_trace"] = strconv.Itoa(len(want))
		t.Logf("%s outcomes, identical with the store clock -1h, 0 and +1h off:\n\t%s", kind.name, strings.Join(want, "\n\t"))
	}
	figures["store_traces_compared"] = fmt.Sprintf("%d (memstore, boltstore × offsets -1h, 0, +1h × %d rounds)", compared*rounds, rounds)
	figures["store_trace_differences"] = "0"
}

// trace runs the lease, takeover, heartbeat, retention and HTTP scenarios on
// s and returns their outcomes, one line each. The lines hold no time, only
// outcomes and comparisons, so that they can be compared across offsets.
func trace(t *testing.T, s idem.Store, offset time.Duration, c *chaostest.Counters) []string {
	t.Helper()
	ctx := t.Context()
	var out []string
	add := func(format string, args ...any) { out = append(out, fmt.Sprintf(format, args...)) }
	exec, err := idem.New(s, idem.WithLease(traceLease), idem.WithRetention(traceRetention))
	if err != nil {
		t.Fatal(err)
	}
	run := func(id string) (idem.Result, error) {
		c.Attempted.Add(1)
		res, err := exec.Do(ctx, idem.Key{ID: id}, "fp", func(context.Context) ([]byte, error) {
			c.Executed.Add(1)
			return []byte(id), nil
		})
		if err == nil {
			c.Acknowledged.Add(1)
		}
		return res, err
	}

	// The store's clock is the skewed one: checked, not compared.
	k1 := idem.Key{ID: "k1"}
	res, err := run("k1")
	add("k1 first Do: replayed=%v err=%v", res.Replayed, err)
	rec := get(t, s, k1.Digest())
	if d := rec.Now.Sub(time.Now().Add(offset)).Abs(); d > time.Minute {
		t.Fatalf("the store clock is %v off, want %v", rec.Now.Sub(time.Now()), offset)
	}
	res, err = run("k1")
	add("k1 second Do: replayed=%v value=%s err=%v", res.Replayed, res.Value, err)
	add("k1 record: state=%v created<=now=%v expires within the retention=%v fence within 1m of the store's µs=%v",
		rec.State, !rec.Created.After(rec.Now),
		rec.ExpiresAt.After(rec.Now) && rec.ExpiresAt.Sub(rec.Now) <= traceRetention,
		time.Duration(rec.Fence-rec.Now.UnixMicro()).Abs() < time.Minute/time.Microsecond)

	// In progress while held; taken over after the lease; the stale owner
	// is refused.
	k2 := idem.Key{ID: "k2"}
	_, stale, err := exec.Begin(ctx, k2, "fp")
	if err != nil {
		t.Fatal(err)
	}
	_, _, err = exec.Begin(ctx, k2, "fp")
	var ip *idem.InProgressError
	add("k2 while held: in progress=%v retry-after within the lease=%v",
		errors.As(err, &ip), ip != nil && ip.RetryAfter > 0 && ip.RetryAfter <= traceLease)
	if err := stale.Abandon(t.Context(), observe.Abandoned); err != nil {
		t.Fatal(err)
	}
	waitRecord(t, s, stale.Key(), "the end of the lease", func(r storekit.Record) bool { return r.Now.After(r.LeaseUntil) })
	_, owner, err := exec.Begin(ctx, k2, "fp")
	if err != nil {
		t.Fatal(err)
	}
	_, took := owner.TakenOver()
	add("k2 after the lease: taken over=%v fence grew=%v", took, owner.Lease().Fence > stale.Lease().Fence)
	err = s.Complete(ctx, stale.Key(), stale.Lease(), []byte("stale"), time.Hour)
	add("k2 stale complete: lease lost=%v", errors.Is(err, idem.ErrLeaseLost))
	add("k2 owner commit: err=%v", owner.Commit(ctx, []byte("v")))

	// A heartbeat keeps the key while the operation outlives its lease.
	k3 := idem.Key{ID: "k3"}
	c.Attempted.Add(1)
	_, err = exec.Do(ctx, k3, "fp", func(ctx context.Context) ([]byte, error) {
		c.Executed.Add(1)
		first := get(t, s, k3.Digest())
		waitRecord(t, s, k3.Digest(), "a lease past the first one", func(r storekit.Record) bool {
			return r.Now.After(first.LeaseUntil) && r.State == storekit.StateInProgress
		})
		_, _, err := exec.Begin(ctx, k3, "fp")
		add("k3 past its first lease: others see in progress=%v", errors.Is(err, idem.ErrInProgress))
		return []byte("v"), nil
	})
	if err == nil {
		c.Acknowledged.Add(1)
	}
	add("k3 commit after the heartbeat: err=%v", err)

	// The HTTP middleware's 409 carries a Retry-After from the store's lease.
	add("http: %s", httpTrace(t, exec, c))

	// Retention: the record expires by the store's clock; then the key runs
	// again.
	waitGone(t, s, k1.Digest())
	res, err = run("k1")
	add("k1 after the retention: replayed=%v err=%v", res.Replayed, err)
	return out
}

// httpTrace holds a request in its handler, sends a duplicate, and returns
// the statuses and the duplicate's Retry-After.
func httpTrace(t *testing.T, exec *idem.Executor, c *chaostest.Counters) string {
	t.Helper()
	mw, err := idemhttp.New(exec)
	if err != nil {
		t.Fatal(err)
	}
	started := make(chan struct{})
	release := make(chan struct{})
	h := mw.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		c.Executed.Add(1)
		close(started)
		<-release
		fmt.Fprint(w, "created")
	}))
	send := func() *httptest.ResponseRecorder {
		c.Attempted.Add(1)
		req := httptest.NewRequest(http.MethodPost, "/orders", strings.NewReader(`{"n":1}`))
		req.Header.Set("Idempotency-Key", "order-1")
		w := httptest.NewRecorder()
		h.ServeHTTP(w, req)
		if w.Code < 300 {
			c.Acknowledged.Add(1)
		}
		return w
	}
	first := make(chan *httptest.ResponseRecorder, 1)
	go func() { first <- send() }()
	select {
	case <-started:
	case <-time.After(waitLimit):
		t.Fatal("the handler did not start")
	}
	dup := send()
	close(release)
	w1 := <-first
	replay := send()
	return fmt.Sprintf("first=%d duplicate=%d retry-after=%s replay=%d replayed=%s body=%s",
		w1.Code, dup.Code, dup.Header().Get("Retry-After"), replay.Code, replay.Header().Get("Idempotent-Replayed"), replay.Body)
}

// waitGone polls the store until the record is gone.
func waitGone(t *testing.T, s idem.Store, digest string) {
	t.Helper()
	deadline := time.Now().Add(waitLimit)
	for {
		_, err := s.Get(t.Context(), digest)
		if errors.Is(err, storekit.ErrNotFound) {
			return
		}
		if err != nil {
			t.Fatal(err)
		}
		if time.Now().After(deadline) {
			t.Fatalf("the record did not expire within %v", waitLimit)
		}
		time.Sleep(5 * time.Millisecond) // poll the store's record
	}
}
