// Command httpbench measures idem's HTTP paths against the bare handler and
// against its peers, side by side in one run, with wrk as the load generator
// on loopback and a throwaway redis-server on the same machine:
//
//   - the bare handler;
//   - idemhttp on redisstore with each client (go-redis, rueidis, valkey-go), and on
//     go-redis with httpkit.StreamAll (responses written through and stored
//     afterwards), which shows what record before success costs;
//   - Fiber v2's idempotency middleware on the same Redis (built from the
//     benchmark-only module internal/httpbench/fiberpeer, so Fiber never
//     enters idem's dependencies), and the same handler alone on Fiber,
//     the base of the Fiber row's added p50: what Fiber's middleware adds
//     over Fiber, as idem's rows' is what idemhttp adds over net/http;
//   - a plain httputil.ReverseProxy (idle pool tuned) and the idem proxy
//     (cmd/idem) on Redis and on its embedded store, all in front of the
//     same upstream;
//   - the idem proxy on Redis loaded over HTTP/1.1 and over h2c (--h2c,
//     and --upstream-h2c to an upstream that speaks only h2c) by a Go load
//     generator (loadgen.go; wrk speaks only HTTP/1.1), which shows what
//     HTTP/2 end to end costs or saves, the same client on both rows;
//   - the floor with each client (floor.go): the bare handler behind only
//     the two plain Redis round trips and the held response that record
//     before success needs, which bounds what any such middleware can reach
//     here; and the plain proxy behind the floor, on Redis (rueidis) and on
//     a log file synced twice per request, which bound the idem proxy on
//     each of its stores;
//   - the script floor (floor.go): the bare handler behind the store's own
//     two scripts on rueidis and nothing else, which bounds idemhttp with
//     either client: the Redis work of idem's state machine at the least
//     client cost.
//
// Every cell (new keys and replays, at 1 and 64 connections) is measured
// once per round; the rounds are interleaved (round 1 of every server, then
// round 2, ...) so that a change in the machine's load hits every server
// alike. It prints the medians (requests/s, p50, p99, the p50 added over
// the bare handler or the plain proxy); then, for the 64-connection cells,
// the CPU time per request of wrk, the server, this process (the proxies'
// upstream) and redis-server, read from /proc, which shows where a
// request's time goes when the machine's cores are the limit, and the
// reads redis-server made from its clients per request (INFO stats), how
// deep the pipelines were; then the ratios the performance targets name,
// per round and their median, each ratio of requests/s beside the same
// rounds' inverse ratio of CPU time per request (cpu x), what the two
// cores would allow the two rows.
//
//	go run ./internal/httpbench            # or: make bench-http
//
// -only and -cells narrow a run, and -cpuprofile profiles this process, with
// each in-process server's requests labelled, for example:
//
//	go run ./internal/httpbench -only 'go-redis\)$' -cells new64 -cpuprofile cpu.out
//	go tool pprof -tagfocus 'server=.*go-redis' -top cpu.out
//
// It needs wrk (apt-get install wrk) and redis-server on PATH, and runs from
// the repository's root (it builds cmd/idem and the Fiber peer).
package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"log"
	"net"
	"net/http"
	"net/http/httputil"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"runtime/pprof"
	"slices"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/idemgo/idem"
	"github.com/idemgo/idem/idemhttp"
	"github.com/idemgo/idem/idemhttp/httpkit"
	"github.com/idemgo/idem/internal/storescripts"
	"github.com/idemgo/idem/redisstore"
	"github.com/idemgo/idem/redisstore/redisinfo"
	"github.com/idemgo/idem/testkit/proccpu"
	"github.com/idemgo/idem/testkit/redistest"
	"github.com/redis/go-redis/v9"
	"github.com/redis/rueidis"
	"github.com/valkey-io/valkey-go"
)

var (
	duration = flag.Duration("duration", 4*time.Second, "duration of each wrk run")
	rounds   = flag.Int("runs", 3, "interleaved rounds; the table shows medians")
	threads  = flag.Int("threads", 1, "wrk threads for the 64-connection runs")
	// The plain reverse proxy runs as a process of its own, as the idem
	// proxy does: this same program, started with -plain-proxy.
	plainProxy = flag.String("plain-proxy", "", "serve only a plain reverse proxy to this upstream URL, on -listen (the benchmark starts itself so)")
	listenAddr = flag.String("listen", "127.0.0.1:0", "address of -plain-proxy")
	proxyFloor = flag.String("proxy-floor", "", "with -plain-proxy: put the floor in front of it, on Redis (rueidis=ADDR) or on a synced log (file=DIR)")
	cpuProfile = flag.String("cpuprofile", "", "write a CPU profile of this process (the in-process servers, labelled server=NAME, and the proxies' upstream) to this file")
	cellsFlag  = flag.String("cells", "", "regexp: measure only the cells whose name matches (new1, new64, replay1, replay64)")
	only       = flag.String("only", "", "regexp: measure only the servers whose name matches (the bare handler and the plain proxy always run)")
)

const body = `{"amount":4200,"currency":"eur","card":"tok_visa"}`

// The handler: what a small JSON API does.
var handler = http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
	io.Copy(io.Discard, r.Body)
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(http.StatusCreated)
	io.WriteString(w, `{"id":"pay_1","status":"succeeded","amount":4200}`)
})

const newKeyLua = `
local counter = 0
local prefix = ""
local threads = 0
function setup(thread)
  threads = threads + 1
  thread:set("tid", tostring(threads))
end
function init(args)
  prefix = args[1] .. "-" .. tid .. "-"
end
function request()
  counter = counter + 1
  return wrk.format("POST", "/pay", {["Idempotency-Key"] = prefix .. counter, ["Content-Type"] = "application/json"}, [[` + body + `]])
end
`

// replayKey is the key of every request of the replay cells.
const replayKey = "the-replayed-key"

const replayLua = `
function request()
  return wrk.format("POST", "/pay", {["Idempotency-Key"] = "` + replayKey + `", ["Content-Type"] = "application/json"}, [[` + body + `]])
end
`

type result struct {
	rps      float64
	p50, p99 time.Duration
	// requests is the number wrk completed; cpu the CPU seconds each
	// process used during the run.
	requests float64
	cpu      cpuUse
	// reads is the number of reads redis-server made from its clients'
	// connections during the run (INFO stats' total_reads_processed):
	// per request, how many calls a read carried, one read per call
	// where nothing is pipelined.
	reads float64
}

// cpuUse is the CPU seconds used during one wrk run by wrk, by the server
// under test, by this benchmark's own process (the upstream of the
// proxies; for the in-process servers it is the server itself) and by
// redis-server.
type cpuUse struct{ wrk, server, bench, redis float64 }

func (a cpuUse) total() float64 { return a.wrk + a.server + a.bench + a.redis }

// A server is one row group of the table. base names the server whose p50
// the added latency is measured against.
type server struct {
	name, url, base string
	pid             int  // the server's process; 0: this process
	signed          bool // sent Stripe-signed deliveries (signedLua)
	// client: "" to load the server with wrk; h1 or h2c to load it with
	// the Go load generator (loadgen.go) speaking that protocol.
	client string
}

type cell struct {
	kind  string
	conns int
}

var cells = []cell{{"new", 1}, {"new", 64}, {"replay", 1}, {"replay", 64}}

func cellName(kind string, conns int) string { return kind + strconv.Itoa(conns) }

func main() {
	log.SetFlags(0)
	flag.Parse()
	if *plainProxy != "" {
		servePlainProxy(*plainProxy, *listenAddr, *proxyFloor)
		return
	}
	if *loadgenURL != "" {
		serveLoadgen()
		return
	}
	for _, bin := range []string{"wrk", "redis-server"} {
		if _, err := exec.LookPath(bin); err != nil {
			log.Fatalf("httpbench: %s not found on PATH (apt-get install -y wrk redis-server)", bin)
		}
	}
	var sel *regexp.Regexp
	if *only != "" {
		sel = regexp.MustCompile(*only)
	}
	if *cellsFlag != "" {
		re := regexp.MustCompile(*cellsFlag)
		cells = slices.DeleteFunc(cells, func(c cell) bool { return !re.MatchString(cellName(c.kind, c.conns)) })
	}
	dir, err := os.MkdirTemp("", "httpbench")
	if err != nil {
		log.Fatal(err)
	}
	defer os.RemoveAll(dir)
	newKey := filepath.Join(dir, "newkey.lua")
	replay := filepath.Join(dir, "replay.lua")
	os.WriteFile(newKey, []byte(newKeyLua), 0o600)
	os.WriteFile(replay, []byte(replayLua), 0o600)
	signedScript := filepath.Join(dir, "signed.lua")
	os.WriteFile(signedScript, []byte(signedLua), 0o600)

	// The peers run as processes of their own, built first.
	idemBin, fiberBin := filepath.Join(dir, "idem"), filepath.Join(dir, "fiberpeer")
	build("cmd/idem", idemBin)
	build("internal/httpbench/fiberpeer", fiberBin)

	addr, redisPID, stop := startRedis(dir)
	defer stop()
	rtt := redisRTT(addr)
	adm := redis.NewClient(&redis.Options{Addr: addr})
	defer adm.Close()

	gr := redis.NewClient(&redis.Options{Addr: addr, PoolSize: 128})
	defer gr.Close()
	ru, err := rueidis.NewClient(rueidis.ClientOption{InitAddress: []string{addr}})
	if err != nil {
		log.Fatal(err)
	}
	defer ru.Close()
	// The stores run with their defaults, as an application gets them:
	// with WithNotify on, each complete also publishes on the key's
	// channel, which Fiber's middleware, waking no waiter in another
	// process, does not do.
	grStore, err := redisstore.New(gr, redisstore.WithPrefix("bench-gr:"))
	if err != nil {
		log.Fatal(err)
	}
	defer grStore.Close()
	ruStore, err := redisstore.NewRueidis(ru, redisstore.WithPrefix("bench-ru:"))
	if err != nil {
		log.Fatal(err)
	}
	vk, err := valkey.NewClient(valkey.ClientOption{InitAddress: []string{addr}})
	if err != nil {
		log.Fatal(err)
	}
	defer vk.Close()
	vkStore, err := redisstore.NewValkey(vk, redisstore.WithPrefix("bench-vk:"))
	if err != nil {
		log.Fatal(err)
	}

	var closers []func()
	defer func() {
		for _, c := range closers {
			c()
		}
	}()
	if *cpuProfile != "" {
		f, err := os.Create(*cpuProfile)
		if err != nil {
			log.Fatal(err)
		}
		if err := pprof.StartCPUProfile(f); err != nil {
			log.Fatal(err)
		}
		defer pprof.StopCPUProfile()
	}
	// labelled runs h with the profile label server=name, so that
	// go tool pprof -tagfocus server=NAME shows one server's samples (the
	// store clients' own goroutines are not labelled).
	labelled := func(name string, h http.Handler) http.Handler {
		if *cpuProfile == "" {
			return h
		}
		labels := pprof.Labels("server", name)
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			pprof.Do(r.Context(), labels, func(ctx context.Context) { h.ServeHTTP(w, r.WithContext(ctx)) })
		})
	}
	serve := func(h http.Handler) string {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			log.Fatal(err)
		}
		srv := &http.Server{Handler: h}
		go srv.Serve(ln)
		closers = append(closers, func() { srv.Shutdown(context.Background()) })
		return "http://" + ln.Addr().String()
	}
	spawn := func(bin string, args ...string) (string, int) {
		port := freePort()
		cmd := child(exec.Command(bin, append(args, "--listen", "127.0.0.1:"+port)...))
		cmd.Stderr = os.Stderr
		if err := cmd.Start(); err != nil {
			log.Fatal(err)
		}
		closers = append(closers, func() { cmd.Process.Kill(); cmd.Wait() })
		waitTCP("127.0.0.1:" + port)
		return "http://127.0.0.1:" + port, cmd.Process.Pid
	}
	idemMW := func(s idem.Store, opts ...idemhttp.Option) http.Handler {
		exec, err := idem.New(s)
		if err != nil {
			log.Fatal(err)
		}
		mw, err := idemhttp.New(exec, opts...)
		if err != nil {
			log.Fatal(err)
		}
		return mw.Handler(handler)
	}

	upstream := serve(handler)
	self, err := os.Executable()
	if err != nil {
		log.Fatal(err)
	}

	const (
		bare  = "bare handler"
		ruRow = "idemhttp + redis (rueidis)"
		vkRow = "idemhttp + redis (valkey-go)"
		grRow = "idemhttp + redis (go-redis)"
		// The same with every response written through as it is made and
		// stored afterwards (httpkit.StreamAll), as before record before
		// success: the difference is what holding a response back until
		// it is stored costs.
		grAll = "idemhttp + redis (go-redis), stream all"
		fiber = "Fiber v2 idempotency + redis"
		// The same handler alone on Fiber: the Fiber row's added p50 is
		// over it, what Fiber's middleware adds, as idem's rows' added
		// p50 is over the bare handler on net/http.
		fiberBare = "Fiber v2 bare handler"
		flRu      = "floor: 2 round trips (rueidis)"
		flGR      = "floor: 2 round trips (go-redis)"
		flSc      = "script floor: idem's 2 scripts (rueidis)"
		plain     = "plain reverse proxy"
		pxRed     = "idem proxy, redis"
		pxEmb     = "idem proxy, embedded"
		// The plain proxy behind the floor, which bounds the idem proxy
		// as the floor rows bound idemhttp: on Redis with the client that
		// pipelines best, and on a log file synced as the embedded store
		// syncs its transitions.
		flPxRu = "proxy floor: 2 round trips (rueidis)"
		flPxFi = "proxy floor: 2 synced writes (file)"
		pxHdr  = "idem proxy, redis, signed, header key"
		pxHook = "idem proxy, redis, webhook stripe"
		// The idem proxy on Redis loaded by the Go load generator over
		// HTTP/1.1 and over h2c (--h2c, and --upstream-h2c to an upstream
		// that speaks only h2c): what HTTP/2 end to end costs or saves
		// against HTTP/1.1, with the same client on both rows.
		pxH1 = "idem proxy, redis, Go h1"
		pxH2 = "idem proxy, redis, Go h2c"
	)
	want := func(name string) bool { return sel == nil || sel.MatchString(name) }
	servers := []server{{bare, serve(labelled(bare, handler)), "", 0, false, ""}}
	if want(ruRow) {
		servers = append(servers, server{ruRow, serve(labelled(ruRow, idemMW(ruStore))), bare, 0, false, ""})
	}
	if want(vkRow) {
		servers = append(servers, server{vkRow, serve(labelled(vkRow, idemMW(vkStore))), bare, 0, false, ""})
	}
	if want(grRow) {
		servers = append(servers, server{grRow, serve(labelled(grRow, idemMW(grStore))), bare, 0, false, ""})
	}
	if want(grAll) {
		servers = append(servers, server{grAll, serve(labelled(grAll, idemMW(grStore, httpkit.StreamAll(true)))), bare, 0, false, ""})
	}
	if want(flRu) {
		servers = append(servers, server{flRu, serve(labelled(flRu, floorMiddleware(floorRueidis{ru}, "bench-floor-ru:", handler))), bare, 0, false, ""})
	}
	if want(flGR) {
		servers = append(servers, server{flGR, serve(labelled(flGR, floorMiddleware(floorGoRedis{gr}, "bench-floor-gr:", handler))), bare, 0, false, ""})
	}
	if want(flSc) {
		acq, cpl, err := storescripts.Capture(context.Background(), addr)
		if err != nil {
			log.Fatal(err)
		}
		servers = append(servers, server{flSc, serve(labelled(flSc, newScriptFloor(ru, acq, cpl).middleware("bench-floor-sc:", handler))), bare, 0, false, ""})
	}
	spawned := func(name, base, bin string, args ...string) server {
		url, pid := spawn(bin, args...)
		return server{name, url, base, pid, false, ""}
	}
	if want(fiber) {
		servers = append(servers, spawned(fiberBare, "", fiberBin, "-bare"))
		servers = append(servers, spawned(fiber, fiberBare, fiberBin, "-redis", addr))
	}
	servers = append(servers, spawned(plain, "", self, "-plain-proxy", upstream))
	if want(flPxRu) {
		servers = append(servers, spawned(flPxRu, plain, self, "-plain-proxy", upstream, "-proxy-floor", "rueidis="+addr))
	}
	if want(flPxFi) {
		floorDir := filepath.Join(dir, "floor")
		if err := os.Mkdir(floorDir, 0o700); err != nil {
			log.Fatal(err)
		}
		servers = append(servers, spawned(flPxFi, plain, self, "-plain-proxy", upstream, "-proxy-floor", "file="+floorDir))
	}
	proxyArgs := []string{"proxy", "--upstream", upstream, "--log-level", "error"}
	if want(pxRed) {
		servers = append(servers, spawned(pxRed, plain, idemBin, append(proxyArgs, "--redis", "redis://"+addr, "--redis-prefix", "bench-px:")...))
	}
	if want(pxEmb) {
		servers = append(servers, spawned(pxEmb, plain, idemBin, append(proxyArgs, "--data", filepath.Join(dir, "data"))...))
	}

	if want(pxH1) {
		sv := spawned(pxH1, "", idemBin, append(proxyArgs, "--redis", "redis://"+addr, "--redis-prefix", "bench-px1:")...)
		sv.client = "h1"
		servers = append(servers, sv)
	}
	if want(pxH2) {
		h2Args := []string{"proxy", "--upstream", serveH2C(handler, &closers), "--upstream-h2c", "--h2c", "--log-level", "error"}
		sv := spawned(pxH2, pxH1, idemBin, append(h2Args, "--redis", "redis://"+addr, "--redis-prefix", "bench-px2:")...)
		sv.client = "h2c"
		servers = append(servers, sv)
	}

	// The same Stripe-signed deliveries (a JSON body with the event's id,
	// Stripe-Signature, and the id in Idempotency-Key too) to a proxy that
	// takes the key from the header and to one that checks the signature
	// and takes the key from the body (--webhook stripe): what the body key
	// and the signature check cost.
	secretFile := filepath.Join(dir, "webhook-secret")
	os.WriteFile(secretFile, []byte(benchSecret), 0o600)
	if want(pxHdr) {
		sv := spawned(pxHdr, plain, idemBin, append(proxyArgs, "--redis", "redis://"+addr, "--redis-prefix", "bench-pxh:")...)
		sv.signed = true
		servers = append(servers, sv)
	}
	if want(pxHook) {
		sv := spawned(pxHook, plain, idemBin, append(proxyArgs, "--redis", "redis://"+addr, "--redis-prefix", "bench-pxw:",
			"--webhook", "stripe", "--webhook-secret-file", secretFile, "--wait", "0s", "--store-policy", "default")...)
		sv.signed = true
		servers = append(servers, sv)
	}

	total := time.Duration(len(servers)*len(cells)**rounds) * *duration
	fmt.Printf("wrk %v per run, %d interleaved rounds (about %v in all); Redis round trip (PING p50) %v\n\n",
		*duration, *rounds, total.Round(time.Second), rtt.Round(time.Microsecond))
	// all[server][cell] holds one result per round.
	all := map[string]map[string][]result{}
	for _, s := range servers {
		all[s.name] = map[string][]result{}
	}
	for round := range *rounds {
		for _, s := range servers {
			for _, c := range cells {
				script, t := newKey, 1
				if c.kind == "replay" {
					script = replay
				}
				if c.conns > 1 {
					t = *threads
				}
				arg := fmt.Sprintf("%d-%d-%d", time.Now().UnixNano(), c.conns, round)
				switch {
				case s.signed:
					// Signed now: Stripe's timestamps are good for 5 minutes.
					path := signedDeliveries(dir, c.kind == "replay", arg)
					if c.kind == "replay" {
						primeSigned(s.url, path)
					}
					script, arg = signedScript, fmt.Sprintf("%s|%d", path, t)
					defer os.Remove(path)
				case c.kind == "replay":
					// The replayed key is completed before the run, so
					// that no request of it finds the key in progress
					// (409), whatever cells run.
					primeReplay(s.url)
				}
				before, readsBefore := readCPU(s.pid, redisPID), redisReads(adm)
				var r result
				if s.client != "" {
					r = runLoadgen(self, s.url, s.client, c.kind, c.conns, arg)
				} else {
					r = runWrk(s.url, script, c.conns, t, arg)
				}
				used := readCPU(s.pid, redisPID).minus(before)
				r.reads = redisReads(adm) - readsBefore
				if s.signed && c.kind == "new" && r.requests >= float64(signedCount()) {
					log.Fatalf("httpbench: %s sent %.0f requests, as many as the %d distinct deliveries written: raise signedCount", s.name, r.requests, signedCount())
				}
				r.cpu.server, r.cpu.bench, r.cpu.redis = used.server, used.bench, used.redis
				if s.pid == 0 { // the server runs in this process
					r.cpu.server, r.cpu.bench = used.bench, 0
				}
				all[s.name][cellName(c.kind, c.conns)] = append(all[s.name][cellName(c.kind, c.conns)], r)
			}
		}
	}

	fmt.Printf("%-30s %-7s %5s %10s %10s %10s %12s\n", "server", "keys", "conns", "req/s", "p50", "p99", "added p50")
	for _, s := range servers {
		for _, c := range cells {
			r := median(all[s.name][cellName(c.kind, c.conns)])
			added := "-"
			if s.base != "" {
				added = (r.p50 - median(all[s.base][cellName(c.kind, c.conns)]).p50).Round(time.Microsecond).String()
			}
			fmt.Printf("%-30s %-7s %5d %10.0f %10v %10v %12s\n", s.name, c.kind, c.conns, r.rps, r.p50.Round(time.Microsecond), r.p99.Round(time.Microsecond), added)
		}
	}

	// Where each request's CPU time goes, at 64 connections, where the two
	// cores are busy: with every process CPU-bound, cores / total is the
	// most requests per second the machine can serve in that setup.
	fmt.Printf("\nCPU µs per request at 64 connections (medians): wrk (or the Go load generator), the server, this process (the proxies' upstream), redis-server; and redis-server's reads from its clients per request\n")
	fmt.Printf("%-30s %-7s %7s %7s %9s %7s %7s %12s %9s\n", "server", "keys", "wrk", "server", "upstream", "redis", "total", "cores/total", "reads/req")
	for _, s := range servers {
		for _, c := range cells {
			if c.conns == 1 {
				continue
			}
			rs := all[s.name][cellName(c.kind, c.conns)]
			per := func(f func(cpuUse) float64) float64 {
				v := make([]float64, 0, len(rs))
				for _, r := range rs {
					if r.requests > 0 {
						v = append(v, f(r.cpu)/r.requests*1e6)
					}
				}
				return middle(v)
			}
			total := per(cpuUse.total)
			bound := 0.0
			if total > 0 {
				bound = float64(runtime.NumCPU()) * 1e6 / total
			}
			var reads []float64
			for _, r := range rs {
				if r.requests > 0 {
					reads = append(reads, r.reads/r.requests)
				}
			}
			fmt.Printf("%-30s %-7s %7.1f %7.1f %9.1f %7.1f %7.1f %12.0f %9.2f\n", s.name, c.kind,
				per(func(u cpuUse) float64 { return u.wrk }), per(func(u cpuUse) float64 { return u.server }),
				per(func(u cpuUse) float64 { return u.bench }), per(func(u cpuUse) float64 { return u.redis }), total, bound, middle(reads))
		}
	}

	// The targets, each as a ratio of two cells measured in the same round.
	type target struct {
		what      string
		num, den  string
		cell      string
		min       float64
		latencyUS bool // an added p50 in µs at most min, instead of a ratio at least min
		bound     bool // not a target: the most a target on the same cell can reach
		figure    bool // not a target: a ratio shown for what it is
		peer      bool // not a target: a peer's figure
		// numBase and denBase, for an added p50: num's p50 over
		// numBase's less den's over denBase's, what each adds over its
		// own bare handler.
		numBase, denBase string
	}
	targets := []target{
		{"new keys: rueidis / Fiber", ruRow, fiber, "new64", 1.3, false, false, false, false, "", ""},
		{"new keys: go-redis / Fiber", grRow, fiber, "new64", 1.3, false, false, false, false, "", ""},
		{"new key p50, 1 conn: rueidis - Fiber (µs)", ruRow, fiber, "new1", 0, true, false, false, false, "", ""},
		{"new key p50, 1 conn: go-redis - Fiber (µs)", grRow, fiber, "new1", 0, true, false, false, false, "", ""},
		{"  bare handler, 1 conn: net/http - Fiber (µs)", bare, fiberBare, "new1", 0, true, false, true, false, "", ""},
		{"  added p50, 1 conn: rueidis - Fiber (µs)", ruRow, fiber, "new1", 0, true, false, true, false, bare, fiberBare},
		{"  added p50, 1 conn: go-redis - Fiber (µs)", grRow, fiber, "new1", 0, true, false, true, false, bare, fiberBare},
		{"  bound: floor (rueidis) / Fiber", flRu, fiber, "new64", 0, false, true, false, false, "", ""},
		{"  bound: floor (go-redis) / Fiber", flGR, fiber, "new64", 0, false, true, false, false, "", ""},
		{"  idem / floor, rueidis", ruRow, flRu, "new64", 0, false, true, false, false, "", ""},
		{"  idem / floor, go-redis", grRow, flGR, "new64", 0, false, true, false, false, "", ""},
		{"  bound: script floor / Fiber", flSc, fiber, "new64", 0, false, true, false, false, "", ""},
		{"  idem / script floor, rueidis", ruRow, flSc, "new64", 0, false, true, false, false, "", ""},
		{"  idem / script floor, go-redis", grRow, flSc, "new64", 0, false, true, false, false, "", ""},
		{"replays: rueidis / Fiber", ruRow, fiber, "replay64", 2, false, false, false, false, "", ""},
		{"replays: go-redis / Fiber", grRow, fiber, "replay64", 2, false, false, false, false, "", ""},
		{"replays: rueidis / bare", ruRow, bare, "replay64", 0.8, false, false, false, false, "", ""},
		{"replays: go-redis / bare", grRow, bare, "replay64", 0.8, false, false, false, false, "", ""},
		{"replay added p50, 1 conn, rueidis (µs)", ruRow, bare, "replay1", 20, true, false, false, false, "", ""},
		{"replay added p50, 1 conn, go-redis (µs)", grRow, bare, "replay1", 20, true, false, false, false, "", ""},
		{"replay added p50, 1 conn, Fiber (µs)", fiber, bare, "replay1", 0, true, false, false, true, "", ""},
		{"proxy new keys: idem (redis) / plain", pxRed, plain, "new64", 0.8, false, false, false, false, "", ""},
		{"  bound: proxy floor (rueidis) / plain", flPxRu, plain, "new64", 0, false, true, false, false, "", ""},
		{"  idem proxy (redis) / its floor", pxRed, flPxRu, "new64", 0, false, true, false, false, "", ""},
		{"proxy replays: idem (redis) / plain", pxRed, plain, "replay64", 2, false, false, false, false, "", ""},
		{"proxy new keys: idem (embedded) / plain", pxEmb, plain, "new64", 0.8, false, false, false, false, "", ""},
		{"  bound: proxy floor (file) / plain", flPxFi, plain, "new64", 0, false, true, false, false, "", ""},
		{"  idem proxy (embedded) / its floor", pxEmb, flPxFi, "new64", 0, false, true, false, false, "", ""},
		{"proxy replays: idem (embedded) / plain", pxEmb, plain, "replay64", 2, false, false, false, false, "", ""},
		{"webhook new: body key + signature / header", pxHook, pxHdr, "new64", 0.9, false, false, false, false, "", ""},
		{"webhook replays: body key + signature / header", pxHook, pxHdr, "replay64", 0.9, false, false, false, false, "", ""},
		{"proxy new keys: h2c / HTTP/1.1 (Go client)", pxH2, pxH1, "new64", 0, false, false, true, false, "", ""},
		{"proxy replays: h2c / HTTP/1.1 (Go client)", pxH2, pxH1, "replay64", 0, false, false, true, false, "", ""},
		{"proxy new keys, 1 conn: h2c / HTTP/1.1", pxH2, pxH1, "new1", 0, false, false, true, false, "", ""},
		{"proxy replays, 1 conn: h2c / HTTP/1.1", pxH2, pxH1, "replay1", 0, false, false, true, false, "", ""},
	}
	// cpu x: for a ratio of requests/s, the same round's inverse ratio of
	// CPU time per request (every process: wrk, server, upstream,
	// redis-server), the ratio the two cores would allow if the rows had
	// them to themselves. A ratio of requests/s below it means the run
	// did not turn all of the cheaper row's CPU advantage into requests
	// (the cores shared with other work, or a wait that is not CPU).
	fmt.Printf("\n%-42s %8s %-26s %8s  %-4s %s\n", "target (64 connections unless said)", "median", "rounds", "goal", "met", "cpu x (rounds)")
	for _, tg := range targets {
		num, den := all[tg.num][tg.cell], all[tg.den][tg.cell]
		if len(num) == 0 || len(den) == 0 {
			continue
		}
		var vs, cs []float64
		var per, cper []string
		for i := range num {
			v := num[i].rps / den[i].rps
			if tg.latencyUS {
				d := num[i].p50 - den[i].p50
				if tg.numBase != "" {
					nb, db := all[tg.numBase][tg.cell], all[tg.denBase][tg.cell]
					if len(nb) <= i || len(db) <= i {
						continue
					}
					d -= nb[i].p50 - db[i].p50
				}
				v = float64(d) / float64(time.Microsecond)
			} else if c, ok := cpuRatio(num[i], den[i]); ok {
				cs = append(cs, c)
				cper = append(cper, strconv.FormatFloat(c, 'f', 2, 64))
			}
			vs = append(vs, v)
			per = append(per, strconv.FormatFloat(v, 'f', 2, 64))
		}
		if len(vs) == 0 {
			continue
		}
		cpuCol := ""
		if len(cs) > 0 {
			cpuCol = fmt.Sprintf("%.2f (%s)", middle(cs), strings.Join(cper, " "))
		}
		m := middle(vs)
		goal, met := fmt.Sprintf(">= %.1f", tg.min), m >= tg.min
		if tg.latencyUS {
			goal, met = fmt.Sprintf("<= %.0f", tg.min), m <= tg.min
		}
		if tg.peer {
			goal = "(peer)"
		}
		if tg.bound {
			goal = "(bound)"
		}
		if tg.figure {
			goal = "(figure)"
		}
		mark := map[bool]string{true: "yes", false: "NO"}[met]
		if goal == "(peer)" || goal == "(bound)" || goal == "(figure)" {
			mark = "-"
		}
		fmt.Printf("%-42s %8.2f %-26s %8s  %-4s %s\n", tg.what, m, strings.Join(per, " "), goal, mark, cpuCol)
	}
}

// cpuRatio returns den's CPU time per request over num's, measured in
// the same round (every process's: cpuUse.total), and whether both
// rounds counted requests and CPU time.
func cpuRatio(num, den result) (float64, bool) {
	if num.requests <= 0 || den.requests <= 0 {
		return 0, false
	}
	n, d := num.cpu.total()/num.requests, den.cpu.total()/den.requests
	if n <= 0 || d <= 0 {
		return 0, false
	}
	return d / n, true
}

// primeReplay sends the replay cells' request once to url.
func primeReplay(url string) {
	req, err := http.NewRequest("POST", url+"/pay", strings.NewReader(body))
	if err != nil {
		log.Fatal(err)
	}
	req.Header.Set("Idempotency-Key", replayKey)
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		log.Fatal(err)
	}
	io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	if resp.StatusCode >= 300 {
		log.Fatalf("httpbench: priming the replayed key on %s: %s", url, resp.Status)
	}
}

// build compiles the main package in dir (a module of the workspace) into
// out.
func build(dir, out string) {
	cmd := exec.Command("go", "build", "-o", out, ".")
	cmd.Dir = dir
	if b, err := cmd.CombinedOutput(); err != nil {
		log.Fatalf("httpbench: building %s (run from the repository's root): %v\n%s", dir, err, b)
	}
}

func freePort() string {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		log.Fatal(err)
	}
	defer ln.Close()
	return strconv.Itoa(ln.Addr().(*net.TCPAddr).Port)
}

func waitTCP(addr string) {
	deadline := time.Now().Add(20 * time.Second)
	for {
		c, err := net.Dial("tcp", addr)
		if err == nil {
			c.Close()
			return
		}
		if time.Now().After(deadline) {
			log.Fatalf("httpbench: nothing listens on %s", addr)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func median(rs []result) result {
	pick := func(f func(result) float64) float64 {
		v := make([]float64, len(rs))
		for i, r := range rs {
			v[i] = f(r)
		}
		return middle(v)
	}
	return result{
		rps: pick(func(r result) float64 { return r.rps }),
		p50: time.Duration(pick(func(r result) float64 { return float64(r.p50) })),
		p99: time.Duration(pick(func(r result) float64 { return float64(r.p99) })),
	}
}

// middle returns the median of v (the upper one of an even count; 0 for
// none), sorting v.
func middle(v []float64) float64 {
	if len(v) == 0 {
		return 0
	}
	sort.Float64s(v)
	return v[len(v)/2]
}

var (
	rpsRe      = regexp.MustCompile(`Requests/sec:\s+([0-9.]+)`)
	requestsRe = regexp.MustCompile(`([0-9]+) requests in`)
	pRe        = regexp.MustCompile(`(?m)^\s+(50|99)%\s+([0-9.]+)(us|ms|s)`)
)

func runWrk(url, script string, conns, threads int, prefix string) result {
	return parseLoad(exec.Command("wrk", "-t", strconv.Itoa(threads), "-c", strconv.Itoa(conns),
		"-d", duration.String(), "--latency", "-s", script, url, "--", prefix))
}

// parseLoad runs cmd, wrk or the Go load generator (loadgen.go), and reads
// the requests, requests/s and latencies it prints as wrk does.
func parseLoad(cmd *exec.Cmd) result {
	out, err := cmd.CombinedOutput()
	if err != nil {
		log.Fatalf("%s: %v\n%s", filepath.Base(cmd.Path), err, out)
	}
	if strings.Contains(string(out), "Non-2xx") {
		log.Fatalf("wrk saw non-2xx responses:\n%s", out)
	}
	var r result
	if m := rpsRe.FindSubmatch(out); m != nil {
		r.rps, _ = strconv.ParseFloat(string(m[1]), 64)
	}
	if m := requestsRe.FindSubmatch(out); m != nil {
		r.requests, _ = strconv.ParseFloat(string(m[1]), 64)
	}
	r.cpu.wrk = (cmd.ProcessState.UserTime() + cmd.ProcessState.SystemTime()).Seconds()
	for _, m := range pRe.FindAllSubmatch(out, -1) {
		v, _ := strconv.ParseFloat(string(m[2]), 64)
		unit := map[string]time.Duration{"us": time.Microsecond, "ms": time.Millisecond, "s": time.Second}[string(m[3])]
		d := time.Duration(v * float64(unit))
		if string(m[1]) == "50" {
			r.p50 = d
		} else {
			r.p99 = d
		}
	}
	return r
}

func startRedis(dir string) (string, int, func()) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		log.Fatal(err)
	}
	port := ln.Addr().(*net.TCPAddr).Port
	ln.Close()
	cmd := child(exec.Command("redis-server", "--port", strconv.Itoa(port), "--bind", "127.0.0.1",
		"--save", "", "--appendonly", "no", "--dir", dir))
	if err := cmd.Start(); err != nil {
		log.Fatal(err)
	}
	addr := "127.0.0.1:" + strconv.Itoa(port)
	deadline := time.Now().Add(10 * time.Second)
	for {
		// Ours, not a server that took the port meanwhile: the bench
		// flushes it.
		if redistest.Probe(addr, cmd.Process.Pid) == nil {
			break
		}
		if time.Now().After(deadline) {
			cmd.Process.Kill()
			log.Fatal("redis-server did not start")
		}
		time.Sleep(10 * time.Millisecond)
	}
	return addr, cmd.Process.Pid, func() { cmd.Process.Kill(); cmd.Wait() }
}

// redisReads returns the reads redis-server has made from its clients'
// connections so far (INFO stats' total_reads_processed), 0 if it cannot
// tell.
func redisReads(c *redis.Client) float64 {
	info, err := c.Info(context.Background(), "stats").Result()
	if err != nil {
		return 0
	}
	n, _ := strconv.ParseFloat(redisinfo.Parse(info)["total_reads_processed"], 64)
	return n
}

// readCPU reads the CPU seconds used so far by the server's process (pid;
// 0: this process, then server is left 0 and bench has it), by this
// process and by redis-server.
func readCPU(pid, redisPID int) cpuUse {
	var u cpuUse
	_, u.bench, _ = proccpu.Read(os.Getpid())
	_, u.redis, _ = proccpu.Read(redisPID)
	if pid != 0 {
		_, u.server, _ = proccpu.Read(pid)
	}
	return u
}

func (a cpuUse) minus(b cpuUse) cpuUse {
	return cpuUse{a.wrk - b.wrk, a.server - b.server, a.bench - b.bench, a.redis - b.redis}
}

// redisRTT returns the median PING round trip on one connection.
func redisRTT(addr string) time.Duration {
	c := redis.NewClient(&redis.Options{Addr: addr})
	defer c.Close()
	ctx := context.Background()
	c.Ping(ctx)
	var ds []time.Duration
	for range 2000 {
		t := time.Now()
		c.Ping(ctx)
		ds = append(ds, time.Since(t))
	}
	sort.Slice(ds, func(i, j int) bool { return ds[i] < ds[j] })
	return ds[len(ds)/2]
}

// servePlainProxy serves an httputil.ReverseProxy to upstream on listen,
// its idle pool tuned as the idem proxy's is; behind the floor if floor
// names one (rueidis=ADDR or file=DIR).
func servePlainProxy(upstream, listen, floor string) {
	upURL, err := url.Parse(upstream)
	if err != nil {
		log.Fatal(err)
	}
	rp := &httputil.ReverseProxy{Rewrite: func(r *httputil.ProxyRequest) { r.SetURL(upURL) }}
	tr := http.DefaultTransport.(*http.Transport).Clone()
	tr.MaxIdleConns, tr.MaxIdleConnsPerHost = 1024, 1024
	rp.Transport = tr
	rp.ErrorLog = log.New(io.Discard, "", 0) // wrk closes its connections mid-request at the end of a run
	var h http.Handler = rp
	if floor != "" {
		h = floorMiddleware(openFloor(floor), "bench-pxfloor:", rp)
	}
	log.Fatal(http.ListenAndServe(listen, h))
}

// openFloor opens the floor store that spec names: rueidis=ADDR (a Redis
// server) or file=DIR (a log in DIR).
func openFloor(spec string) floorStore {
	kind, arg, _ := strings.Cut(spec, "=")
	switch kind {
	case "rueidis":
		c, err := rueidis.NewClient(rueidis.ClientOption{InitAddress: []string{arg}})
		if err != nil {
			log.Fatal(err)
		}
		return floorRueidis{c}
	case "file":
		f, err := openFloorFile(arg)
		if err != nil {
			log.Fatal(err)
		}
		return f
	}
	log.Fatalf("httpbench: -proxy-floor %q: want rueidis=ADDR or file=DIR", spec)
	return nil
}
