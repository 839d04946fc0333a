package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"runtime"
	"runtime/pprof"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/idemgo/idem"
	"github.com/idemgo/idem/internal/storescripts"
	"github.com/idemgo/idem/memstore"
	"github.com/idemgo/idem/redisstore"
	"github.com/idemgo/idem/storekit"
	"github.com/idemgo/idem/testkit/proccpu"
	"github.com/redis/go-redis/v9"
	"github.com/redis/rueidis"
	"github.com/valkey-io/valkey-go"
)

// value is the operation's result in every measurement: 50 bytes, stored as
// a 51-byte blob (a flags byte, then the value).
var value = []byte(`{"id":"ch_001","amount":4200,"status":"succeeded"}`)

// blobLen is the size of value's stored blob.
var blobLen = len(value) + 1

// Executor settings of every measurement, repeated in the ceiling's script
// arguments.
const (
	lease     = 30 * time.Second
	retention = 24 * time.Hour
)

// memoryRecords is how many records the memory measurement completes.
const memoryRecords = 100_000

// targetCallers is the concurrency of the targets' ratios to the ceiling.
const targetCallers = 64

// parseCallers parses -callers: concurrencies separated by commas, each at
// least 1, targetCallers among them, none repeated.
func parseCallers(s string) ([]int, error) {
	var out []int
	for f := range strings.SplitSeq(s, ",") {
		c, err := strconv.Atoi(strings.TrimSpace(f))
		if err != nil || c < 1 {
			return nil, fmt.Errorf("-callers: %q is not a number of callers (1 or more)", f)
		}
		if slices.Contains(out, c) {
			return nil, fmt.Errorf("-callers: %d is listed twice", c)
		}
		out = append(out, c)
	}
	if !slices.Contains(out, targetCallers) {
		return nil, fmt.Errorf("-callers: the list must hold %d, the concurrency of the targets", targetCallers)
	}
	return out, nil
}

type options struct {
	duration time.Duration
	warmup   time.Duration
	runs     int
	json     bool
	callers  []int // the numbers of goroutines calling Do at once (-callers)
	// lifecycle: only what the lifecycle targets need (-lifecycle).
	lifecycle bool
	// cpuprofile: a directory where each store row's window is profiled
	// (-cpuprofile), or "".
	cpuprofile string
}

// stores returns the names of the stores measured, and kinds the kinds of
// their rows: with -lifecycle, the Redis stores' lifecycles only.
func (o options) stores() []string {
	if o.lifecycle {
		return []string{"go-redis", "rueidis"}
	}
	return []string{"memstore", "go-redis", "rueidis", "valkey"}
}

func (o options) kinds() []string {
	if o.lifecycle {
		return []string{"lifecycle"}
	}
	return []string{"lifecycle", "replay"}
}

func main() {
	var o options
	flag.DurationVar(&o.duration, "duration", 2*time.Second, "length of each throughput measurement")
	flag.IntVar(&o.runs, "runs", 3, "number of runs; every figure is their median")
	flag.BoolVar(&o.json, "json", false, "print the results as JSON instead of a table")
	cg := flag.Bool("callgrind", false, "instead of the table, count redis-server's instructions per new key under valgrind (idem against the floor's two SETs)")
	keys := flag.Int("keys", 2000, "with -callgrind: new keys per row and run")
	profiles := flag.String("profiles", "", "with -callgrind: a directory where each row's callgrind profile is kept")
	callers := flag.String("callers", "1,"+strconv.Itoa(targetCallers),
		fmt.Sprintf("concurrencies of the Do rows, comma-separated; %d (the targets') must be among them", targetCallers))
	flag.StringVar(&o.cpuprofile, "cpuprofile", "", "a directory where each Redis store row's measured window is CPU-profiled, one file per row and run (NAME-KIND-cC-rRUN.pprof)")
	flag.BoolVar(&o.lifecycle, "lifecycle", false, "measure only the lifecycle rows of go-redis and rueidis and the lifecycle ceiling, the lifecycle targets' figures")
	flag.Parse()
	if o.duration <= 0 || o.runs < 1 {
		fmt.Fprintln(os.Stderr, "benchcmd: -duration must be positive and -runs at least 1")
		os.Exit(2)
	}
	var err error
	if o.callers, err = parseCallers(*callers); err != nil {
		fmt.Fprintln(os.Stderr, "benchcmd:", err)
		os.Exit(2)
	}
	o.warmup = min(o.duration/8, 250*time.Millisecond)

	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	go func() {
		<-ctx.Done()
		stop() // a second interrupt kills at once
	}()
	if *cg {
		if *keys < 1 {
			fmt.Fprintln(os.Stderr, "benchcmd: -keys must be at least 1")
			os.Exit(2)
		}
		err = runCallgrind(ctx, o, *keys, *profiles)
	} else {
		err = run(ctx, o)
	}
	stop()
	if err != nil {
		fmt.Fprintln(os.Stderr, "benchcmd:", err)
		os.Exit(1)
	}
}

// bench holds the clients, executors and samples of one invocation.
type bench struct {
	o     options
	srv   *server
	admin admin
	gr    *redis.Client
	ru    rueidis.Client
	vk    valkey.Client
	execs map[string]*idem.Executor // by client name
	keyOf func(digest string) string

	acquireSHA, completeSHA string
	requests                map[string]int // redis-benchmark -n by phase
	completeKeyspace        int

	samples map[string][]float64
}

func (b *bench) add(name string, v float64) { b.samples[name] = append(b.samples[name], v) }

func (b *bench) med(name string) float64 { return median(b.samples[name]) }

// started is when the command started, for the progress lines.
var started = time.Now()

// progress reports on stderr what the command is measuring; stdout carries
// only the report.
func progress(format string, args ...any) {
	fmt.Fprintf(os.Stderr, "benchcmd [%5.1fs]: "+format+"\n", append([]any{time.Since(started).Seconds()}, args...)...)
}

func run(ctx context.Context, o options) error {
	for _, bin := range []string{"redis-server", "redis-benchmark"} {
		if _, err := exec.LookPath(bin); err != nil {
			return fmt.Errorf("%s not found on PATH (apt-get install -y redis-server redis-tools): %w", bin, err)
		}
	}
	srv, err := startServer(ctx)
	if err != nil {
		return err
	}
	defer srv.remove()
	defer srv.stop()
	b := &bench{o: o, srv: srv, samples: make(map[string][]float64), requests: make(map[string]int)}
	if err := b.connect(); err != nil {
		return err
	}
	defer b.close()

	load0 := loadAverage()
	// The ceiling runs exactly the scripts a store sends.
	if b.acquireSHA, b.completeSHA, err = storescripts.Capture(ctx, b.srv.addr()); err != nil {
		return err
	}
	if err := b.calibrate(ctx); err != nil {
		return err
	}
	for r := range o.runs {
		for _, name := range o.stores() {
			for _, kind := range o.kinds() {
				for _, c := range o.callers {
					progress("run %d/%d: %s %s c=%d", r+1, o.runs, name, kind, c)
					if err := b.measureStore(ctx, r, name, kind, c); err != nil {
						return fmt.Errorf("%s %s c=%d: %w", name, kind, c, err)
					}
				}
			}
		}
		progress("run %d/%d: redis-benchmark ceilings", r+1, o.runs)
		if err := b.ceiling(ctx); err != nil {
			return err
		}
		if o.lifecycle {
			continue
		}
		progress("run %d/%d: memstore Do under testing.Benchmark", r+1, o.runs)
		b.memstoreDo()
	}
	var mem []memoryResult
	for _, fp := range []string{"fp", httpFingerprint} {
		if o.lifecycle {
			break
		}
		progress("memory per completed record, %d-byte fingerprint", len(fp))
		m, err := b.memory(ctx, fp)
		if err != nil {
			return err
		}
		mem = append(mem, m)
	}
	rep := b.report(mem)
	rep.RedisVersion = b.admin.version(ctx)
	rep.LoadBefore, rep.LoadAfter = load0, loadAverage()
	rep.Elapsed = time.Since(started).Round(time.Second).String()
	if o.json {
		return rep.writeJSON(os.Stdout)
	}
	rep.writeText(os.Stdout)
	return nil
}

func (b *bench) connect() error {
	addr := b.srv.addr()
	b.admin = admin{redis.NewClient(&redis.Options{Addr: addr, PoolSize: 2})}
	// One connection per concurrent caller: go-redis does not pipeline
	// concurrent calls, so a smaller pool would make callers queue.
	b.gr = redis.NewClient(&redis.Options{Addr: addr, PoolSize: 64})
	ru, err := rueidis.NewClient(rueidis.ClientOption{InitAddress: []string{addr}, DisableCache: true})
	if err != nil {
		return fmt.Errorf("rueidis: %w", err)
	}
	b.ru = ru
	vk, err := valkey.NewClient(valkey.ClientOption{InitAddress: []string{addr}, DisableCache: true})
	if err != nil {
		return fmt.Errorf("valkey-go: %w", err)
	}
	b.vk = vk
	grs, err := redisstore.New(b.gr)
	if err != nil {
		return err
	}
	rus, err := redisstore.NewRueidis(b.ru)
	if err != nil {
		return err
	}
	vks, err := redisstore.NewValkey(b.vk)
	if err != nil {
		return err
	}
	b.keyOf = rus.Key
	b.execs = map[string]*idem.Executor{}
	for name, s := range map[string]idem.Store{"go-redis": grs, "rueidis": rus, "valkey": vks} {
		e, err := newExecutor(s)
		if err != nil {
			return err
		}
		b.execs[name] = e
	}
	return nil
}

func (b *bench) close() {
	b.ru.Close()
	b.vk.Close()
	b.gr.Close()
	b.admin.c.Close()
}

func newExecutor(s idem.Store) (*idem.Executor, error) {
	return idem.New(s, idem.WithLease(lease), idem.WithRetention(retention))
}

func fn(context.Context) ([]byte, error) { return value, nil }

// replayKey is the key every replay measurement repeats.
var replayKey = idem.Key{Scope: "bench", ID: "replay"}

// measureStore measures one row: kind "lifecycle" (Do on a new key each
// call) or "replay" (Do on one completed key) at concurrency c. For Redis
// it starts from an empty database and records the Redis CPU time per
// script call.
func (b *bench) measureStore(ctx context.Context, run int, name, kind string, c int) error {
	var e *idem.Executor
	redisRow := name != "memstore"
	if redisRow {
		e = b.execs[name]
		if err := b.admin.flush(ctx); err != nil {
			return err
		}
	} else {
		// A fresh store per row, so that the records of one row (millions
		// for memstore) are garbage before the next starts.
		s, err := memstore.New()
		if err != nil {
			return err
		}
		if e, err = newExecutor(s); err != nil {
			return err
		}
		runtime.GC()
	}
	var op func(ctx context.Context, w, i int) error
	switch kind {
	case "lifecycle":
		prefix := fmt.Sprintf("r%d-c%d-", run, c)
		bufs := make([][]byte, c)
		op = func(ctx context.Context, w, i int) error {
			buf := append(bufs[w][:0], prefix...)
			buf = strconv.AppendInt(buf, int64(w), 10)
			buf = append(buf, '-')
			buf = strconv.AppendInt(buf, int64(i), 10)
			bufs[w] = buf
			r, err := e.Do(ctx, idem.Key{Scope: "bench", ID: string(buf)}, "fp", fn)
			if err == nil && r.Replayed {
				err = errors.New("a new key was replayed")
			}
			return err
		}
	case "replay":
		// A key of its own per row: a store's local replay cache learns
		// of the FLUSHALL above when the server's message arrives, and
		// until then could replay the previous row's record from memory
		// instead of creating this one.
		key := idem.Key{Scope: "bench", ID: fmt.Sprintf("replay-r%d-c%d", run, c)}
		if _, err := e.Do(ctx, key, "fp", fn); err != nil {
			return err
		}
		op = func(ctx context.Context, w, i int) error {
			r, err := e.Do(ctx, key, "fp", fn)
			if err == nil && !r.Replayed {
				err = errors.New("the completed key was not replayed")
			}
			return err
		}
	}
	if redisRow {
		if err := b.admin.resetStats(ctx); err != nil {
			return err
		}
	}
	profile, err := b.profiler(fmt.Sprintf("%s-%s-c%d-r%d", name, kind, c, run+1), redisRow)
	if err != nil {
		return err
	}
	cpu := func() (t cpuTimes, err error) {
		profile()
		t.client = proccpu.Self()
		t.mallocs = mallocs()
		if redisRow {
			t.redisWait = b.srv.runqueueWait()
			t.redis, t.reads, err = b.admin.cpu(ctx)
		}
		return t, err
	}
	win, err := throughput(ctx, c, b.o.warmup, b.o.duration, op, cpu)
	profile() // stops a profile that an error left running
	if err != nil {
		return err
	}
	row := fmt.Sprintf("%s/%s/%d", name, kind, c)
	b.add(row, win.ops)
	b.add(row+"/client", 1e6*win.cpu.client/float64(win.n))
	b.add(row+"/allocs", win.cpu.mallocs/float64(win.n))
	if redisRow {
		st, err := b.admin.commandStats(ctx)
		if err != nil {
			return err
		}
		b.add(row+"/us", st["evalsha"].perCall())
		b.add(row+"/cpu", 1e6*win.cpu.redis/float64(win.n))
		b.add(row+"/busy", win.cpu.redis/win.wall.Seconds())
		b.add(row+"/wait", win.cpu.redisWait/win.wall.Seconds())
		if kind == "lifecycle" && win.cpu.reads > 0 {
			b.add(row+"/depth", 2*float64(win.n)/win.cpu.reads)
		}
	}
	return nil
}

// mallocs returns the heap allocations this process has made so far.
func mallocs() float64 {
	var m runtime.MemStats
	runtime.ReadMemStats(&m)
	return float64(m.Mallocs)
}

// profiler returns what measureStore calls at each end of a row's window:
// with -cpuprofile, for a Redis row, the first call starts a CPU profile
// into the directory's file name.pprof, the next one stops it; otherwise
// nothing.
func (b *bench) profiler(name string, redisRow bool) (func(), error) {
	if b.o.cpuprofile == "" || !redisRow {
		return func() {}, nil
	}
	if err := os.MkdirAll(b.o.cpuprofile, 0o755); err != nil {
		return nil, err
	}
	var f *os.File
	started := false
	return func() {
		switch {
		case !started:
			started = true
			var err error
			if f, err = os.Create(filepath.Join(b.o.cpuprofile, name+".pprof")); err != nil {
				progress("cpuprofile: %v", err)
				return
			}
			if err := pprof.StartCPUProfile(f); err != nil {
				progress("cpuprofile: %v", err)
				f.Close()
				f = nil
			}
		case f != nil:
			pprof.StopCPUProfile()
			f.Close()
			f = nil
		}
	}, nil
}

// acquireArgs returns the redis-benchmark command of an acquire on key,
// with the arguments Executor.Do sends (lease 30s, the IN_PROGRESS time to
// live, no attempt limit; see acquire.lua).
func (b *bench) acquireArgs(key string) []string {
	return []string{"EVALSHA", b.acquireSHA, "1", key, "fp", ceilingOwner,
		strconv.FormatInt(lease.Milliseconds(), 10),
		strconv.FormatInt((2*lease + storekit.InProgressGrace).Milliseconds(), 10)}
}

// ceilingResult is a 51-byte stand-in for the stored blob (redis-benchmark
// cannot pass the blob's leading zero byte in argv).
var ceilingResult = "0" + string(value)

func (b *bench) completeArgs() []string {
	return []string{"EVALSHA", b.completeSHA, "1", ceilingKey, ceilingOwner, strconv.FormatUint(ceilingFence, 10), ceilingResult,
		strconv.FormatInt(retention.Milliseconds(), 10), "PUBLISH", ceilingKey + ":w"}
}

// calibrate sizes the redis-benchmark runs (-n) so that each lasts about
// -duration.
func (b *bench) calibrate(ctx context.Context) error {
	progress("calibrating redis-benchmark")
	if err := b.admin.flush(ctx); err != nil {
		return err
	}
	acq, err := benchmark(ctx, b.srv.addr(), minRequests, freshKeyspace, b.acquireArgs(ceilingKey)...)
	if err != nil {
		return err
	}
	b.requests["acquire"] = requestsFor(acq, b.o.duration)
	// The complete ceiling draws n = R/10 keys from R preloaded records, so
	// that most calls complete a record for the first time. Its rate is
	// close to acquire's; R is capped because preloading it takes longer
	// than the run itself.
	n := requestsFor(acq, b.o.duration)
	b.completeKeyspace = min(max(10*n, 200_000), 500_000)
	b.requests["complete"] = b.completeKeyspace / 10
	if b.o.lifecycle {
		return nil
	}
	if err := b.setupReplay(ctx); err != nil {
		return err
	}
	rep, err := benchmark(ctx, b.srv.addr(), minRequests, 0, b.acquireArgs(b.keyOf(replayKey.Digest()))...)
	if err != nil {
		return err
	}
	b.requests["replay"] = requestsFor(rep, b.o.duration)
	return nil
}

// setupReplay empties the database and completes replayKey through the
// rueidis store.
func (b *bench) setupReplay(ctx context.Context) error {
	if err := b.admin.flush(ctx); err != nil {
		return err
	}
	_, err := b.execs["rueidis"].Do(ctx, replayKey, "fp", fn)
	return err
}

// ceiling runs redis-benchmark with the store's scripts, each phase on its
// own after CONFIG RESETSTAT so that cmdstat_evalsha holds that script only.
func (b *bench) ceiling(ctx context.Context) error {
	addr := b.srv.addr()
	// phase returns the requests per second, the command stats and the
	// server's CPU µs per request.
	phase := func(name string, n, keyspace int, args []string) (rps float64, st map[string]cmdstat, cpu float64, err error) {
		if err := b.admin.resetStats(ctx); err != nil {
			return 0, nil, 0, err
		}
		w0 := b.srv.runqueueWait()
		c0, r0, err := b.admin.cpu(ctx)
		if err != nil {
			return 0, nil, 0, err
		}
		if rps, err = benchmark(ctx, addr, n, keyspace, args...); err != nil {
			return 0, nil, 0, err
		}
		c1, r1, err := b.admin.cpu(ctx)
		if err != nil {
			return 0, nil, 0, err
		}
		w1 := b.srv.runqueueWait()
		if st, err = b.admin.commandStats(ctx); err != nil {
			return 0, nil, 0, err
		}
		cpu = 1e6 * (c1 - c0) / float64(n)
		b.add("ceiling/"+name, rps)
		b.add("ceiling/"+name+"/us", st["evalsha"].perCall())
		b.add("ceiling/"+name+"/cpu", cpu)
		if r1 > r0 {
			b.add("ceiling/"+name+"/depth", st["evalsha"].calls/(r1-r0))
		}
		// redis-benchmark's rate covers its requests only, not its
		// start and end: the busy share is the CPU over n/rps.
		b.add("ceiling/"+name+"/busy", (c1-c0)/(float64(n)/rps))
		b.add("ceiling/"+name+"/wait", (w1-w0)/(float64(n)/rps))
		return rps, st, cpu, nil
	}

	// Acquire: a new key every call.
	if err := b.admin.flush(ctx); err != nil {
		return err
	}
	acq, acqSt, acqCPU, err := phase("acquire", b.requests["acquire"], freshKeyspace, b.acquireArgs(ceilingKey))
	if err != nil {
		return err
	}
	if ev := acqSt["evalsha"].calls; ev > 0 {
		b.add("ceiling/acquire/new", acqSt["set"].calls/ev)
	}

	// Complete: records IN_PROGRESS for ceilingOwner, fence ceilingFence.
	if err := b.admin.flush(ctx); err != nil {
		return err
	}
	progress("preloading %d IN_PROGRESS records for the complete ceiling", b.completeKeyspace)
	if err := preload(ctx, b.ru, b.completeKeyspace); err != nil {
		return err
	}
	cmp, cmpSt, cmpCPU, err := phase("complete", b.requests["complete"], b.completeKeyspace, b.completeArgs())
	if err != nil {
		return err
	}
	// Only a first completion writes (SET); a repeated key is answered
	// from the GET alone.
	if ev := cmpSt["evalsha"].calls; ev > 0 {
		b.add("ceiling/complete/first", cmpSt["set"].calls/ev)
	}
	// A lifecycle is one acquire and one complete.
	b.add("ceiling/lifecycle", 1/(1/acq+1/cmp))
	b.add("ceiling/lifecycle/us", (acqSt["evalsha"].perCall()+cmpSt["evalsha"].perCall())/2)
	b.add("ceiling/lifecycle/cpu", acqCPU+cmpCPU)

	if b.o.lifecycle {
		return nil
	}
	// Replay: the acquire script on one completed key.
	if err := b.setupReplay(ctx); err != nil {
		return err
	}
	_, _, _, err = phase("replay", b.requests["replay"], 0, b.acquireArgs(b.keyOf(replayKey.Digest())))
	return err
}

// memstoreDo runs Do on memstore under testing.Benchmark, as the root
// package's BenchmarkDo does (with the store sized for the run).
func (b *bench) memstoreDo() {
	r := testing.Benchmark(func(tb *testing.B) {
		s, _ := memstore.New(memstore.WithCapacity(tb.N))
		e, _ := newExecutor(s)
		keys := make([]idem.Key, tb.N)
		for i := range keys {
			keys[i] = idem.Key{Scope: "bench", ID: "order-" + strconv.Itoa(i)}
		}
		ctx := context.Background()
		tb.ReportAllocs()
		tb.ResetTimer()
		for i := range tb.N {
			if _, err := e.Do(ctx, keys[i], "fp", fn); err != nil {
				tb.Fatal(err)
			}
		}
	})
	b.add("memstore/do/ns", float64(r.NsPerOp()))
	b.add("memstore/do/allocs", float64(r.AllocsPerOp()))
	b.add("memstore/do/bytes", float64(r.AllocedBytesPerOp()))
}

// httpFingerprint stands for the fingerprints idemhttp makes: a raw
// 32-byte SHA-256 digest.
var httpFingerprint = string(make([]byte, 32))

// memoryResult is the Redis memory per completed record.
type memoryResult struct {
	Fingerprint int     `json:"fingerprint_bytes"`
	PerRecord   float64 `json:"bytes_per_record"`
	BeyondBlob  float64 `json:"bytes_beyond_result"`
	BlobLen     int     `json:"result_blob_bytes"`
	MemoryUsage int64   `json:"memory_usage_one_record"`
	Records     int     `json:"records"`
}

// memory completes memoryRecords records with fingerprint fp through the
// rueidis store on an empty database and divides the growth of used_memory
// among them.
func (b *bench) memory(ctx context.Context, fp string) (memoryResult, error) {
	if err := b.admin.flush(ctx); err != nil {
		return memoryResult{}, err
	}
	e := b.execs["rueidis"]
	m0, err := b.admin.usedMemory(ctx)
	if err != nil {
		return memoryResult{}, err
	}
	key := func(i int) idem.Key { return idem.Key{Scope: "bench", ID: "mem-" + strconv.Itoa(i)} }
	if err := forEach(ctx, 64, memoryRecords, func(ctx context.Context, i int) error {
		_, err := e.Do(ctx, key(i), fp, fn)
		return err
	}); err != nil {
		return memoryResult{}, err
	}
	m1, err := b.admin.usedMemory(ctx)
	if err != nil {
		return memoryResult{}, err
	}
	usage, err := b.admin.c.MemoryUsage(ctx, b.keyOf(key(0).Digest()), 0).Result()
	if err != nil {
		return memoryResult{}, err
	}
	per := float64(m1-m0) / memoryRecords
	return memoryResult{
		Fingerprint: len(fp),
		PerRecord:   per,
		BeyondBlob:  per - float64(blobLen),
		BlobLen:     blobLen,
		MemoryUsage: usage,
		Records:     memoryRecords,
	}, nil
}

// forEach calls op for i in [0, n) on conc goroutines.
func forEach(ctx context.Context, conc, n int, op func(ctx context.Context, i int) error) error {
	per := (n + conc - 1) / conc
	errs := make(chan error, conc)
	for w := range conc {
		go func() {
			for i := w * per; i < min((w+1)*per, n); i++ {
				if err := op(ctx, i); err != nil {
					errs <- err
					return
				}
			}
			errs <- nil
		}()
	}
	var first error
	for range conc {
		if err := <-errs; err != nil && first == nil {
			first = err
		}
	}
	return first
}

// loadAverage returns the 1-minute load average, or "" where /proc is
// missing.
func loadAverage() string {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return ""
	}
	f := strings.Fields(string(b))
	if len(f) == 0 {
		return ""
	}
	return f[0]
}
