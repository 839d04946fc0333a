package storm

import (
	"bufio"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	mrand "math/rand/v2"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idemgo/idem"
	"github.com/idemgo/idem/chaos/chaostest"
	"github.com/idemgo/idem/testkit/redistest"
	"github.com/redis/go-redis/v9"
)

// The storm's shape: every key is sent dups times in all, by procs child
// processes (dups/procs each, concurrently).
const (
	dups  = 20
	procs = 4
)

// inFlight bounds the requests or calls a child has running at once.
const inFlight = 64

// runTimeout bounds a child's whole run, and the test's waits for it.
const runTimeout = 15 * time.Minute

// startList is the Redis list the children wait on, so that they start
// together: the parent pushes one item per child.
const startList = "storm:start"

func TestMain(m *testing.M) {
	if role := chaostest.Role(); role != "" {
		os.Exit(runChild(role))
	}
	os.Exit(m.Run())
}

// childConfig is what the parent tells a child in its environment.
type childConfig struct {
	redis   string   // STORM_REDIS
	proxies []string // STORM_PROXIES, comma-separated (HTTP only)
	keys    int      // STORM_KEYS
	index   int      // STORM_INDEX, 0 to procs-1
	out     string   // STORM_OUT: the file the child writes its answers to
}

func (c childConfig) env() []string {
	return []string{
		"STORM_REDIS=" + c.redis, "STORM_PROXIES=" + strings.Join(c.proxies, ","),
		"STORM_KEYS=" + strconv.Itoa(c.keys), "STORM_INDEX=" + strconv.Itoa(c.index), "STORM_OUT=" + c.out,
	}
}

func runChild(role string) int {
	c := childConfig{redis: os.Getenv("STORM_REDIS"), out: os.Getenv("STORM_OUT")}
	if p := os.Getenv("STORM_PROXIES"); p != "" {
		c.proxies = strings.Split(p, ",")
	}
	c.keys, _ = strconv.Atoi(os.Getenv("STORM_KEYS"))
	c.index, _ = strconv.Atoi(os.Getenv("STORM_INDEX"))
	var err error
	switch role {
	case "http":
		err = runClients(c, httpCall)
	case "library":
		err = runClients(c, libraryCall)
	default:
		err = fmt.Errorf("unknown role %q", role)
	}
	if err != nil {
		fmt.Fprintf(os.Stderr, "%s child %d: %v\n", role, c.index, err)
		return 1
	}
	return 0
}

// keyID returns the idempotency key of the storm's key number k.
func keyID(k int) string { return "storm-" + strconv.Itoa(k) }

// answer is one final answer a child got for a key: what is compared
// byte for byte with the original. For HTTP, Value is the body and Header
// the stored header fields; for the library, Value is Do's result.
type answer struct {
	Key      string
	Status   int
	Replayed bool
	Header   string // X-Nonce and Content-Type, HTTP only
	Value    string
}

func (a answer) line() string {
	return fmt.Sprintf("%s %d %t %q %q", a.Key, a.Status, a.Replayed, a.Header, a.Value)
}

func parseAnswer(line string) (answer, error) {
	var a answer
	_, err := fmt.Sscanf(line, "%s %d %t %q %q", &a.Key, &a.Status, &a.Replayed, &a.Header, &a.Value)
	return a, err
}

// callStats counts what a child saw besides its answers.
type callStats struct {
	conflicts atomic.Int64 // in-progress answers (409, ErrInProgress) before the final one
	awaits    atomic.Int64 // of those, the ones waited for with Executor.Await
	errors    atomic.Int64 // transport or store errors, retried
}

// call sends key number k once, retrying until a final answer.
type call func(ctx context.Context, env *callEnv, k, dup int) (answer, error)

// callEnv is what a child's calls share.
type callEnv struct {
	c     childConfig
	rdb   *redis.Client
	http  *http.Client
	exec  *idem.Executor
	stats callStats
}

// runClients is a child: it waits for the start signal, then sends its
// share (dups/procs) of the duplicates of every key, concurrently, and
// writes every final answer to its output file, one per line. It says
// "ready" when it waits and "done <conflicts> <awaits> <errors>" at the
// end.
func runClients(c childConfig, send call) error {
	ctx, cancel := context.WithTimeout(context.Background(), runTimeout)
	defer cancel()
	env := &callEnv{c: c, rdb: redis.NewClient(&redis.Options{Addr: c.redis, PoolSize: inFlight + 8})}
	defer env.rdb.Close()
	env.http = &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: inFlight, IdleConnTimeout: time.Minute}}
	var err error
	if env.exec, err = chaostest.NewRedisExecutor(env.rdb, 30*time.Second); err != nil {
		return err
	}
	f, err := os.Create(c.out)
	if err != nil {
		return err
	}
	defer f.Close()
	w := bufio.NewWriter(f)

	chaostest.Say("ready")
	if err := env.rdb.BLPop(ctx, 0, startList).Err(); err != nil {
		return fmt.Errorf("waiting for the start: %w", err)
	}
	var (
		mu       sync.Mutex
		firstErr error
		wg       sync.WaitGroup
	)
	sem := make(chan struct{}, inFlight)
	for k := range c.keys {
		for d := range dups / procs {
			sem <- struct{}{}
			wg.Go(func() {
				defer func() { <-sem }()
				a, err := send(ctx, env, k, d)
				mu.Lock()
				defer mu.Unlock()
				if err != nil {
					if firstErr == nil {
						firstErr = fmt.Errorf("%s: %w", keyID(k), err)
					}
					return
				}
				fmt.Fprintln(w, a.line())
			})
		}
	}
	wg.Wait()
	if firstErr != nil {
		return firstErr
	}
	if err := w.Flush(); err != nil {
		return err
	}
	if err := f.Sync(); err != nil {
		return err
	}
	chaostest.Say("done %d %d %d", env.stats.conflicts.Load(), env.stats.awaits.Load(), env.stats.errors.Load())
	return nil
}

// retryPause is the pause before a retry after an in-progress answer or an
// error: a few milliseconds, with jitter (the proxy's Retry-After is in
// whole seconds, far longer than an execution here).
func retryPause(ctx context.Context) error {
	t := time.NewTimer(time.Duration(2+mrand.IntN(8)) * time.Millisecond)
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// httpCall posts key number k to one of the proxies until it gets a final
// answer (not 409, not an error).
func httpCall(ctx context.Context, env *callEnv, k, dup int) (answer, error) {
	id := keyID(k)
	// Alternate the proxies, so that every key gets duplicates through
	// both.
	proxy := env.c.proxies[(env.c.index+dup)%len(env.c.proxies)]
	body := fmt.Sprintf(`{"order":%q,"amount":%d}`, id, k)
	for {
		req, err := http.NewRequestWithContext(ctx, http.MethodPost, "http://"+proxy+"/orders", strings.NewReader(body))
		if err != nil {
			return answer{}, err
		}
		req.Header.Set("Idempotency-Key", id)
		req.Header.Set("Content-Type", "application/json")
		res, err := env.http.Do(req)
		if err != nil {
			if ctx.Err() != nil {
				return answer{}, err
			}
			env.stats.errors.Add(1)
			if err := retryPause(ctx); err != nil {
				return answer{}, err
			}
			continue
		}
		b, err := io.ReadAll(res.Body)
		res.Body.Close()
		switch {
		case err != nil:
			env.stats.errors.Add(1)
		case res.StatusCode == http.StatusConflict:
			env.stats.conflicts.Add(1)
		case res.StatusCode == http.StatusServiceUnavailable:
			env.stats.errors.Add(1)
		default:
			return answer{
				Key: id, Status: res.StatusCode, Replayed: res.Header.Get("Idempotent-Replayed") == "true",
				Header: res.Header.Get("X-Nonce") + " " + res.Header.Get("Content-Type"), Value: string(b),
			}, nil
		}
		if err := retryPause(ctx); err != nil {
			return answer{}, err
		}
	}
}

// libraryCall runs Do for key number k until it gets a result, waiting
// while the key is in progress (with Await for even dup, with a short
// pause for odd). The operation counts its
// executions in Redis (INCR exec:{key}), records its output (RPUSH
// out:{key}), and returns a value made of its fence and a random nonce, so
// that a second execution could not give the same value.
func libraryCall(ctx context.Context, env *callEnv, k, dup int) (answer, error) {
	id := keyID(k)
	key := idem.Key{Scope: "storm", ID: id}
	for {
		res, err := env.exec.Do(ctx, key, "order", func(ctx context.Context) ([]byte, error) {
			if err := env.rdb.Incr(ctx, "exec:{"+id+"}").Err(); err != nil {
				return nil, err
			}
			work(ctx)
			fence, _ := idem.FenceFrom(ctx)
			v := fmt.Sprintf("%s fence=%d nonce=%s", id, fence, nonce())
			if err := env.rdb.RPush(ctx, "out:{"+id+"}", v).Err(); err != nil {
				return nil, err
			}
			return []byte(v), nil
		})
		switch {
		case err == nil:
			return answer{Key: id, Status: 200, Replayed: res.Replayed, Value: string(res.Value)}, nil
		case errors.Is(err, idem.ErrInProgress):
			env.stats.conflicts.Add(1)
			// Half the callers wait with Await, as documented; the others
			// retry after a pause, as a caller without a Watcher would.
			wait := retryPause
			if dup%2 == 0 {
				env.stats.awaits.Add(1)
				wait = func(ctx context.Context) error { return env.exec.Await(ctx, key) }
			}
			if err := wait(ctx); err != nil {
				return answer{}, err
			}
		case ctx.Err() != nil, errors.Is(err, idem.ErrMismatch), errors.Is(err, idem.ErrFailed), errors.Is(err, idem.ErrLeaseLost):
			return answer{}, err
		default: // the store failed: retry
			env.stats.errors.Add(1)
			if err := retryPause(ctx); err != nil {
				return answer{}, err
			}
		}
	}
}

// work is the operation's own time, 1 to 5ms, so that duplicates overlap
// it.
func work(ctx context.Context) {
	t := time.NewTimer(time.Duration(1000+mrand.IntN(4000)) * time.Microsecond)
	defer t.Stop()
	select {
	case <-t.C:
	case <-ctx.Done():
	}
}

func nonce() string {
	b := make([]byte, 12)
	rand.Read(b)
	return hex.EncodeToString(b)
}

// stormStats is what the children counted besides their answers.
type stormStats struct {
	conflicts, awaits, errors int64
}

// storm runs the children of role against the parent's setup and returns
// every answer they wrote, what they counted, and the time from the start
// signal to the last child's end.
func storm(t *testing.T, role string, rdb *redis.Client, c childConfig) (answers []answer, st stormStats, elapsed time.Duration) {
	t.Helper()
	dir := t.TempDir()
	children := make([]*chaostest.Proc, procs)
	outs := make([]string, procs)
	for i := range procs {
		cc := c
		cc.index = i
		cc.out = filepath.Join(dir, fmt.Sprintf("answers-%d", i))
		outs[i] = cc.out
		children[i] = chaostest.StartChild(t, role, cc.env()...)
	}
	for _, ch := range children {
		ch.Expect("ready", runTimeout)
	}
	start := time.Now()
	for range procs {
		if err := rdb.RPush(t.Context(), startList, "go").Err(); err != nil {
			t.Fatal(err)
		}
	}
	for i, ch := range children {
		line := ch.Expect("done ", runTimeout)
		var cf, aw, er int64
		if _, err := fmt.Sscanf(line, "done %d %d %d", &cf, &aw, &er); err != nil {
			t.Fatalf("child %d: line %q: %v", i, line, err)
		}
		st.conflicts += cf
		st.awaits += aw
		st.errors += er
		if err := ch.Wait(runTimeout); err != nil {
			t.Fatalf("child %d: %v\n%s", i, err, ch.Stderr())
		}
	}
	elapsed = time.Since(start)
	for _, out := range outs {
		f, err := os.Open(out)
		if err != nil {
			t.Fatal(err)
		}
		sc := bufio.NewScanner(f)
		sc.Buffer(nil, 1<<20)
		for sc.Scan() {
			a, err := parseAnswer(sc.Text())
			if err != nil {
				t.Fatalf("%s: line %q: %v", out, sc.Text(), err)
			}
			answers = append(answers, a)
		}
		f.Close()
		if err := sc.Err(); err != nil {
			t.Fatal(err)
		}
	}
	return answers, st, elapsed
}

// checkAnswers compares every answer with the original of its key and
// counts, per key, the answers and those that were not replays. It reports
// at most a few mismatches in detail, and returns the number of replays
// and the keys that got fewer answers than they were sent.
func checkAnswers(t *testing.T, keys int, answers []answer, original func(key string) (answer, bool), c *chaostest.Counters) (replays int, short map[string]bool) {
	t.Helper()
	perKey := make(map[string]int, keys)
	fresh := make(map[string]int, keys)
	mismatches := 0
	for _, a := range answers {
		perKey[a.Key]++
		if a.Replayed {
			replays++
		} else {
			fresh[a.Key]++
		}
		want, ok := original(a.Key)
		if !ok || a.Status != want.Status || a.Header != want.Header || a.Value != want.Value {
			mismatches++
			if mismatches <= 5 {
				t.Errorf("%s: got %d %q %q (replayed %t), want the original %d %q %q", a.Key, a.Status, a.Header, a.Value, a.Replayed, want.Status, want.Header, want.Value)
			}
			continue
		}
		c.Acknowledged.Add(1)
	}
	if mismatches > 0 {
		t.Errorf("%d of %d answers differ from their key's original", mismatches, len(answers))
	}
	bad := 0
	short = make(map[string]bool)
	for k := range keys {
		id := keyID(k)
		if perKey[id] < dups {
			short[id] = true
		}
		if perKey[id] != dups || fresh[id] != 1 {
			bad++
			if bad <= 5 {
				t.Errorf("%s: %d answers, %d of them not replayed; want %d answers, exactly 1 not replayed", id, perKey[id], fresh[id], dups)
			}
		}
	}
	if bad > 0 {
		t.Errorf("%d of %d keys did not get %d answers with exactly one original", bad, keys, dups)
	}
	return replays, short
}

// countExecutions adds per key executions to c: Executed, Effects, as
// Duplicated those beyond the first, and as Lost the keys without one or
// short of answers. It reports the keys that did not run exactly once.
func countExecutions(t *testing.T, keys int, executions func(k int) int64, short map[string]bool, c *chaostest.Counters) {
	t.Helper()
	bad := 0
	for k := range keys {
		n := executions(k)
		c.Executed.Add(n)
		c.Effects.Add(n)
		if n == 0 || short[keyID(k)] {
			c.Lost.Add(1)
		}
		c.Duplicated.Add(max(0, n-1))
		if n != 1 {
			bad++
			if bad <= 5 {
				t.Errorf("%s: executed %d times, want 1", keyID(k), n)
			}
		}
	}
	if bad > 0 {
		t.Errorf("%d of %d keys did not execute exactly once", bad, keys)
	}
}

// storeClient starts a redis-server and returns it with a client.
func storeClient(t *testing.T) (*redistest.Server, *redis.Client) {
	t.Helper()
	srv := redistest.Start(t)
	rdb := srv.GoRedis(t)
	return srv, rdb
}

// TestDuplicateStormHTTP is scenario 1, duplicate storm, through the HTTP
// proxy. Two `idem proxy` processes share one redis-server, in front of one
// upstream (in the test process) that takes 1 to 5ms and answers 201 with a
// body and an X-Nonce field holding a random nonce, so that a second
// execution would show. One proxy waits for an in-progress key (--wait),
// the other answers 409, which the clients retry after a few milliseconds.
// Four child processes send every key 20 times in all (5 each,
// concurrently, through both proxies), N = 1,000 keys (IDEM_CHAOS=long:
// 10,000).
//
// Asserted: the upstream ran every key exactly once; every key got 20
// final answers, exactly one of them not a replay; every answer (status,
// body, X-Nonce, Content-Type) is byte-identical to the response the
// upstream gave; 0 lost.
func TestDuplicateStormHTTP(t *testing.T) {
	keys := chaostest.Size(1000, 10000)
	bin := chaostest.BuildIdem(t)
	srv, rdb := storeClient(t)

	var mu sync.Mutex
	executions := make(map[string]int64, keys)
	originals := make(map[string]answer, keys)
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		id := r.Header.Get("Idempotency-Key")
		body, _ := io.ReadAll(r.Body)
		mu.Lock()
		executions[id]++
		n := executions[id]
		mu.Unlock()
		work(r.Context())
		nc := nonce()
		out := fmt.Sprintf(`{"order_request":%s,"execution":%d,"fence":%q,"nonce":%q}`, body, n, r.Header.Get("Idempotency-Fence"), nc)
		w.Header().Set("Content-Type", "application/json")
		w.Header().Set("X-Nonce", nc)
		if n == 1 { // a later execution is counted, and must not replace the original
			mu.Lock()
			originals[id] = answer{Key: id, Status: http.StatusCreated, Header: nc + " application/json", Value: out}
			mu.Unlock()
		}
		w.WriteHeader(http.StatusCreated)
		io.WriteString(w, out)
	}))
	t.Cleanup(up.Close)

	store := []string{"--upstream", up.URL, "--redis", "redis://" + srv.Addr()}
	_, waiting := chaostest.StartProxy(t, bin, append(store, "--wait", "30s")...)
	_, answering := chaostest.StartProxy(t, bin, store...)

	answers, st, elapsed := storm(t, "http", rdb, childConfig{redis: srv.Addr(), proxies: []string{waiting, answering}, keys: keys})

	var c chaostest.Counters
	c.Attempted.Add(int64(keys * dups))
	mu.Lock()
	defer mu.Unlock()
	replays, short := checkAnswers(t, keys, answers, func(id string) (answer, bool) { a, ok := originals[id]; return a, ok }, &c)
	countExecutions(t, keys, func(k int) int64 { return executions[keyID(k)] }, short, &c)

	chaostest.Report(t, "duplicate storm (HTTP proxy)", "make chaos-long RUN=TestDuplicateStormHTTP", &c, map[string]string{
		"keys":              strconv.Itoa(keys),
		"duplicates":        fmt.Sprintf("%d per key over %d processes, 2 proxies", dups, procs),
		"requests_per_s":    strconv.FormatFloat(float64(keys*dups)/elapsed.Seconds(), 'f', 0, 64),
		"replays":           strconv.Itoa(replays),
		"conflicts_retried": strconv.FormatInt(st.conflicts, 10),
		"errors_retried":    strconv.FormatInt(st.errors, 10),
		"wall":              elapsed.Round(time.Millisecond).String(),
	})
}

// TestDuplicateStormLibrary is scenario 1, duplicate storm, through the
// library. Four child processes each run an idem.Executor over redisstore
// on one redis-server and call Do for every key 5 times, concurrently (20
// in all), N = 1,000 keys (IDEM_CHAOS=long: 10,000). The operation takes
// 1 to 5ms, counts its executions in Redis (INCR exec:{key}) apart from
// idem's records, and returns a value made of its fence and a random
// nonce. A call that finds the key in progress waits (half of them with
// Executor.Await, half with a pause of a few milliseconds) and calls Do
// again.
//
// Asserted: every key executed exactly once (Redis's counter); every key
// got 20 results, exactly one of them not a replay; every result is
// byte-identical to the value the one execution returned; 0 lost.
func TestDuplicateStormLibrary(t *testing.T) {
	keys := chaostest.Size(1000, 10000)
	srv, rdb := storeClient(t)

	answers, st, elapsed := storm(t, "library", rdb, childConfig{redis: srv.Addr(), keys: keys})

	ctx := t.Context()
	execs := make([]*redis.StringCmd, keys)
	outs := make([]*redis.StringSliceCmd, keys)
	pipe := rdb.Pipeline()
	for k := range keys {
		execs[k] = pipe.Get(ctx, "exec:{"+keyID(k)+"}")
		outs[k] = pipe.LRange(ctx, "out:{"+keyID(k)+"}", 0, -1)
	}
	if _, err := pipe.Exec(ctx); err != nil && !errors.Is(err, redis.Nil) {
		t.Fatal(err)
	}
	originals := make(map[string]answer, keys)
	for k := range keys {
		if v := outs[k].Val(); len(v) > 0 {
			originals[keyID(k)] = answer{Key: keyID(k), Status: 200, Value: v[0]}
		}
	}

	var c chaostest.Counters
	c.Attempted.Add(int64(keys * dups))
	replays, short := checkAnswers(t, keys, answers, func(id string) (answer, bool) { a, ok := originals[id]; return a, ok }, &c)
	countExecutions(t, keys, func(k int) int64 {
		n, _ := execs[k].Int64()
		if m := int64(len(outs[k].Val())); m != n {
			t.Errorf("%s: %d executions counted, %d outputs recorded", keyID(k), n, m)
		}
		return n
	}, short, &c)

	chaostest.Report(t, "duplicate storm (library)", "make chaos-long RUN=TestDuplicateStormLibrary", &c, map[string]string{
		"keys":              strconv.Itoa(keys),
		"duplicates":        fmt.Sprintf("%d per key over %d processes", dups, procs),
		"calls_per_s":       strconv.FormatFloat(float64(keys*dups)/elapsed.Seconds(), 'f', 0, 64),
		"replays":           strconv.Itoa(replays),
		"in_progress_waits": fmt.Sprintf("%d (%d with Await)", st.conflicts, st.awaits),
		"errors_retried":    strconv.FormatInt(st.errors, 10),
		"wall":              elapsed.Round(time.Millisecond).String(),
	})
}
