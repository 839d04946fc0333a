package main

import (
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idemgo/idem/internal/redistest"
)

// TestProxyCompletionRefused: Redis refuses the completion (out of memory
// with noeviction) after the upstream ran. The client is told the outcome
// is unknown (503 TypeOutcomeUnknown), never the upstream's 201; the
// metric and an ERROR log line count it; the key stays in progress until
// its lease ends, and then a retry runs the upstream again. On the code
// that wrote the response through, the client got the 201.
func TestProxyCompletionRefused(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t, "--maxmemory-policy", "noeviction")
	var runs atomic.Int64
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if runs.Add(1) == 1 {
			// The key was acquired; from now on every write is refused.
			srv.Do(t, "CONFIG", "SET", "maxmemory", "1")
		}
		w.WriteHeader(http.StatusCreated)
		fmt.Fprintf(w, "execution %d", runs.Load())
	}))
	t.Cleanup(up.Close)
	p := startProxy(t, up.URL, []string{"--redis", "redis://" + srv.Addr()}, "--lease", "1s")

	res := post(t, p.url("/payments"), "full", "x")
	if res.status != 503 || !strings.Contains(res.body, "TypeOutcomeUnknown") || res.header.Get("Retry-After") == "" {
		t.Fatalf("first: got %d %q Retry-After=%q, want 503 TypeOutcomeUnknown with Retry-After", res.status, res.body, res.header.Get("Retry-After"))
	}
	if got := p.metric(`idem_requests_total{outcome="not-recorded"}`); got != 1 {
		t.Errorf("not-recorded requests: got %v, want 1", got)
	}
	if s := p.stderr.String(); !strings.Contains(s, "level=ERROR") || !strings.Contains(s, "response not recorded") {
		t.Errorf("log: got %q, want an ERROR line about the response not recorded", s)
	}
	srv.Do(t, "CONFIG", "SET", "maxmemory", "0")
	deadline := time.Now().Add(10 * time.Second)
	for {
		res := post(t, p.url("/payments"), "full", "x")
		if res.status == 201 {
			if res.body != "execution 2" {
				t.Errorf("after the lease: got %q, want \"execution 2\"", res.body)
			}
			break
		}
		if res.status != 409 || time.Now().After(deadline) {
			t.Fatalf("retry: got %d %q, want 409 until the lease ends, then 201", res.status, res.body)
		}
		time.Sleep(50 * time.Millisecond) // poll until the lease ends
	}
}
