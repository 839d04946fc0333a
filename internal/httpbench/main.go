// Command httpbench measures the idemhttp middleware against the bare
// handler, side by side in one run, with wrk as the load generator on
// loopback and a throwaway redis-server on the same machine. It prints one
// table: requests/s and p50/p99 latency for new keys and replays at 1 and
// 64 connections, the Redis round trip, and the latency the middleware adds.
// A row with WithStreamAll (responses written through, stored afterwards)
// shows what holding a response back until it is stored costs.
//
//	go run ./internal/httpbench            # or: make bench-http
//
// It needs wrk (apt-get install wrk) and redis-server on PATH.
package main

import (
	"bufio"
	"context"
	"flag"
	"fmt"
	"io"
	"log"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/idemgo/idem"
	"github.com/idemgo/idem/idemhttp"
	"github.com/idemgo/idem/memstore"
	"github.com/idemgo/idem/redisstore"
	"github.com/redis/go-redis/v9"
	"github.com/redis/rueidis"
)

var (
	duration = flag.Duration("duration", 4*time.Second, "duration of each wrk run")
	runs     = flag.Int("runs", 3, "runs per cell; the table shows medians")
	threads  = flag.Int("threads", 1, "wrk threads for the 64-connection runs")
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

const replayLua = `
function request()
  return wrk.format("POST", "/pay", {["Idempotency-Key"] = "the-replayed-key", ["Content-Type"] = "application/json"}, [[` + body + `]])
end
`

type result struct {
	rps      float64
	p50, p99 time.Duration
}

func main() {
	log.SetFlags(0)
	flag.Parse()
	for _, bin := range []string{"wrk", "redis-server"} {
		if _, err := exec.LookPath(bin); err != nil {
			log.Fatalf("httpbench: %s not found on PATH (apt-get install -y wrk redis-server)", bin)
		}
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

	addr, stop := startRedis(dir)
	defer stop()
	rtt := redisRTT(addr)

	gr := redis.NewClient(&redis.Options{Addr: addr, PoolSize: 128})
	defer gr.Close()
	ru, err := rueidis.NewClient(rueidis.ClientOption{InitAddress: []string{addr}, DisableCache: true})
	if err != nil {
		log.Fatal(err)
	}
	defer ru.Close()
	grStore, _ := redisstore.New(gr, redisstore.WithNotify(false))
	ruStore, _ := redisstore.NewRueidis(ru, redisstore.WithNotify(false))
	mem, _ := memstore.New()

	type server struct {
		name string
		h    http.Handler
		mw   bool
	}
	servers := []server{{"bare handler", handler, false}}
	for _, s := range []struct {
		name  string
		store idem.Store
		opts  []idemhttp.Option
	}{
		{"idemhttp + memstore", mem, nil},
		{"idemhttp + redis (go-redis)", grStore, nil},
		// The same with every response passed through as it is written
		// and stored afterwards, as before record before success: the
		// difference is what holding the response back costs.
		{"  go-redis, stream all", grStore, []idemhttp.Option{idemhttp.WithStreamAll(true)}},
		{"idemhttp + redis (rueidis)", ruStore, nil},
	} {
		exec, _ := idem.New(s.store)
		mw, _ := idemhttp.New(exec, s.opts...)
		servers = append(servers, server{s.name, mw.Handler(handler), true})
	}

	fmt.Printf("wrk %v per run, median of %d runs; Redis round trip (PING p50) %v\n\n", *duration, *runs, rtt.Round(time.Microsecond))
	fmt.Printf("%-28s %-8s %5s %12s %10s %10s %14s\n", "server", "keys", "conns", "req/s", "p50", "p99", "added p50")
	bare := map[string]result{}
	for _, s := range servers {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			log.Fatal(err)
		}
		srv := &http.Server{Handler: s.h}
		go srv.Serve(ln)
		url := "http://" + ln.Addr().String()
		for _, kind := range []string{"new", "replay"} {
			script := newKey
			if kind == "replay" {
				script = replay
			}
			for _, conns := range []int{1, 64} {
				t := 1
				if conns > 1 {
					t = *threads
				}
				var rs []result
				for i := range *runs {
					rs = append(rs, runWrk(url, script, conns, t, fmt.Sprintf("%d%d%d", time.Now().UnixNano(), conns, i)))
				}
				r := median(rs)
				cell := kind + strconv.Itoa(conns)
				added := "-"
				if !s.mw {
					bare[cell] = r
				} else {
					added = (r.p50 - bare[cell].p50).Round(time.Microsecond).String()
				}
				fmt.Printf("%-28s %-8s %5d %12.0f %10v %10v %14s\n", s.name, kind, conns, r.rps, r.p50.Round(time.Microsecond), r.p99.Round(time.Microsecond), added)
			}
		}
		srv.Shutdown(context.Background())
	}
	fmt.Printf("\nTargets at 64 connections: new keys >= 35,000 req/s, replays >= 50,000 req/s.\n")
	fmt.Printf("Added p50 at 1 connection: new key <= 2 RTT + 30µs = %v, replay <= 1 RTT + 20µs = %v.\n",
		(2*rtt + 30*time.Microsecond).Round(time.Microsecond), (rtt + 20*time.Microsecond).Round(time.Microsecond))
}

func median(rs []result) result {
	pick := func(f func(result) float64) float64 {
		v := make([]float64, len(rs))
		for i, r := range rs {
			v[i] = f(r)
		}
		sort.Float64s(v)
		return v[len(v)/2]
	}
	return result{
		rps: pick(func(r result) float64 { return r.rps }),
		p50: time.Duration(pick(func(r result) float64 { return float64(r.p50) })),
		p99: time.Duration(pick(func(r result) float64 { return float64(r.p99) })),
	}
}

var (
	rpsRe = regexp.MustCompile(`Requests/sec:\s+([0-9.]+)`)
	pRe   = regexp.MustCompile(`(?m)^\s+(50|99)%\s+([0-9.]+)(us|ms|s)`)
)

func runWrk(url, script string, conns, threads int, prefix string) result {
	out, err := exec.Command("wrk", "-t", strconv.Itoa(threads), "-c", strconv.Itoa(conns),
		"-d", duration.String(), "--latency", "-s", script, url, "--", prefix).CombinedOutput()
	if err != nil {
		log.Fatalf("wrk: %v\n%s", err, out)
	}
	if strings.Contains(string(out), "Non-2xx") {
		log.Fatalf("wrk saw non-2xx responses:\n%s", out)
	}
	var r result
	if m := rpsRe.FindSubmatch(out); m != nil {
		r.rps, _ = strconv.ParseFloat(string(m[1]), 64)
	}
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

func startRedis(dir string) (string, func()) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		log.Fatal(err)
	}
	port := ln.Addr().(*net.TCPAddr).Port
	ln.Close()
	cmd := exec.Command("redis-server", "--port", strconv.Itoa(port), "--bind", "127.0.0.1",
		"--save", "", "--appendonly", "no", "--dir", dir)
	if err := cmd.Start(); err != nil {
		log.Fatal(err)
	}
	addr := "127.0.0.1:" + strconv.Itoa(port)
	deadline := time.Now().Add(10 * time.Second)
	for {
		c, err := net.Dial("tcp", addr)
		if err == nil {
			fmt.Fprint(c, "PING\r\n")
			line, _ := bufio.NewReader(c).ReadString('\n')
			c.Close()
			if strings.HasPrefix(line, "+PONG") {
				break
			}
		}
		if time.Now().After(deadline) {
			cmd.Process.Kill()
			log.Fatal("redis-server did not start")
		}
		time.Sleep(10 * time.Millisecond)
	}
	return addr, func() { cmd.Process.Kill(); cmd.Wait() }
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
