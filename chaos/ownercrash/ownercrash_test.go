package ownercrash

import (
	"context"
	"errors"
	"fmt"
	"io"
	mrand "math/rand/v2"
	"net/http"
	"net/http/httptest"
	"os"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/idemgo/idem"
	"github.com/idemgo/idem/adapterkit"
	"github.com/idemgo/idem/chaos/chaostest"
	"github.com/idemgo/idem/idemhttp"
	"github.com/idemgo/idem/storekit"
	"github.com/idemgo/idem/testkit/prooftest"
	"github.com/idemgo/idem/testkit/redistest"
	"github.com/redis/go-redis/v9"
)

// lease is the owners' lease. A takeover must come within lease + margin
// of the crash.
const (
	lease  = time.Second
	margin = 2 * time.Second
)

// waitTimeout bounds every wait for a process or a request: generous,
// since the machine may be loaded.
const waitTimeout = 60 * time.Second

func TestMain(m *testing.M) {
	if role := chaostest.Role(); role != "" {
		os.Exit(runChild(role))
	}
	os.Exit(m.Run())
}

func runChild(role string) int {
	if role != "owner" {
		fmt.Fprintf(os.Stderr, "unknown role %q\n", role)
		return 2
	}
	if err := runOwner(os.Getenv("CRASH_REDIS"), os.Getenv("CRASH_KEY"), os.Getenv("CRASH_EFFECT") == "before"); err != nil {
		fmt.Fprintln(os.Stderr, "owner:", err)
		return 1
	}
	return 0
}

// holdBeforeKill returns how long the owner runs before it is killed: a
// random part of the first half of the lease, so that the takeover times
// spread between about lease/2 and the lease.
func holdBeforeKill() time.Duration {
	return time.Duration(mrand.Int64N(int64(lease / 2)))
}

// takeoverStats collects the takeover times of a scenario.
type takeoverStats struct {
	times []time.Duration
}

// check records d and fails t if it is over lease + margin.
func (s *takeoverStats) check(t *testing.T, what string, d time.Duration) {
	t.Helper()
	s.times = append(s.times, d)
	if d > lease+margin {
		t.Errorf("%s: taken over %v after the crash, want at most lease + %v = %v", what, d, margin, lease+margin)
	}
}

func (s *takeoverStats) figures(f map[string]string) map[string]string {
	f["lease"] = lease.String()
	f["takeover_p50"] = chaostest.Percentile(s.times, 50).Round(time.Millisecond).String()
	f["takeover_p99"] = chaostest.Percentile(s.times, 99).Round(time.Millisecond).String()
	f["takeover_max"] = chaostest.Percentile(s.times, 100).Round(time.Millisecond).String()
	return f
}

// crashUpstream is the API behind the proxies: it needs the request's
// fence (Idempotency-Fence) and applies its effect to a fenced sink. A
// request with X-Chaos-Block is the one whose proxy gets killed: its
// handler holds it until the test says the proxy is dead, then applies its
// effect (which lands, being the first), then waits until the takeover's
// effect landed and writes again with its old fence (which the sink must
// refuse), as a slow handler that retries its write would.
type crashUpstream struct {
	sink     *prooftest.Sink
	arrivals chan arrival
	quit     chan struct{} // closed when the test ends, to free held handlers

	mu   sync.Mutex
	keys map[string]*keyState
}

// arrival is a request that reached the upstream.
type arrival struct {
	key     string
	fence   int64
	at      time.Time
	blocked bool
}

// keyState is the handshake between the test and the handlers of one key.
type keyState struct {
	executions   int
	killed       chan struct{} // closed by the test once the proxy is dead
	firstApplied chan bool     // the killed attempt's write after the crash
	takenOver    chan struct{} // closed when the takeover's effect landed
	staleApplied chan bool     // the killed attempt's write after the takeover
	closeOnce    sync.Once
}

func (u *crashUpstream) state(key string) *keyState {
	u.mu.Lock()
	defer u.mu.Unlock()
	st, ok := u.keys[key]
	if !ok {
		st = &keyState{killed: make(chan struct{}), firstApplied: make(chan bool, 1), takenOver: make(chan struct{}), staleApplied: make(chan bool, 1)}
		u.keys[key] = st
	}
	return st
}

func (u *crashUpstream) executions(key string) int {
	u.mu.Lock()
	defer u.mu.Unlock()
	return u.keys[key].executions
}

func (u *crashUpstream) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	id := r.Header.Get("Idempotency-Key")
	fence, err := strconv.ParseInt(r.Header.Get("Idempotency-Fence"), 10, 64)
	if err != nil {
		http.Error(w, "no Idempotency-Fence", http.StatusBadRequest)
		return
	}
	_, _ = io.Copy(io.Discard, r.Body)
	st := u.state(id)
	u.mu.Lock()
	st.executions++
	u.mu.Unlock()
	blocked := r.Header.Get("X-Chaos-Block") != ""
	u.arrivals <- arrival{key: id, fence: fence, at: time.Now(), blocked: blocked}
	if blocked {
		select {
		case <-st.killed:
		case <-u.quit:
			return
		}
		st.firstApplied <- u.sink.Apply(id, fence)
		select {
		case <-st.takenOver:
		case <-u.quit:
			return
		}
		st.staleApplied <- u.sink.Apply(id, fence)
		return
	}
	applied := u.sink.Apply(id, fence)
	st.closeOnce.Do(func() { close(st.takenOver) })
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(http.StatusCreated)
	fmt.Fprintf(w, `{"key":%q,"fence":%d,"applied":%t,"nonce":%d}`, id, fence, applied, mrand.Uint64())
}

// nextArrival returns the next request that reached the upstream.
func (u *crashUpstream) nextArrival(t *testing.T) arrival {
	t.Helper()
	select {
	case a := <-u.arrivals:
		return a
	case <-time.After(waitTimeout):
		t.Fatalf("no request reached the upstream within %v", waitTimeout)
		return arrival{}
	}
}

// receive returns the value sent on ch.
func receive[T any](t *testing.T, what string, ch <-chan T) T {
	t.Helper()
	select {
	case v := <-ch:
		return v
	case <-time.After(waitTimeout):
		t.Fatalf("%s: nothing within %v", what, waitTimeout)
		var zero T
		return zero
	}
}

// response is a final answer of a proxy.
type response struct {
	status   int
	replayed bool
	body     string
}

// postUntilFinal posts the key's request to addr until the answer is not
// 409 (the proxy waits with --wait; 409 comes only if the wait ran out).
func postUntilFinal(t *testing.T, addr, id string) response {
	t.Helper()
	deadline := time.Now().Add(waitTimeout)
	for {
		req, err := http.NewRequestWithContext(t.Context(), http.MethodPost, "http://"+addr+"/crash", strings.NewReader(`{"order":"`+id+`"}`))
		if err != nil {
			t.Fatal(err)
		}
		req.Header.Set("Idempotency-Key", id)
		res, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatalf("POST via %s: %v", addr, err)
		}
		b, err := io.ReadAll(res.Body)
		res.Body.Close()
		if err != nil {
			t.Fatalf("POST via %s: reading the body: %v", addr, err)
		}
		if res.StatusCode != http.StatusConflict {
			return response{status: res.StatusCode, replayed: res.Header.Get("Idempotent-Replayed") == "true", body: string(b)}
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s still in progress after %v", id, waitTimeout)
		}
	}
}

// TestOwnerCrashHTTP is scenario 2, owner crash, through the HTTP proxy.
// Per key, a proxy process (lease 1s) on a real redis-server forwards a
// request whose upstream handler holds it; the proxy is killed with SIGKILL
// at a random point of the first half of the lease. The killed attempt's
// handler then applies its effect with its fence (it lands: it is the
// first). The client retries through a second proxy on the same Redis
// (--wait), which takes the key over after the lease and runs the upstream
// again with the fence it passes in Idempotency-Fence; that effect lands
// and supersedes the first. The killed attempt's handler then writes again
// with its old fence. K = 10 keys (IDEM_CHAOS=long: 100), one proxy killed
// per key.
//
// Asserted per key: the takeover's fence is above the killed attempt's;
// the upstream ran exactly twice; the retry gets 201 from the takeover and
// a later retry its byte-identical replay; the record is COMPLETED with the
// takeover's fence, which is the fence standing in the sink; the late write
// with the old fence is refused (0 duplicate effects, 0 lost); the takeover
// comes at most lease + 2s after the SIGKILL (p50/p99 reported).
func TestOwnerCrashHTTP(t *testing.T) {
	t.Parallel()
	k := chaostest.Size(10, 100)
	bin := chaostest.BuildIdem(t)
	srv := redistest.Start(t)
	rdb := redis.NewClient(&redis.Options{Addr: srv.Addr()})
	store := chaostest.GoRedisStore(t, rdb)

	up := &crashUpstream{sink: prooftest.NewSink(), arrivals: make(chan arrival, 16), quit: make(chan struct{}), keys: make(map[string]*keyState)}
	hs := httptest.NewServer(up)
	t.Cleanup(hs.Close)
	t.Cleanup(func() { close(up.quit) }) // runs first: frees held handlers
	args := []string{"--upstream", hs.URL, "--redis", "redis://" + srv.Addr(), "--lease", lease.String()}
	_, retryAddr := chaostest.StartProxy(t, bin, append(args, "--wait", "30s")...)

	var c chaostest.Counters
	var takeovers takeoverStats
	staleRejected, superseded := 0, 0
	for i := range k {
		id := fmt.Sprintf("crash-%d", i)
		c.Attempted.Add(1)
		victim, victimAddr := chaostest.StartProxy(t, bin, args...)
		sent := make(chan struct{})
		go func() {
			defer close(sent)
			// The proxy is killed under this request: its error is expected.
			req, _ := http.NewRequest(http.MethodPost, "http://"+victimAddr+"/crash", strings.NewReader(`{"order":"`+id+`"}`))
			req.Header.Set("Idempotency-Key", id)
			req.Header.Set("X-Chaos-Block", "1")
			if res, err := http.DefaultClient.Do(req); err == nil {
				res.Body.Close()
			}
		}()
		first := up.nextArrival(t)
		if first.key != id || !first.blocked {
			t.Fatalf("first arrival: got %+v, want the held request of %s", first, id)
		}
		c.Executed.Add(1)
		time.Sleep(holdBeforeKill()) // the crash point: part of the injected fault
		killedAt := time.Now()
		victim.Kill()
		st := up.state(id)
		close(st.killed)
		if !receive(t, id+": the killed attempt's write", st.firstApplied) {
			t.Errorf("%s: the killed attempt's first write was refused; nothing had been applied", id)
		}

		res := postUntilFinal(t, retryAddr, id)
		second := up.nextArrival(t)
		c.Executed.Add(1)
		takeovers.check(t, id, second.at.Sub(killedAt))
		if second.key != id || second.blocked || second.fence <= first.fence {
			t.Errorf("%s: takeover %+v after %+v, want the same key with a larger fence", id, second, first)
		}
		want := fmt.Sprintf(`"fence":%d,"applied":true`, second.fence)
		if res.status != http.StatusCreated || res.replayed || !strings.Contains(res.body, want) {
			t.Errorf("%s: retry got %d %q replayed=%t, want 201 from the takeover (%s)", id, res.status, res.body, res.replayed, want)
		} else {
			c.Acknowledged.Add(1)
		}
		if receive(t, id+": the killed attempt's late write", st.staleApplied) {
			c.Duplicated.Add(1)
			t.Errorf("%s: the sink applied the killed attempt's late write (fence %d after %d)", id, first.fence, second.fence)
		} else {
			staleRejected++
		}
		receive(t, id+": the killed proxy's client", sent)

		if again := postUntilFinal(t, retryAddr, id); again.status != res.status || again.body != res.body || !again.replayed {
			t.Errorf("%s: replay got %d %q replayed=%t, want %d %q replayed", id, again.status, again.body, again.replayed, res.status, res.body)
		}
		if n := up.executions(id); n != 2 {
			t.Errorf("%s: upstream executions: got %d, want 2 (the killed one and the takeover)", id, n)
		}
		rec, err := store.Get(t.Context(), idemhttp.PathKey(http.MethodPost, "/crash", id).Digest())
		if err != nil || rec.State != storekit.StateCompleted || rec.Fence != second.fence {
			c.Lost.Add(1)
			t.Errorf("%s: record %v fence %d (%v), want COMPLETED with the takeover's fence %d", id, rec.State, rec.Fence, err, second.fence)
		}
	}

	// The sink, once every handler is done.
	for i := range k {
		id := fmt.Sprintf("crash-%d", i)
		applied := up.sink.Applied[id]
		c.Effects.Add(min(int64(applied), 1))
		superseded += max(applied-1, 0)
		if applied != 2 {
			t.Errorf("%s: %d writes applied, want 2 (the killed attempt's, superseded by the takeover's)", id, applied)
		}
	}
	chaostest.Report(t, "owner crash (HTTP proxy)", "make chaos-long RUN=TestOwnerCrashHTTP", &c, takeovers.figures(map[string]string{
		"crashes":              strconv.Itoa(k),
		"stale_write_rejected": fmt.Sprintf("%d/%d", staleRejected, k),
		"superseded_by_fence":  fmt.Sprintf("%d/%d", superseded, k),
	}))
}

// runOwner is the owner that gets killed: it runs Do for its key on
// redisstore (lease 1s); in the operation it applies its effect to the
// fenced sink if effectFirst, says "in fn <fence>", and hangs until it is
// killed.
func runOwner(addr, id string, effectFirst bool) error {
	rdb := redis.NewClient(&redis.Options{Addr: addr})
	defer rdb.Close()
	exec, err := chaostest.NewRedisExecutor(rdb, lease)
	if err != nil {
		return err
	}
	sink := chaostest.NewRedisSink(rdb, "sink:")
	_, err = exec.Do(context.Background(), idem.Key{Scope: "crash", ID: id}, "fp", func(ctx context.Context) ([]byte, error) {
		fence, _ := idem.FenceFrom(ctx)
		if effectFirst {
			if _, err := sink.Apply(ctx, id, fence); err != nil {
				return nil, err
			}
		}
		chaostest.Say("in fn %d", fence)
		time.Sleep(time.Hour) // until SIGKILL
		return nil, errors.New("not killed")
	})
	return err
}

// TestOwnerCrashLibrary is scenario 2, owner crash, through the library.
// Per key, a child process runs Executor.Do over redisstore on a real
// redis-server (lease 1s) and is killed with SIGKILL inside the operation
// at a random point of the first half of the lease: for even keys after it
// applied its effect to a fenced sink (in Redis), for odd keys before. The
// test's own Executor then takes the key over (Do, waiting with Await while
// the key is in progress) and applies its effect with its fence. Finally a
// late write with the killed owner's fence is tried. K = 10 keys
// (IDEM_CHAOS=long: 100).
//
// Asserted per key: the takeover runs the operation with a larger fence;
// the record is COMPLETED with it; the sink holds the takeover's fence, with
// one applied write per attempt that wrote (the killed owner's superseded)
// and the late stale write refused (0 duplicate effects, 0 lost); the
// takeover comes at most lease + 2s after the SIGKILL (p50/p99 reported).
func TestOwnerCrashLibrary(t *testing.T) {
	t.Parallel()
	k := chaostest.Size(10, 100)
	rdb, exec := chaostest.StartRedisExecutor(t, lease)
	sink := chaostest.NewRedisSink(rdb, "sink:")
	ctx := t.Context()

	var c chaostest.Counters
	var takeovers takeoverStats
	staleRejected, superseded := 0, 0
	for i := range k {
		id := fmt.Sprintf("crash-%d", i)
		key := idem.Key{Scope: "crash", ID: id}
		effectFirst := i%2 == 0
		c.Attempted.Add(1)
		env := []string{"CRASH_REDIS=" + rdb.Options().Addr, "CRASH_KEY=" + id, "CRASH_EFFECT=after"}
		if effectFirst {
			env[2] = "CRASH_EFFECT=before"
		}
		owner := chaostest.StartChild(t, "owner", env...)
		line := owner.Expect("in fn ", waitTimeout)
		firstFence, err := strconv.ParseInt(strings.TrimPrefix(line, "in fn "), 10, 64)
		if err != nil {
			t.Fatalf("%s: owner's line %q: %v", id, line, err)
		}
		c.Executed.Add(1)
		time.Sleep(holdBeforeKill()) // the crash point: part of the injected fault
		killedAt := time.Now()
		owner.Kill()

		var takenAt time.Time
		var res idem.Result
		for {
			res, err = exec.Do(ctx, key, "fp", func(ctx context.Context) ([]byte, error) {
				takenAt = time.Now()
				c.Executed.Add(1)
				fence, _ := idem.FenceFrom(ctx)
				if ok, err := sink.Apply(ctx, id, fence); err != nil || !ok {
					return nil, fmt.Errorf("the takeover's write was not applied: %v", err)
				}
				return []byte("taken over with fence " + strconv.FormatInt(fence, 10)), nil
			})
			if !errors.Is(err, idem.ErrInProgress) {
				break
			}
			if err := exec.Await(ctx, key); err != nil {
				t.Fatal(err)
			}
		}
		if err != nil || res.Replayed {
			t.Fatalf("%s: takeover got %+v, %v; want an execution", id, res, err)
		}
		c.Acknowledged.Add(1)
		takeovers.check(t, id, takenAt.Sub(killedAt))
		if res.Fence <= firstFence {
			t.Errorf("%s: takeover's fence %d is not above the killed owner's %d", id, res.Fence, firstFence)
		}
		if ok, err := sink.Apply(ctx, id, firstFence); err != nil {
			t.Fatal(err)
		} else if ok {
			c.Duplicated.Add(1)
			t.Errorf("%s: the sink applied a late write with the killed owner's fence %d", id, firstFence)
		} else {
			staleRejected++
		}

		st, err := sink.State(ctx, id)
		if err != nil {
			t.Fatal(err)
		}
		wantApplied := int64(1)
		if effectFirst {
			wantApplied = 2
			superseded++
		}
		c.Effects.Add(min(st.Applied, 1))
		if st.Fence != res.Fence || st.Applied != wantApplied {
			t.Errorf("%s: sink holds %+v, want fence %d with %d applied writes", id, st, res.Fence, wantApplied)
		}
		rec, err := adapterkit.Store(exec).Get(ctx, key.Digest())
		if err != nil || rec.State != storekit.StateCompleted || rec.Fence != res.Fence {
			c.Lost.Add(1)
			t.Errorf("%s: record %v fence %d (%v), want COMPLETED with the takeover's fence %d", id, rec.State, rec.Fence, err, res.Fence)
		}
	}
	chaostest.Report(t, "owner crash (library)", "make chaos-long RUN=TestOwnerCrashLibrary", &c, takeovers.figures(map[string]string{
		"crashes":              fmt.Sprintf("%d (%d after the effect)", k, superseded),
		"stale_write_rejected": fmt.Sprintf("%d/%d", staleRejected, k),
	}))
}
