package main

import (
	"cmp"
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
	"github.com/redis/go-redis/v9"

	"github.com/idemgo/idem"
	"github.com/idemgo/idem/consumer"
	"github.com/idemgo/idem/consumer/rabbitmq"
	"github.com/idemgo/idem/consumer/redisstream"
	"github.com/idemgo/idem/consumer/sidecar"
	"github.com/idemgo/idem/redisstore"
	"github.com/idemgo/idem/testkit/redistest"
)

// The benchmarks of make bench-consume: idem consume (the binary, handing
// each message to an HTTP handler in this process) against the Go
// adapter running in this process with an empty handler, on the same
// broker and store, batch 100. BenchmarkConsume reports msgs/s, the CPU
// time per message of the sidecar process and of this process (the
// handler, or the in-process adapter); BenchmarkConsumeLatency the p50 of
// one message at a time, from its publish to the handler (one request per
// message, or --to-batch).

// benchSink counts the handled messages and records when each arrived.
type benchSink struct {
	n      atomic.Int64
	want   int64
	first  chan struct{}
	done   chan struct{}
	once   sync.Once
	onceD  sync.Once
	notify chan struct{} // one per message, for the latency benchmark
}

func newBenchSink(want int) *benchSink {
	return &benchSink{want: int64(want), first: make(chan struct{}), done: make(chan struct{}), notify: make(chan struct{}, 1)}
}

func (s *benchSink) handled() {
	n := s.n.Add(1)
	if n == 1 {
		s.once.Do(func() { close(s.first) })
	}
	if n == s.want {
		s.onceD.Do(func() { close(s.done) })
	}
	select {
	case s.notify <- struct{}{}:
	default:
	}
}

func (s *benchSink) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	s.handled()
	w.WriteHeader(200)
	w.Write([]byte(`{"ok":true}`))
}

// serveBatch is the sink as a batch handler (--to-batch): every message
// of the request handled, each answered 200 with the same body.
func (s *benchSink) serveBatch(w http.ResponseWriter, r *http.Request) {
	var msgs []sidecar.BatchMessage
	if err := json.NewDecoder(r.Body).Decode(&msgs); err != nil {
		http.Error(w, err.Error(), 400)
		return
	}
	out := make([]sidecar.BatchOutcome, len(msgs))
	for k := range msgs {
		s.handled()
		out[k] = sidecar.BatchOutcome{Status: 200, Body: `{"ok":true}`}
	}
	w.Header().Set("Content-Type", "application/json")
	json.NewEncoder(w).Encode(out)
}

// benchBroker is a broker of the benchmark.
type benchBroker struct {
	name    string
	publish func(b *testing.B, keys []string)
	// inProcess runs the Go adapter with handler until ctx is done.
	inProcess func(b *testing.B, ctx context.Context, exec *idem.Executor, handler func()) error
	// from returns the --from of the current stream or queue; fresh
	// starts another stream (a new group of the sidecar would read the
	// earlier runs' entries).
	from  func() string
	fresh func()
}

func benchBrokers(b *testing.B, srv *redistest.Server, rdb *redis.Client) []benchBroker {
	stream := unique("bench-")
	queue := unique("idem-bench-consume-")
	conn, err := amqp.Dial("amqp://guest:guest@127.0.0.1:5672/")
	if err != nil {
		b.Fatalf("RabbitMQ: %v", err)
	}
	b.Cleanup(func() { conn.Close() })
	ch, err := conn.Channel()
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() {
		for _, q := range []string{queue, queue + ".dlq", queue + ".retry"} {
			ch.QueueDelete(q, false, false, false)
		}
	})
	if _, err := ch.QueueDeclare(queue, true, false, false, false, nil); err != nil {
		b.Fatal(err)
	}
	group := 0
	return []benchBroker{
		{
			name: "redis-stream",
			publish: func(b *testing.B, keys []string) {
				_, err := rdb.Pipelined(context.Background(), func(p redis.Pipeliner) error {
					for _, k := range keys {
						p.XAdd(context.Background(), &redis.XAddArgs{Stream: stream, Values: []any{"key", k, "payload", `{"amount":1}`}})
					}
					return nil
				})
				if err != nil {
					b.Fatal(err)
				}
			},
			inProcess: func(b *testing.B, ctx context.Context, exec *idem.Executor, handler func()) error {
				group++
				c, err := redisstream.New(rdb, stream, "inproc-"+strconv.Itoa(group), "c", exec, func(context.Context, redis.XMessage) error {
					handler()
					return nil
				}, consumer.WithBatchSize(100))
				if err != nil {
					b.Fatal(err)
				}
				return c.Run(ctx)
			},
			from:  func() string { return "redis-stream://" + srv.Addr() + "/" + stream + "?group=" },
			fresh: func() { stream = unique("bench-") },
		},
		{
			name: "amqp",
			publish: func(b *testing.B, keys []string) {
				for _, k := range keys {
					if err := ch.PublishWithContext(context.Background(), "", queue, false, false, amqp.Publishing{MessageId: k, Body: []byte(`{"amount":1}`)}); err != nil {
						b.Fatal(err)
					}
				}
			},
			inProcess: func(b *testing.B, ctx context.Context, exec *idem.Executor, handler func()) error {
				c, err := rabbitmq.New("amqp://guest:guest@127.0.0.1:5672/", queue, exec, func(context.Context, *amqp.Delivery) error {
					handler()
					return nil
				}, consumer.WithBatchSize(100))
				if err != nil {
					b.Fatal(err)
				}
				return c.Run(ctx)
			},
			from:  func() string { return "amqp://guest:guest@127.0.0.1:5672/" + queue },
			fresh: func() {},
		},
	}
}

// selfCPU returns this process's user and system CPU time.
func selfCPU() time.Duration {
	var ru syscall.Rusage
	syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// procCPU returns the user and system CPU time of the process pid
// (/proc/PID/stat, in clock ticks of 10ms).
func procCPU(pid int) time.Duration {
	data, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return 0
	}
	s := string(data)
	f := strings.Fields(s[strings.LastIndexByte(s, ')')+2:])
	ut, _ := strconv.ParseInt(f[11], 10, 64)
	st, _ := strconv.ParseInt(f[12], 10, 64)
	return time.Duration(ut+st) * 10 * time.Millisecond
}

// procPeakRSS returns the peak resident memory of the process pid in MiB
// (VmHWM of /proc/PID/status), or 0 where it cannot be read.
func procPeakRSS(pid int) float64 {
	data, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/status")
	if err != nil {
		return 0
	}
	for _, line := range strings.Split(string(data), "\n") {
		if v, ok := strings.CutPrefix(line, "VmHWM:"); ok {
			kb, _ := strconv.ParseFloat(strings.TrimSuffix(strings.TrimSpace(v), " kB"), 64)
			return kb / 1024
		}
	}
	return 0
}

func benchExec(b *testing.B, rdb *redis.Client) *idem.Executor {
	st, err := redisstore.New(rdb)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { st.Close() })
	exec, err := idem.New(st)
	if err != nil {
		b.Fatal(err)
	}
	return exec
}

func benchKeys(n int) []string {
	p := unique("k")
	keys := make([]string, n)
	for i := range keys {
		keys[i] = p + "-" + strconv.Itoa(i)
	}
	return keys
}

// benchParallel is the sidecar's --parallel: every call of a batch at
// once (IDEM_BENCH_PARALLEL overrides it).
var benchParallel = cmp.Or(os.Getenv("IDEM_BENCH_PARALLEL"), "100")

// runSidecar starts idem consume on br to sink and returns its process:
// one request per message (mode "sidecar") or per batch ("batch",
// --to-batch).
func runSidecar(b *testing.B, br benchBroker, srv *redistest.Server, sink *benchSink, group, mode string) *proc {
	var h *httptest.Server
	if mode == "batch" {
		h = httptest.NewServer(http.HandlerFunc(sink.serveBatch))
	} else {
		h = httptest.NewServer(sink)
	}
	b.Cleanup(h.Close)
	from := br.from()
	if strings.HasSuffix(from, "group=") {
		from += group
	}
	args := []string{"consume", "--from", from, "--to", h.URL, "--redis", "redis://" + srv.Addr(), "--batch", "100", "--parallel", benchParallel, "--log-level", "warn"}
	if mode == "batch" {
		args = []string{"consume", "--from", from, "--to-batch", h.URL, "--redis", "redis://" + srv.Addr(), "--batch", "100", "--log-level", "warn"}
	}
	var env []string
	if dir := os.Getenv("IDEM_BENCH_CPU_PROFILE"); dir != "" {
		// A CPU profile of each sidecar run, written when it stops.
		env = append(env, profileEnv+"="+filepath.Join(dir, "consume-"+mode+"-"+br.name+"-"+group+".pprof"))
	}
	return startIdemB(b, env, args...)
}

func BenchmarkConsume(b *testing.B) {
	if os.Getenv("IDEM_BENCH_CONSUME") == "" {
		b.Skip("run with make bench-consume")
	}
	srv := redistest.Start(b)
	rdb := srv.GoRedis(b)
	for _, br := range benchBrokers(b, srv, rdb) {
		for _, mode := range []string{"inprocess", "sidecar", "batch"} {
			b.Run(mode+"/"+br.name, func(b *testing.B) {
				br.fresh()
				n := b.N
				sink := newBenchSink(n)
				keys := benchKeys(n)
				ctx, cancel := context.WithCancel(context.Background())
				var side *proc
				var runErr chan error
				if mode == "inprocess" {
					runErr = make(chan error, 1)
					exec := benchExec(b, rdb)
					go func() { runErr <- br.inProcess(b, ctx, exec, sink.handled) }()
				} else {
					side = runSidecar(b, br, srv, sink, unique("g"), mode)
				}
				// Let the consumer start (its group is created from "$" for
				// the stream), then publish.
				time.Sleep(300 * time.Millisecond) // a bench, not a test: the consumer's start is not timed
				b.ResetTimer()
				br.publish(b, keys)
				<-sink.first
				start, self := time.Now(), selfCPU()
				var sideCPU time.Duration
				if side != nil {
					sideCPU = procCPU(side.cmd.Process.Pid)
				}
				select {
				case <-sink.done:
				case <-time.After(5 * time.Minute):
					b.Fatalf("handled %d of %d", sink.n.Load(), n)
				}
				elapsed := time.Since(start)
				selfUsed := selfCPU() - self
				if side != nil {
					sideCPU = procCPU(side.cmd.Process.Pid) - sideCPU
				}
				b.StopTimer()
				var sideRSS float64
				if side != nil {
					sideRSS = procPeakRSS(side.cmd.Process.Pid)
				}
				cancel()
				if side != nil {
					side.cmd.Process.Signal(syscall.SIGTERM)
					<-side.done
				} else {
					<-runErr
				}
				b.ReportMetric(float64(n-1)/elapsed.Seconds(), "msgs/s")
				b.ReportMetric(float64(selfUsed.Microseconds())/float64(n), "self-cpu-µs/msg")
				b.ReportMetric(float64(sideCPU.Microseconds())/float64(n), "sidecar-cpu-µs/msg")
				b.ReportMetric(sideRSS, "sidecar-peak-rss-MiB")
			})
		}
	}
}

func BenchmarkConsumeLatency(b *testing.B) {
	if os.Getenv("IDEM_BENCH_CONSUME") == "" {
		b.Skip("run with make bench-consume")
	}
	srv := redistest.Start(b)
	rdb := srv.GoRedis(b)
	for _, br := range benchBrokers(b, srv, rdb) {
		for _, mode := range []string{"inprocess", "sidecar", "batch"} {
			b.Run(mode+"/"+br.name, func(b *testing.B) {
				br.fresh()
				sink := newBenchSink(-1)
				ctx, cancel := context.WithCancel(context.Background())
				var side *proc
				runErr := make(chan error, 1)
				if mode == "inprocess" {
					exec := benchExec(b, rdb)
					go func() { runErr <- br.inProcess(b, ctx, exec, sink.handled) }()
				} else {
					side = runSidecar(b, br, srv, sink, unique("g"), mode)
				}
				// Warm up: the first message waits for the consumer's start.
				br.publish(b, benchKeys(1))
				<-sink.notify
				lat := make([]time.Duration, 0, b.N)
				b.ResetTimer()
				for _, k := range benchKeys(b.N) {
					t0 := time.Now()
					br.publish(b, []string{k})
					<-sink.notify
					lat = append(lat, time.Since(t0))
				}
				b.StopTimer()
				cancel()
				if side != nil {
					side.cmd.Process.Signal(syscall.SIGTERM)
					<-side.done
				} else {
					<-runErr
				}
				slices.Sort(lat)
				b.ReportMetric(float64(lat[len(lat)/2].Microseconds()), "p50-µs")
			})
		}
	}
}

// startIdemB starts the binary for a benchmark; it is killed when the
// benchmark ends.
func startIdemB(b *testing.B, env []string, args ...string) *proc {
	p := &proc{args: args, stdout: &syncBuffer{}, stderr: &syncBuffer{}, done: make(chan struct{})}
	p.cmd = exec.Command(idemBin, args...)
	p.cmd.Env = append(testEnv(), env...)
	p.cmd.Stdout, p.cmd.Stderr = p.stdout, p.stderr
	if err := p.cmd.Start(); err != nil {
		b.Fatal(err)
	}
	go func() { p.cmd.Wait(); close(p.done) }()
	b.Cleanup(func() {
		select {
		case <-p.done:
		default:
			p.cmd.Process.Kill()
			<-p.done
		}
		if b.Failed() {
			b.Logf("idem %s stderr:\n%s", strings.Join(args, " "), p.stderr.String())
		}
	})
	return p
}
