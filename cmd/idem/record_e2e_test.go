package main

import (
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idemgo/idem/testkit/redistest"
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
	if res.status != 503 || !strings.Contains(res.body, "outcome-unknown") || res.header.Get("Retry-After") == "" {
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

// TestProxyStreamNotRecorded: Redis refuses every write from the moment
// the upstream starts answering (OOM with noeviction), for responses that
// stream through the proxy: text/event-stream, and bodies over
// --max-response (chunked, and of declared length), whose key the proxy
// must mark FAILED. Their record cannot be written, so the client never
// gets a whole response: the proxy aborts the connection before its end
// (no terminating chunk, or the last byte missing), the log says so and
// never that the key is FAILED, and the not-recorded metric counts it.
// The control, --stream-all (written through whole), ends cleanly. On the
// code that let a stream end when the upstream's did, every client got a
// clean end.
func TestProxyStreamNotRecorded(t *testing.T) {
	t.Parallel()
	body := strings.Repeat("0123456789abcdef", 4<<10) // 64 KiB, over --max-response 1KiB
	for _, tc := range []struct {
		name    string
		write   func(w http.ResponseWriter)
		extra   []string
		overMax bool
		clean   bool
	}{
		{name: "event-stream", write: func(w http.ResponseWriter) {
			w.Header().Set("Content-Type", "text/event-stream")
			fmt.Fprint(w, "data: one\n\n")
			w.(http.Flusher).Flush()
			fmt.Fprint(w, "data: two\n\n")
		}},
		{name: "over --max-response", overMax: true, write: func(w http.ResponseWriter) {
			fmt.Fprint(w, body)
		}},
		{name: "over --max-response with Content-Length", overMax: true, write: func(w http.ResponseWriter) {
			w.Header().Set("Content-Length", fmt.Sprint(len(body)))
			fmt.Fprint(w, body)
		}},
		{name: "control --stream-all", clean: true, extra: []string{"--stream-all"}, write: func(w http.ResponseWriter) {
			w.Header().Set("Content-Length", fmt.Sprint(len(body)))
			fmt.Fprint(w, body)
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			srv := redistest.Start(t, "--maxmemory-policy", "noeviction")
			up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				// The key was acquired; from now on every write is refused.
				srv.Do(t, "CONFIG", "SET", "maxmemory", "1")
				tc.write(w)
			}))
			t.Cleanup(up.Close)
			p := startProxy(t, up.URL, []string{"--redis", "redis://" + srv.Addr()},
				append([]string{"--lease", "1s", "--max-response", "1KiB"}, tc.extra...)...)

			req, _ := http.NewRequest(http.MethodPost, p.url("/events"), strings.NewReader("x"))
			req.Header.Set("Idempotency-Key", "s")
			res, err := client.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			got, rerr := io.ReadAll(res.Body)
			res.Body.Close()
			srv.Do(t, "CONFIG", "SET", "maxmemory", "0")
			if tc.clean {
				if rerr != nil || res.StatusCode != 200 {
					t.Fatalf("control: got %d, %d bytes, %v, want 200 ending cleanly", res.StatusCode, len(got), rerr)
				}
				return
			}
			if rerr == nil {
				t.Fatalf("got %d, %d bytes ending cleanly, want an incomplete response", res.StatusCode, len(got))
			}
			if got := p.metric(`idem_requests_total{outcome="not-recorded"}`); got != 1 {
				t.Errorf("not-recorded requests: got %v, want 1", got)
			}
			s := p.stderr.String()
			if !strings.Contains(s, "level=ERROR") || !strings.Contains(s, "connection is aborted") {
				t.Errorf("log: got %q, want an ERROR line saying the connection is aborted", s)
			}
			if tc.overMax && (strings.Contains(s, "the key is FAILED") || !strings.Contains(s, "could not be marked FAILED")) {
				t.Errorf("log: got %q, want it to say the key could not be marked FAILED, never that it is", s)
			}
		})
	}
}
