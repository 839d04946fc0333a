package main

import (
	"fmt"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/idemgo/idem/testkit/redistest"
)

// TestProxyBasics: a duplicate is replayed, 100 concurrent identical
// requests execute once, a reused key with another body is refused, other
// methods pass through, and the metrics count it all.
func TestProxyBasics(t *testing.T) {
	forEachStore(t, func(t *testing.T, sk storeKind) {
		up := newUpstream(t)
		p := startProxy(t, up.url(), sk.args(t))

		t.Run("duplicate", func(t *testing.T) {
			first := post(t, p.url("/payments"), "dup", `{"amount":100}`)
			if first.status != 201 || first.body != `execution 1 of dup: {"amount":100}` || first.replayed() {
				t.Fatalf("first: got %d %q replayed=%v, want 201 execution 1, not replayed", first.status, first.body, first.replayed())
			}
			second := post(t, p.url("/payments"), "dup", `{"amount":100}`)
			if second.status != 201 || second.body != first.body || !second.replayed() || second.header.Get("X-Upstream") != "yes" {
				t.Errorf("second: got %d %q replayed=%v, want the first response replayed", second.status, second.body, second.replayed())
			}
			if n := up.executions("dup"); n != 1 {
				t.Errorf("upstream executions: got %d, want 1", n)
			}
		})

		t.Run("concurrent", func(t *testing.T) {
			const n = 100
			var wg sync.WaitGroup
			statuses := make([]int, n)
			for i := range n {
				wg.Go(func() {
					statuses[i] = post(t, p.url("/payments"), "conc", "x", "X-Test-Sleep", "300ms").status
				})
			}
			wg.Wait()
			if got := up.executions("conc"); got != 1 {
				t.Errorf("upstream executions: got %d, want 1", got)
			}
			count := map[int]int{}
			for _, s := range statuses {
				count[s]++
			}
			if count[201]+count[409] != n || count[201] < 1 {
				t.Errorf("statuses: got %v, want only 201 (at least one) and 409", count)
			}
			if res := post(t, p.url("/payments"), "conc", "x"); !res.replayed() || res.body != "execution 1 of conc: x" {
				t.Errorf("after: got %d %q, want the replay", res.status, res.body)
			}
		})

		t.Run("mismatch", func(t *testing.T) {
			post(t, p.url("/payments"), "mm", "a")
			res := post(t, p.url("/payments"), "mm", "b")
			if res.status != 422 || !strings.Contains(res.body, "key-mismatch") || res.header.Get("Content-Type") != "application/problem+json" {
				t.Errorf("got %d %q, want 422 TypeKeyMismatch problem", res.status, res.body)
			}
			if n := up.executions("mm"); n != 1 {
				t.Errorf("upstream executions: got %d, want 1", n)
			}
		})

		t.Run("missing key and passthrough", func(t *testing.T) {
			if res := post(t, p.url("/payments"), "", "x"); res.status != 400 {
				t.Errorf("POST without a key: got %d, want 400", res.status)
			}
			for range 2 {
				if res := send(t, http.MethodGet, p.url("/payments"), "get", ""); res.status != 201 || res.replayed() {
					t.Errorf("GET: got %d replayed=%v, want 201 from the upstream", res.status, res.replayed())
				}
			}
			if n := up.executions("get"); n != 2 {
				t.Errorf("GET executions: got %d, want 2 (GET is not covered)", n)
			}
		})

		t.Run("metrics", func(t *testing.T) {
			for name, want := range map[string]float64{
				`idem_requests_total{outcome="executed"}`: 3,
				`idem_requests_total{outcome="mismatch"}`: 1,
				`idem_requests_total{outcome="rejected"}`: 1,
				`idem_passthrough_requests_total`:         2,
				`idem_overhead_seconds_count`:             3,
				// The Executor's outcomes, through prometheusidem.
				`idem_operations_total{outcome="executed",scope_kind="http"}`:                 3,
				`idem_operations_total{outcome="mismatch",scope_kind="http"}`:                 1,
				`idem_operation_duration_seconds_count{outcome="executed",scope_kind="http"}`: 3,
			} {
				if got := p.metric(name); got != want {
					t.Errorf("%s: got %v, want %v", name, got, want)
				}
			}
			// The store's gauges, read at the scrape.
			for _, name := range []string{`idem_store_stats_up`, `idem_store_records{state="COMPLETED"}`, `idem_store_memory_used_bytes`} {
				if got := p.metric(name); got <= 0 {
					t.Errorf("%s: got %v, want > 0", name, got)
				}
			}
			// Of the concurrent requests, one executed and the others got
			// 409 or, if they came late, the replay.
			conflicts, replays := p.metric(`idem_requests_total{outcome="conflict"}`), p.metric(`idem_requests_total{outcome="replayed"}`)
			if conflicts+replays != 99+2 {
				t.Errorf("conflicts and replays: got %v + %v, want 101 in all", conflicts, replays)
			}
			res, err := http.Get("http://" + p.admin + "/readyz")
			if err != nil || res.StatusCode != 200 {
				t.Errorf("/readyz: got %v %v, want 200", res, err)
			}
		})
	})
}

// TestProxyRestartReplay: a completed request is replayed by a new proxy
// process on the same store: after kill -9 on the embedded store, after a
// restart on Redis.
func TestProxyRestartReplay(t *testing.T) {
	forEachStore(t, func(t *testing.T, sk storeKind) {
		up := newUpstream(t)
		p := startProxy(t, up.url(), sk.args(t))
		first := post(t, p.url("/orders"), "r1", "x")
		if first.status != 201 {
			t.Fatalf("first: got %d", first.status)
		}
		if sk.name == "embedded" {
			p.kill() // no chance to close the file
		} else {
			p.terminate()
			if code := p.wait(); code != 0 {
				t.Errorf("exit code: got %d, want 0", code)
			}
		}
		p = p.restart()
		res := post(t, p.url("/orders"), "r1", "x")
		if !res.replayed() || res.body != first.body {
			t.Errorf("after the restart: got %d %q replayed=%v, want %q replayed", res.status, res.body, res.replayed(), first.body)
		}
		if n := up.executions("r1"); n != 1 {
			t.Errorf("upstream executions: got %d, want 1", n)
		}
	})
}

// TestProxySharedRedis: two proxy processes on one Redis execute
// concurrent identical requests, sent to both, once.
func TestProxySharedRedis(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t)
	storeArgs := []string{"--redis", "redis://" + srv.Addr()}
	up := newUpstream(t)
	proxies := []*proc{startProxy(t, up.url(), storeArgs), startProxy(t, up.url(), storeArgs)}
	const n = 60
	var wg sync.WaitGroup
	statuses := make([]int, n)
	for i := range n {
		wg.Go(func() {
			statuses[i] = post(t, proxies[i%2].url("/payments"), "shared", "x", "X-Test-Sleep", "300ms").status
		})
	}
	wg.Wait()
	if got := up.executions("shared"); got != 1 {
		t.Errorf("upstream executions: got %d, want 1", got)
	}
	for i, s := range statuses {
		if s != 201 && s != 409 {
			t.Errorf("request %d: got %d, want 201 or 409", i, s)
		}
	}
	for i, p := range proxies {
		if res := post(t, p.url("/payments"), "shared", "x"); !res.replayed() {
			t.Errorf("proxy %d after: got %d %q, want a replay", i, res.status, res.body)
		}
	}
}

// TestProxyUpstreamDown: when the upstream cannot be reached the request
// was not sent: 502, the key is released, and a retry once the upstream is
// back runs it.
func TestProxyUpstreamDown(t *testing.T) {
	forEachStore(t, func(t *testing.T, sk storeKind) {
		up := newUpstream(t)
		p := startProxy(t, up.url(), sk.args(t))
		addr := up.srv.Listener.Addr().String()
		up.srv.Close()
		res := post(t, p.url("/payments"), "down", "x")
		if res.status != 502 || res.header.Get("Content-Type") != "application/problem+json" || !strings.Contains(res.body, "not sent") {
			t.Fatalf("upstream down: got %d %q, want 502 problem saying the request was not sent", res.status, res.body)
		}
		if got := p.metric(`idem_upstream_errors_total{kind="unreachable"}`); got != 1 {
			t.Errorf("unreachable errors: got %v, want 1", got)
		}
		up.restartAt(t, addr)
		res = post(t, p.url("/payments"), "down", "x")
		if res.status != 201 || res.body != "execution 1 of down: x" {
			t.Errorf("retry: got %d %q, want 201 execution 1", res.status, res.body)
		}
	})
}

// TestProxyUpstreamTimeout: when the upstream got the request and does not
// answer in time, 504, and the key stays in progress until its lease ends
// (409 meanwhile); then a retry runs the request again.
func TestProxyUpstreamTimeout(t *testing.T) {
	forEachStore(t, func(t *testing.T, sk storeKind) {
		up := newUpstream(t)
		storeArgs := sk.args(t)
		p := startProxy(t, up.url(), storeArgs, "--upstream-timeout", "300ms", "--lease", "1s")
		res := post(t, p.url("/payments"), "slow", "x", "X-Test-Sleep", "3s")
		if res.status != 504 || res.header.Get("Retry-After") != "1" || !strings.Contains(res.body, "in progress") {
			t.Fatalf("timeout: got %d Retry-After %q %q, want 504 Retry-After 1", res.status, res.header.Get("Retry-After"), res.body)
		}
		if sk.name == "redis" { // the embedded store is locked by the proxy
			code, out, _ := runIdem(t, append([]string{"get", "slow", "--path", "/payments"}, storeArgs...)...)
			if code != 0 || !strings.Contains(out, "IN_PROGRESS") || !strings.Contains(out, "lease left") {
				t.Errorf("get: got %d\n%s\nwant IN_PROGRESS with the lease left", code, out)
			}
		}
		if res := post(t, p.url("/payments"), "slow", "x"); res.status != 409 {
			t.Errorf("retry during the lease: got %d %q, want 409", res.status, res.body)
		}
		deadline := time.Now().Add(5 * time.Second)
		for {
			res = post(t, p.url("/payments"), "slow", "x")
			if res.status != 409 || time.Now().After(deadline) {
				break
			}
			time.Sleep(100 * time.Millisecond) // until the lease ends
		}
		if res.status != 201 || res.body != "execution 2 of slow: x" {
			t.Errorf("retry after the lease: got %d %q, want 201 execution 2", res.status, res.body)
		}
		if got := p.metric(`idem_requests_total{outcome="abandoned"}`); got != 1 {
			t.Errorf("abandoned: got %v, want 1", got)
		}
		if got := p.metric(`idem_operation_takeovers_total{scope_kind="http"}`); got != 1 {
			t.Errorf("takeovers: got %v, want 1", got)
		}
	})
}

// TestProxyGracefulShutdown: on SIGTERM the requests in flight finish with
// their responses, which are stored: a restarted proxy replays them.
func TestProxyGracefulShutdown(t *testing.T) {
	forEachStore(t, func(t *testing.T, sk storeKind) {
		up := newUpstream(t)
		p := startProxy(t, up.url(), sk.args(t))
		const n = 5
		results := make([]response, n)
		var wg sync.WaitGroup
		for i := range n {
			wg.Go(func() {
				results[i] = post(t, p.url("/payments"), fmt.Sprint("sd", i), "x", "X-Test-Sleep", "1s")
			})
		}
		for range n {
			select {
			case <-up.started:
			case <-time.After(10 * time.Second):
				t.Fatal("the requests did not reach the upstream")
			}
		}
		p.terminate()
		wg.Wait()
		for i, r := range results {
			if r.status != 201 {
				t.Errorf("request %d: got %d %q, want 201", i, r.status, r.body)
			}
		}
		if code := p.wait(); code != 0 {
			t.Errorf("exit code: got %d, want 0", code)
		}
		if s := p.stderr.String(); !strings.Contains(s, "idem proxy stopped") || !strings.Contains(s, "clean=true") {
			t.Errorf("log: got %q, want a clean stop", s)
		}
		p = p.restart()
		for i := range n {
			key := fmt.Sprint("sd", i)
			res := post(t, p.url("/payments"), key, "x")
			if !res.replayed() || res.body != results[i].body || up.executions(key) != 1 {
				t.Errorf("%s after the restart: got %d %q replayed=%v after %d executions, want the replay after 1", key, res.status, res.body, res.replayed(), up.executions(key))
			}
		}
	})
}

// TestProxyWait: with --wait, concurrent duplicates wait for the first
// request and get its response instead of 409.
func TestProxyWait(t *testing.T) {
	forEachStore(t, func(t *testing.T, sk storeKind) {
		up := newUpstream(t)
		p := startProxy(t, up.url(), sk.args(t), "--wait", "10s")
		const n = 10
		results := make([]response, n)
		var wg sync.WaitGroup
		for i := range n {
			wg.Go(func() { results[i] = post(t, p.url("/payments"), "w", "x", "X-Test-Sleep", "300ms") })
		}
		wg.Wait()
		replayed := 0
		for i, r := range results {
			if r.status != 201 || r.body != "execution 1 of w: x" {
				t.Errorf("request %d: got %d %q, want 201 execution 1", i, r.status, r.body)
			}
			if r.replayed() {
				replayed++
			}
		}
		if up.executions("w") != 1 || replayed != n-1 {
			t.Errorf("got %d executions and %d replays, want 1 and %d", up.executions("w"), replayed, n-1)
		}
	})
}
