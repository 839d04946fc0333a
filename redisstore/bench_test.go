package redisstore_test

import (
	"context"
	"errors"
	"fmt"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idemgo/idem"
	"github.com/idemgo/idem/adapterkit"
	"github.com/idemgo/idem/redisstore"
	"github.com/idemgo/idem/storekit"
	"github.com/idemgo/idem/testkit/redistest"
	"github.com/redis/go-redis/v9"
)

// benchResult is the operation's result in the benchmarks: 50 bytes, as in
// internal/benchcmd.
var benchResult = []byte(`{"id":"ch_001","amount":4200,"status":"succeeded"}`)

func benchFn(context.Context) ([]byte, error) { return benchResult, nil }

// benchConcurrency is the number of concurrent callers of the parallel
// sub-benchmarks.
const benchConcurrency = 64

// benchExecutor is an Executor on one client library.
type benchExecutor struct {
	name string
	e    *idem.Executor
}

// benchExecutors starts a redis-server for the benchmark and returns an
// Executor on it through each client library.
func benchExecutors(b *testing.B) (*redistest.Server, []benchExecutor) {
	srv := redistest.Start(b)
	gr := redis.NewClient(&redis.Options{Addr: srv.Addr(), PoolSize: benchConcurrency})
	b.Cleanup(func() { gr.Close() })
	ru := srv.Rueidis(b)
	grs, err := redisstore.New(gr)
	if err != nil {
		b.Fatal(err)
	}
	rus, err := redisstore.NewRueidis(ru)
	if err != nil {
		b.Fatal(err)
	}
	var out []benchExecutor
	for _, s := range []struct {
		name  string
		store storekit.Store
	}{{"go-redis", grs}, {"rueidis", rus}} {
		e, err := idem.New(s.store)
		if err != nil {
			b.Fatal(err)
		}
		out = append(out, benchExecutor{s.name, e})
	}
	return srv, out
}

// benchSeq numbers the keys of the lifecycle benchmarks, so that every call
// of every run gets a new key.
var benchSeq atomic.Uint64

func newBenchKey() idem.Key {
	return idem.Key{Scope: "bench", ID: strconv.FormatUint(benchSeq.Add(1), 36)}
}

// runConcurrent runs op b.N times, on one goroutine for c=1 and on
// benchConcurrency goroutines (b.RunParallel) for c=64, and reports the
// Redis CPU time per script call.
func runConcurrent(b *testing.B, srv *redistest.Server, op func(ctx context.Context) error) {
	for _, c := range []int{1, benchConcurrency} {
		b.Run("c="+strconv.Itoa(c), func(b *testing.B) {
			ctx := context.Background()
			resetStats(b, srv)
			b.ReportAllocs()
			b.ResetTimer()
			if c == 1 {
				for b.Loop() {
					if err := op(ctx); err != nil {
						b.Fatal(err)
					}
				}
			} else {
				// RunParallel starts parallelism × GOMAXPROCS goroutines.
				procs := runtime.GOMAXPROCS(0)
				b.SetParallelism((c + procs - 1) / procs)
				b.RunParallel(func(pb *testing.PB) {
					for pb.Next() {
						if err := op(ctx); err != nil {
							b.Error(err)
							return
						}
					}
				})
			}
			b.StopTimer()
			b.ReportMetric(evalshaUsecPerCall(b, srv), "redis-µs/call")
		})
	}
}

// BenchmarkLifecycle measures Executor.Do on a new key: acquire, run,
// complete.
func BenchmarkLifecycle(b *testing.B) {
	srv, execs := benchExecutors(b)
	for _, x := range execs {
		b.Run(x.name, func(b *testing.B) {
			runConcurrent(b, srv, func(ctx context.Context) error {
				_, err := x.e.Do(ctx, newBenchKey(), "fp", benchFn)
				return err
			})
		})
	}
}

// BenchmarkReplay measures Executor.Do on a completed key.
func BenchmarkReplay(b *testing.B) {
	srv, execs := benchExecutors(b)
	for _, x := range execs {
		key := idem.Key{Scope: "bench", ID: "replay-" + x.name}
		if _, err := x.e.Do(context.Background(), key, "fp", benchFn); err != nil {
			b.Fatal(err)
		}
		b.Run(x.name, func(b *testing.B) {
			runConcurrent(b, srv, func(ctx context.Context) error {
				r, err := x.e.Do(ctx, key, "fp", benchFn)
				if err == nil && !r.Replayed {
					b.Error("the completed key was not replayed")
				}
				return err
			})
		})
	}
}

func resetStats(b *testing.B, srv *redistest.Server) {
	b.Helper()
	if _, err := srv.Command("CONFIG", "RESETSTAT"); err != nil {
		b.Fatal(err)
	}
}

// evalshaUsecPerCall returns usec_per_call of EVALSHA from INFO
// commandstats.
func evalshaUsecPerCall(b *testing.B, srv *redistest.Server) float64 {
	return usecPerCall(b, srv, "evalsha")
}

// usecPerCall returns usec_per_call of the command cmd (lower case) from
// INFO commandstats.
func usecPerCall(b *testing.B, srv *redistest.Server, cmd string) float64 {
	b.Helper()
	info, err := srv.Command("INFO", "commandstats")
	if err != nil {
		b.Fatal(err)
	}
	for line := range strings.Lines(info) {
		fields, ok := strings.CutPrefix(strings.TrimSpace(line), "cmdstat_"+cmd+":")
		if !ok {
			continue
		}
		for f := range strings.SplitSeq(fields, ",") {
			if v, ok := strings.CutPrefix(f, "usec_per_call="); ok {
				n, _ := strconv.ParseFloat(v, 64)
				return n
			}
		}
	}
	return 0
}

// BenchmarkBatch measures adapterkit.BeginBatch and CommitBatch of 100 new
// keys (the broker consumers' path): one script call acquires the batch,
// one completes it. An op is one key; redis-µs/key-transition is the Redis
// time of the batch scripts per key and transition (acquire or complete).
func BenchmarkBatch(b *testing.B) {
	srv, execs := benchExecutors(b)
	const batch = 100
	fps := make([]string, batch)
	values := make([][]byte, batch)
	for i := range values {
		fps[i], values[i] = "fp", benchResult
	}
	for _, x := range execs {
		b.Run(x.name, func(b *testing.B) {
			ctx := context.Background()
			keys := make([]idem.Key, batch)
			attempts := make([]*idem.Attempt, batch)
			resetStats(b, srv)
			b.ReportAllocs()
			b.ResetTimer()
			for done := 0; done < b.N; done += batch {
				for i := range keys {
					keys[i] = newBenchKey()
				}
				for i, r := range adapterkit.BeginBatch(ctx, x.e, keys, fps) {
					if r.Err != nil {
						b.Fatal(r.Err)
					}
					attempts[i] = r.Attempt
				}
				for _, err := range adapterkit.CommitBatch(ctx, x.e, attempts, values) {
					if err != nil {
						b.Fatal(err)
					}
				}
			}
			b.StopTimer()
			calls := float64(2 * ((b.N + batch - 1) / batch))
			b.ReportMetric(evalshaUsecPerCall(b, srv)*calls/float64(2*b.N), "redis-µs/key-transition")
		})
	}
}

// BenchmarkTransitions compares the Redis time per call of each transition
// in script mode and in Functions mode (WithFunctions), through go-redis
// from 16 goroutines. The two modes run at the same time, interleaved call
// by call (even calls in one mode, odd ones in the other), so that the load
// of a shared machine weighs on both alike; their commands are told apart
// in INFO commandstats (EVALSHA in script mode, FCALL, or FCALL_RO for get,
// in Functions mode). Each sub-benchmark reports, per mode,
// <mode>-redis-µs/call (usec_per_call: the command's execution in the
// server) and <mode>-client-µs/call (the store call's round trip, as the
// caller sees it), and functions/scripts, the ratio of the Redis times.
// The records each op needs (an acquired key for complete, extend, release
// and fail; a completed one for replay and get) are made before the
// measured calls, and the server's statistics are reset after.
//
// The sub-benchmark "fixed" measures Redis's own cost of each way of
// calling Lua: a script "return 1" with EVALSHA against the same body as a
// function with FCALL and with FCALL_RO (metrics evalsha-, fcall-,
// fcall_ro-redis-µs/call and the ratios fcall/evalsha, fcall_ro/evalsha).
// make bench-functions prints the medians over 7 runs.
func BenchmarkTransitions(b *testing.B) {
	srv := redistest.Start(b)
	rdb := redis.NewClient(&redis.Options{Addr: srv.Addr(), PoolSize: 16})
	b.Cleanup(func() { rdb.Close() })
	const lease, retention = time.Minute, time.Hour
	effect := redisstore.WithEffect("count", `
local n = tonumber(ARGV[1])
if not n then return redis.error_reply('not a number') end
redis.call('INCRBY', KEYS[1], n)`)
	type setup uint8
	const (
		none setup = iota
		acquired
		completed
	)
	transitions := []struct {
		name  string
		setup setup
		op    func(ctx context.Context, s *redisstore.Store, key string, l storekit.Lease) error
	}{
		{"acquire", none, func(ctx context.Context, s *redisstore.Store, key string, _ storekit.Lease) error {
			_, err := s.Acquire(ctx, key, storekit.AcquireRequest{Fingerprint: "fp", Owner: "o", Lease: lease, Retention: retention})
			return err
		}},
		{"replay", completed, func(ctx context.Context, s *redisstore.Store, key string, _ storekit.Lease) error {
			a, err := s.Acquire(ctx, key, storekit.AcquireRequest{Fingerprint: "fp", Owner: "o2", Lease: lease, Retention: retention})
			if err == nil && a.Outcome != storekit.Replay {
				return fmt.Errorf("got %v, want a replay", a.Outcome)
			}
			return err
		}},
		{"complete", acquired, func(ctx context.Context, s *redisstore.Store, key string, l storekit.Lease) error {
			return s.Complete(ctx, key, l, benchResult, retention)
		}},
		{"complete-effect", acquired, func(ctx context.Context, s *redisstore.Store, key string, l storekit.Lease) error {
			return s.CompleteEffect(ctx, key, l, benchResult, retention, storekit.Effect{Name: "count", Keys: []string{"{" + key + "}n"}, Args: []string{"1"}})
		}},
		{"extend", acquired, func(ctx context.Context, s *redisstore.Store, key string, l storekit.Lease) error {
			return s.Extend(ctx, key, l, lease)
		}},
		{"release", acquired, func(ctx context.Context, s *redisstore.Store, key string, l storekit.Lease) error {
			return s.Release(ctx, key, l, retention)
		}},
		{"fail", acquired, func(ctx context.Context, s *redisstore.Store, key string, l storekit.Lease) error {
			_, err := s.Fail(ctx, key, l, storekit.Failure{Result: benchResult, Retention: retention})
			return err
		}},
		{"get", completed, func(ctx context.Context, s *redisstore.Store, key string, _ storekit.Lease) error {
			_, err := s.Get(ctx, key)
			return err
		}},
	}
	stores := make([]*redisstore.Store, len(modes))
	for i, m := range modes {
		// No replay cache: every call is a server call.
		s, err := redisstore.New(rdb, append([]redisstore.Option{effect, redisstore.WithNotify(false), redisstore.WithReplayCache(false)}, m.opts...)...)
		if err != nil {
			b.Fatal(err)
		}
		// Load the library, if any, before the measured calls.
		if _, err := s.Get(context.Background(), "warm-up"); !errors.Is(err, storekit.ErrNotFound) {
			b.Fatal(err)
		}
		stores[i] = s
	}
	for _, tr := range transitions {
		b.Run(tr.name, func(b *testing.B) {
			ctx := context.Background()
			n := (b.N + len(modes) - 1) / len(modes) // calls per mode
			lanes := make([]benchLane, len(modes))
			for li, m := range modes {
				s := stores[li]
				keys := make([]string, n)
				leases := make([]storekit.Lease, n)
				for i := range keys {
					keys[i] = newBenchKey().Digest()
				}
				if tr.setup == completed {
					for i := range keys {
						keys[i] = keys[0]
					}
				}
				for i := range keys {
					if tr.setup == none || (tr.setup == completed && i > 0) {
						continue
					}
					a, err := s.Acquire(ctx, keys[i], storekit.AcquireRequest{Fingerprint: "fp", Owner: "o", Lease: lease, Retention: retention})
					if err != nil {
						b.Fatal(err)
					}
					leases[i] = a.Lease
					if tr.setup == completed {
						if err := s.Complete(ctx, keys[i], a.Lease, benchResult, retention); err != nil {
							b.Fatal(err)
						}
					}
				}
				cmd := "evalsha"
				if m.name == "functions" {
					cmd = "fcall"
					if tr.name == "get" {
						cmd = "fcall_ro"
					}
				}
				lanes[li] = benchLane{m.name, cmd, func(ctx context.Context, i int) error {
					if tr.setup == completed {
						i = 0
					}
					return tr.op(ctx, s, keys[i], leases[i])
				}}
			}
			runLanes(b, srv, lanes)
		})
	}
	b.Run("fixed", func(b *testing.B) {
		ctx := context.Background()
		sha, err := rdb.ScriptLoad(ctx, "return 1").Result()
		if err != nil {
			b.Fatal(err)
		}
		lib := "#!lua name=idembench\n" +
			"redis.register_function{function_name='idembench_one', callback=function(KEYS, ARGV) return 1 end}\n" +
			"redis.register_function{function_name='idembench_one_ro', callback=function(KEYS, ARGV) return 1 end, flags={'no-writes'}}\n"
		if err := rdb.FunctionLoad(ctx, lib).Err(); err != nil && !strings.Contains(err.Error(), "already exists") {
			b.Fatal(err)
		}
		keys := []string{"{bench}k"}
		runLanes(b, srv, []benchLane{
			{"evalsha", "evalsha", func(ctx context.Context, _ int) error { return rdb.EvalSha(ctx, sha, keys).Err() }},
			{"fcall", "fcall", func(ctx context.Context, _ int) error { return rdb.FCall(ctx, "idembench_one", keys).Err() }},
			{"fcall_ro", "fcall_ro", func(ctx context.Context, _ int) error { return rdb.FCallRo(ctx, "idembench_one_ro", keys).Err() }},
		})
	})
}

// benchLane is one of the ways of making a call that a sub-benchmark of
// BenchmarkTransitions compares.
type benchLane struct {
	name string                                 // the metrics' prefix
	cmd  string                                 // its command in INFO commandstats, lower case
	op   func(ctx context.Context, i int) error // the i-th call of this lane
}

// runLanes makes b.N calls from 16 goroutines, the lanes taking turns call
// by call, and reports for each lane <name>-redis-µs/call (usec_per_call of
// its command), <name>-client-µs/call, and, for every lane but the first,
// <name>/<first>, the ratio of its Redis time to the first lane's. The
// lanes' commands must differ.
func runLanes(b *testing.B, srv *redistest.Server, lanes []benchLane) {
	ctx := context.Background()
	clientNs := make([]atomic.Int64, len(lanes))
	calls := make([]atomic.Int64, len(lanes))
	resetStats(b, srv)
	var next atomic.Int64
	b.SetParallelism(max(1, 16/runtime.GOMAXPROCS(0)))
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			i := int(next.Add(1) - 1)
			l := i % len(lanes)
			start := time.Now()
			if err := lanes[l].op(ctx, i/len(lanes)); err != nil {
				b.Error(err)
				return
			}
			clientNs[l].Add(int64(time.Since(start)))
			calls[l].Add(1)
		}
	})
	b.StopTimer()
	redisUs := make([]float64, len(lanes))
	for l, ln := range lanes {
		redisUs[l] = usecPerCall(b, srv, ln.cmd)
		b.ReportMetric(redisUs[l], ln.name+"-redis-µs/call")
		if c := calls[l].Load(); c > 0 {
			b.ReportMetric(float64(clientNs[l].Load())/float64(c)/1e3, ln.name+"-client-µs/call")
		}
		if l > 0 && redisUs[0] > 0 {
			b.ReportMetric(redisUs[l]/redisUs[0], ln.name+"/"+lanes[0].name)
		}
	}
}

// BenchmarkScriptParts measures what each step of the transitions costs
// Redis inside a script, to say what a script call's Redis time is made of
// (consumer/redisstream/README.md and BENCHMARKS.md, "Where a request's
// time goes"): each sub-benchmark runs one step
// b.N times in loops of scriptPartsLoop iterations, one EVAL per loop, and
// reports the Redis time per step (redis-µs/op, from INFO commandstats),
// less the cost of the empty loop. The record is a real one (acquire.lua's
// format); the "new-key" steps write keys that do not exist yet, and their
// figure leaves out building the key's name (the step "key"). The step
// "call" is the cost of calling a script at all: EVALSHA of "return 1"
// with one key and four arguments, as acquire.lua has without an attempt
// limit. The "plain" steps are
// the floor's writes, as commands. Run:
//
//	go test -run '^$' -bench ScriptParts -benchtime 200000x -count 3 ./redisstore
func BenchmarkScriptParts(b *testing.B) {
	srv := redistest.Start(b)
	rdb := srv.GoRedis(b)
	ctx := context.Background()
	// ARGV[1] key prefix, ARGV[2] first index, ARGV[3] iterations, ARGV[4]
	// the key of a stored record, ARGV[5] a key that does not exist.
	const prelude = `
local fp, owner = 'f0e1d2c3b4a5968778695a4b3c2d1e0f', 'owner-0123456789abcdef'
local rec = cmsgpack.pack(1, 'p', fp, owner, 1764000000000000, 1764000010000000, 1, 1764000000000000, '')
local first, n = tonumber(ARGV[2]), tonumber(ARGV[3])
for i = first, first + n - 1 do
`
	parts := []struct{ name, body string }{
		{"loop", `local x = i`},
		{"key", `local x = ARGV[1] .. i`},
		{"TIME", `local t = redis.call('TIME') local now = tonumber(t[1]) * 1000000 + tonumber(t[2])`},
		{"pack", `local x = cmsgpack.pack(1, 'p', fp, owner, i, i, 1, i, '')`},
		{"unpack", `local ver, s, f, o, fe, l, a, c, r = cmsgpack.unpack(rec)`},
		{"GET-absent", `local x = redis.call('GET', ARGV[5])`},
		{"GET-record", `local x = redis.call('GET', ARGV[4])`},
		{"SET-PX-new-key", `redis.call('SET', ARGV[1] .. i, rec, 'PX', 600000)`},
		{"SET-NX-GET-PX-new-key", `redis.call('SET', ARGV[1] .. i, rec, 'NX', 'GET', 'PX', 600000)`},
		{"SET-PX-existing", `redis.call('SET', ARGV[4], rec, 'PX', 600000)`},
		{"SET-PX-existing-1-byte", `redis.call('SET', ARGV[4], 'c', 'PX', 600000)`},
		{"SET-NX-PX-new-key-1-byte", `redis.call('SET', ARGV[1] .. i, 'p', 'NX', 'PX', 600000)`},
		{"PUBLISH-unheard", `redis.call('PUBLISH', ARGV[5], 'c')`},
	}
	perOp := func(b *testing.B, body string) float64 {
		b.Helper()
		src := prelude + body + "\nend\nreturn 1"
		if err := rdb.FlushAll(ctx).Err(); err != nil {
			b.Fatal(err)
		}
		if err := rdb.Eval(ctx, "redis.call('SET', ARGV[1], cmsgpack.pack(1, 'c', 'fp', '', 1, 0, 1, 0, 'result')) return 1", nil, "{parts}rec").Err(); err != nil {
			b.Fatal(err)
		}
		resetStats(b, srv)
		for lo := 0; lo < b.N; lo += scriptPartsLoop {
			n := min(scriptPartsLoop, b.N-lo)
			if err := rdb.Eval(ctx, src, nil, "{parts}k:", lo, n, "{parts}rec", "{parts}absent").Err(); err != nil {
				b.Fatal(err)
			}
		}
		calls := float64((b.N + scriptPartsLoop - 1) / scriptPartsLoop)
		return usecPerCall(b, srv, "eval") * calls / float64(b.N)
	}
	var loop, key float64
	for _, p := range parts {
		b.Run(p.name, func(b *testing.B) {
			v := perOp(b, p.body)
			switch {
			case p.name == "loop":
				loop = v
				b.ReportMetric(v, "redis-µs/op")
				return
			case p.name == "key":
				key = v - loop
			case strings.Contains(p.name, "new-key"):
				v -= key
			}
			b.ReportMetric(v-loop, "redis-µs/op")
		})
	}
	// The floor's two writes for comparison (internal/httpbench/floor.go,
	// consumer/redisstream's floor mode): plain commands, 100 per
	// pipeline, no script: SET … NX PX of a new key, then SET … PX of the
	// same key.
	// inPipelines sends cmd(p, i) for i in [0, n), 100 per pipeline.
	inPipelines := func(b *testing.B, n int, cmd func(p redis.Pipeliner, i int)) {
		b.Helper()
		for lo := 0; lo < n; lo += 100 {
			_, err := rdb.Pipelined(ctx, func(p redis.Pipeliner) error {
				for i := lo; i < min(lo+100, n); i++ {
					cmd(p, i)
				}
				return nil
			})
			if err != nil {
				b.Fatal(err)
			}
		}
	}
	partKey := func(i int) string { return "{parts}k:" + strconv.Itoa(i) }
	for _, plain := range []struct {
		name, value string
		args        redis.SetArgs
		existing    bool // the keys are written before the timed writes
	}{
		{"plain-SET-NX-PX-new-key", "p", redis.SetArgs{Mode: "NX", TTL: 10 * time.Minute}, false},
		{"plain-SET-PX-existing", "c", redis.SetArgs{TTL: 10 * time.Minute}, true},
	} {
		b.Run(plain.name, func(b *testing.B) {
			if err := rdb.FlushAll(ctx).Err(); err != nil {
				b.Fatal(err)
			}
			if plain.existing {
				inPipelines(b, b.N, func(p redis.Pipeliner, i int) { p.Set(ctx, partKey(i), "p", 10*time.Minute) })
			}
			resetStats(b, srv)
			inPipelines(b, b.N, func(p redis.Pipeliner, i int) { p.SetArgs(ctx, partKey(i), plain.value, plain.args) })
			b.ReportMetric(usecPerCall(b, srv, "set"), "redis-µs/op")
		})
	}
	// The script call itself: EVALSHA of "return 1", 100 per pipeline.
	b.Run("call", func(b *testing.B) {
		sha, err := rdb.ScriptLoad(ctx, "return 1").Result()
		if err != nil {
			b.Fatal(err)
		}
		resetStats(b, srv)
		inPipelines(b, b.N, func(p redis.Pipeliner, _ int) {
			p.EvalSha(ctx, sha, []string{"{parts}k"}, "a", "b", "c", "d")
		})
		b.ReportMetric(evalshaUsecPerCall(b, srv), "redis-µs/op")
	})
}

// scriptPartsLoop is the number of steps each EVAL of BenchmarkScriptParts
// runs.
const scriptPartsLoop = 1000

// BenchmarkLoneCaller measures Executor.Do on a new key for one caller
// whose context can be canceled, as an HTTP request's is (BenchmarkLifecycle
// passes context.Background(), which the clients treat differently): on
// go-redis with the replay cache (the default) and without it, whose
// difference is the cost of the cache's tracking to a new key (none since
// the cache tracks only the keys it reads; 24 allocations and a wake-up
// when each write under the prefix sent an invalidation), and on rueidis,
// whose shared connection hands such a call to its writer and reader
// goroutines. It reports the median time per new key (p50-µs).
func BenchmarkLoneCaller(b *testing.B) {
	srv := redistest.Start(b)
	gr := redis.NewClient(&redis.Options{Addr: srv.Addr()})
	b.Cleanup(func() { gr.Close() })
	grs, err := redisstore.New(gr, redisstore.WithPrefix("gr:"))
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { grs.Close() })
	grn, err := redisstore.New(gr, redisstore.WithPrefix("gn:"), redisstore.WithReplayCache(false))
	if err != nil {
		b.Fatal(err)
	}
	rus, err := redisstore.NewRueidis(srv.Rueidis(b), redisstore.WithPrefix("ru:"))
	if err != nil {
		b.Fatal(err)
	}
	for _, s := range []struct {
		name  string
		store storekit.Store
	}{{"go-redis", grs}, {"go-redis,no-replay-cache", grn}, {"rueidis", rus}} {
		e, err := idem.New(s.store)
		if err != nil {
			b.Fatal(err)
		}
		b.Run(s.name, func(b *testing.B) {
			var took []time.Duration
			b.ReportAllocs()
			for b.Loop() {
				ctx, cancel := context.WithCancel(context.Background())
				start := time.Now()
				_, err := e.Do(ctx, newBenchKey(), "fp", benchFn)
				took = append(took, time.Since(start))
				cancel()
				if err != nil {
					b.Fatal(err)
				}
			}
			slices.Sort(took)
			b.ReportMetric(float64(took[len(took)/2].Nanoseconds())/1e3, "p50-µs")
		})
	}
}
