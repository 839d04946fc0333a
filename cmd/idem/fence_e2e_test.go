package main

import (
	"net/http"
	"net/http/httptest"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/idemgo/idem/testkit/redistest"
)

// fenceUpstream is an upstream that records, per Idempotency-Key, the
// fence header fields of every request it gets. A request with X-Test-Block
// is held until the proxy's connection goes away.
type fenceUpstream struct {
	mu     sync.Mutex
	seen   map[string][]http.Header // per key, the fence fields of each request
	names  []string                 // the field names to record
	arrive chan string              // the key of every request, when it arrives
	srv    *httptest.Server
}

func newFenceUpstream(t *testing.T, names ...string) *fenceUpstream {
	u := &fenceUpstream{seen: make(map[string][]http.Header), names: names, arrive: make(chan string, 100)}
	u.srv = httptest.NewServer(u)
	t.Cleanup(u.srv.Close)
	return u
}

func (u *fenceUpstream) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	key := r.Header.Get("Idempotency-Key")
	got := http.Header{}
	for _, n := range u.names {
		if v, ok := r.Header[n]; ok {
			got[n] = v
		}
	}
	u.mu.Lock()
	u.seen[key] = append(u.seen[key], got)
	u.mu.Unlock()
	u.arrive <- key
	if r.Header.Get("X-Test-Block") != "" {
		<-r.Context().Done()
		return
	}
	w.WriteHeader(http.StatusCreated)
}

// requests returns the fence fields of the requests the upstream got for
// key, in order.
func (u *fenceUpstream) requests(key string) []http.Header {
	u.mu.Lock()
	defer u.mu.Unlock()
	return append([]http.Header(nil), u.seen[key]...)
}

// awaitArrival waits until a request for key reaches the upstream.
func (u *fenceUpstream) awaitArrival(t *testing.T, key string) {
	t.Helper()
	deadline := time.After(readyTimeout)
	for {
		select {
		case k := <-u.arrive:
			if k == key {
				return
			}
		case <-deadline:
			t.Fatalf("no request for key %q reached the upstream within %v", key, readyTimeout)
		}
	}
}

// fenceOf returns the single fence value in h[name], failing the test if
// there is not exactly one integer.
func fenceOf(t *testing.T, h http.Header, name string) int64 {
	t.Helper()
	v := h[name]
	if len(v) != 1 {
		t.Fatalf("%s: got %q, want one value", name, v)
	}
	f, err := strconv.ParseInt(v[0], 10, 64)
	if err != nil || f <= 0 {
		t.Fatalf("%s: got %q, want a positive integer", name, v[0])
	}
	return f
}

// TestProxyFenceHeader: the upstream gets the attempt's fencing token in
// Idempotency-Fence; a takeover after the proxy that ran the request was
// killed (SIGKILL, lease 1s) carries a larger fence; a client's own
// Idempotency-Fence (also spelt with _) is replaced on covered requests and
// removed from passthrough ones; --fence-header names another field, and
// --fence-header= turns it off.
func TestProxyFenceHeader(t *testing.T) {
	t.Parallel()
	const spoof = "9223372036854775807"
	srv := redistest.Start(t, "--appendonly", "yes")
	store := []string{"--redis", "redis://" + srv.Addr()}
	up := newFenceUpstream(t, "Idempotency-Fence", "Idempotency_fence", "X-Fence")

	t.Run("forwarded and not spoofable", func(t *testing.T) {
		p := startProxy(t, up.url(), store)
		res := post(t, p.url("/pay"), "plain", "x", "Idempotency-Fence", spoof, "Idempotency_Fence", spoof)
		if res.status != 201 {
			t.Fatalf("got %d %q, want 201", res.status, res.body)
		}
		reqs := up.requests("plain")
		if len(reqs) != 1 {
			t.Fatalf("upstream requests: got %d, want 1", len(reqs))
		}
		if f := fenceOf(t, reqs[0], "Idempotency-Fence"); strconv.FormatInt(f, 10) == spoof {
			t.Errorf("upstream got the client's spoofed fence %d", f)
		}
		if v, ok := reqs[0]["Idempotency_fence"]; ok {
			t.Errorf("upstream got the client's Idempotency_Fence %q, want it removed", v)
		}
		// GET is not covered: no fence, and the client's is removed.
		send(t, http.MethodGet, p.url("/pay"), "get", "", "Idempotency-Fence", spoof)
		if reqs := up.requests("get"); len(reqs) != 1 || len(reqs[0]) != 0 {
			t.Errorf("passthrough: upstream got fence fields %v, want none", reqs)
		}
	})

	t.Run("takeover gets a larger fence", func(t *testing.T) {
		a := startProxy(t, up.url(), store, "--lease", "1s")
		b := startProxy(t, up.url(), store, "--lease", "1s", "--wait", "20s")
		go func() {
			// Killed with its proxy: the error is expected.
			req, _ := http.NewRequest(http.MethodPost, a.url("/pay"), nil)
			req.Header.Set("Idempotency-Key", "crash")
			req.Header.Set("X-Test-Block", "1")
			if res, err := client.Do(req); err == nil {
				res.Body.Close()
			}
		}()
		up.awaitArrival(t, "crash")
		a.kill()
		res := post(t, b.url("/pay"), "crash", "", "Idempotency-Fence", spoof)
		if res.status != 201 {
			t.Fatalf("retry through the second proxy: got %d %q, want 201", res.status, res.body)
		}
		reqs := up.requests("crash")
		if len(reqs) != 2 {
			t.Fatalf("upstream requests: got %d, want 2 (the killed one and the takeover)", len(reqs))
		}
		first, second := fenceOf(t, reqs[0], "Idempotency-Fence"), fenceOf(t, reqs[1], "Idempotency-Fence")
		if second <= first {
			t.Errorf("takeover fence: got %d after %d, want a larger one", second, first)
		}
		if strconv.FormatInt(second, 10) == spoof {
			t.Errorf("upstream got the client's spoofed fence on the takeover")
		}
	})

	t.Run("other name and off", func(t *testing.T) {
		named := startProxy(t, up.url(), store, "--fence-header", "x-fence")
		post(t, named.url("/pay"), "named", "x", "Idempotency-Fence", spoof)
		reqs := up.requests("named")
		if len(reqs) != 1 {
			t.Fatalf("upstream requests: got %d, want 1", len(reqs))
		}
		fenceOf(t, reqs[0], "X-Fence")
		if v := reqs[0]["Idempotency-Fence"]; len(v) != 1 || v[0] != spoof {
			t.Errorf("--fence-header x-fence: Idempotency-Fence got %q, want the client's own passed through", v)
		}

		off := startProxy(t, up.url(), store, "--fence-header=")
		post(t, off.url("/pay"), "off", "x")
		if reqs := up.requests("off"); len(reqs) != 1 || len(reqs[0]) != 0 {
			t.Errorf("--fence-header=: upstream got fence fields %v, want none", reqs)
		}
	})

	t.Run("invalid name", func(t *testing.T) {
		code, _, stderr := runIdem(t, "proxy", "--upstream", up.url(), "--fence-header", "bad name")
		if code != exitUsage {
			t.Errorf("--fence-header 'bad name': got exit code %d (%s), want %d", code, stderr, exitUsage)
		}
	})
}

func (u *fenceUpstream) url() string { return u.srv.URL }
