package idemhttp_test

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"log"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/idemgo/idem/idemhttp"
	"github.com/idemgo/idem/idemhttp/httpkit"

	"github.com/idemgo/idem"
	"github.com/idemgo/idem/redisstore"
	"github.com/idemgo/idem/storekit"
	"github.com/idemgo/idem/testkit/redistest"
	"github.com/redis/go-redis/v9"
)

// TestRedis runs the whole suite against a real redis-server.
func TestRedis(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t)
	runSuite(t, func(t *testing.T) idem.Store {
		c := srv.GoRedis(t)
		s, err := redisstore.New(c, redisstore.WithPrefix("t"+t.Name()+":"))
		if err != nil {
			t.Fatal(err)
		}
		return s
	})
}

// TestRedisDown kills redis-server: requests get 503 (fail closed) or, with
// fail-open, reach the handler; after a restart the middleware works again.
func TestRedisDown(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t)
	c := redis.NewClient(&redis.Options{Addr: srv.Addr(), MaxRetries: -1})
	t.Cleanup(func() { c.Close() })
	s, err := redisstore.New(c)
	if err != nil {
		t.Fatal(err)
	}
	var cnt counter
	h := newMiddleware(t, newExecutor(t, s)).Handler(&cnt)
	if res := post(h, "a", "x"); res.status != 201 {
		t.Fatalf("got %d", res.status)
	}
	srv.Kill(t)
	res := post(h, "b", "x")
	checkProblem(t, res, 503, idemhttp.TypeStoreUnavailable)
	open := newMiddleware(t, newExecutor(t, s), idemhttp.WithFailOpen(true)).Handler(&cnt)
	if res := post(open, "b", "x"); res.status != 201 {
		t.Errorf("fail open: got %d", res.status)
	}
	srv.Restart(t)
	// The server kept nothing on disk: the key runs again, and its retry
	// replays.
	if res := post(h, "c", "x"); res.status != 201 {
		t.Fatalf("after restart: got %d, want 201", res.status)
	}
	if res := post(h, "c", "x"); res.header.Get(idemhttp.ReplayedHeader) != "true" {
		t.Fatalf("retry after restart: got %d %q, want a replay", res.status, res.body)
	}
}

// lockedBuffer is a bytes.Buffer safe for concurrent use, for logs.
type lockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// TestStreamEndWithheld: a real Redis refuses every write (maxmemory below
// its use, noeviction: OOM) from the moment a streamed response has
// started. Its record cannot be written (COMPLETED, or FAILED for a body
// over the size limit), so the client must never see the response end
// cleanly: over HTTP/1.1 the connection closes without the terminating
// chunk or the body's last byte, over HTTP/2 the stream is reset. The log
// says what happened (never "the key is FAILED"), hooks see
// OutcomeNotRecorded, and the key stays IN_PROGRESS. The control
// (httpkit.StreamAll, written through whole) ends cleanly: the test can see a
// clean end. On the code that let streams end when the handler returned,
// every case ended cleanly.
func TestStreamEndWithheld(t *testing.T) {
	t.Parallel()
	body := strings.Repeat("0123456789abcdef", 4<<10) // 64 KiB
	const limit = 1000                                // WithMaxResponseSize of the over-limit cases
	cases := []struct {
		name    string
		opts    []idemhttp.Option
		write   func(w http.ResponseWriter)
		clean   bool // the control: the response ends cleanly
		overMax bool
	}{
		{name: "event-stream", write: func(w http.ResponseWriter) {
			w.Header().Set("Content-Type", "text/event-stream")
			io.WriteString(w, "data: one\n\n")
			w.(http.Flusher).Flush()
			io.WriteString(w, "data: two\n\n")
		}},
		{name: "flushed with Content-Length", write: func(w http.ResponseWriter) {
			w.Header().Set("Content-Length", strconv.Itoa(len(body)))
			io.WriteString(w, body[:100])
			w.(http.Flusher).Flush()
			io.WriteString(w, body[100:])
			w.(http.Flusher).Flush()
		}},
		{name: "over the limit", overMax: true, opts: []idemhttp.Option{idemhttp.WithMaxResponseSize(limit)}, write: func(w http.ResponseWriter) {
			io.WriteString(w, body)
		}},
		{name: "over the limit with Content-Length", overMax: true, opts: []idemhttp.Option{idemhttp.WithMaxResponseSize(limit)}, write: func(w http.ResponseWriter) {
			w.Header().Set("Content-Length", strconv.Itoa(len(body)))
			io.WriteString(w, body[:limit])
			io.WriteString(w, body[limit:]) // crosses the limit, ends the body
		}},
		{name: "write-through control", clean: true, opts: []idemhttp.Option{httpkit.StreamAll(true)}, write: func(w http.ResponseWriter) {
			w.Header().Set("Content-Length", strconv.Itoa(len(body)))
			io.WriteString(w, body)
		}},
	}
	for _, proto := range []string{"HTTP/1.1", "HTTP/2"} {
		for i, tc := range cases {
			t.Run(proto+"/"+tc.name, func(t *testing.T) {
				t.Parallel()
				srv := redistest.Start(t, "--maxmemory-policy", "noeviction")
				store, err := redisstore.New(srv.GoRedis(t))
				if err != nil {
					t.Fatal(err)
				}
				full := func(on bool) {
					limit := "0"
					if on {
						limit = "1" // below any memory in use: every write is OOM
					}
					srv.Do(t, "CONFIG", "SET", "maxmemory", limit)
				}
				var logs lockedBuffer
				var events eventLog
				// The Executor repeats a refused completion for up to a lease.
				exec := newExecutor(t, store, idem.WithLease(time.Second))
				opts := append([]idemhttp.Option{idemhttp.WithHook(events.hook), idemhttp.WithLogger(slog.New(slog.NewTextHandler(&logs, nil)))}, tc.opts...)
				h := newMiddleware(t, exec, opts...).Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
					full(true) // the key is held: from now on every write is refused
					tc.write(w)
				}))
				hs := httptest.NewUnstartedServer(h)
				hs.Config.ErrorLog = log.New(io.Discard, "", 0)
				if proto == "HTTP/2" {
					hs.EnableHTTP2 = true
					hs.StartTLS()
				} else {
					hs.Start()
				}
				t.Cleanup(hs.Close)
				t.Cleanup(func() { full(false) })

				key := fmt.Sprintf("k%d", i)
				req, _ := http.NewRequestWithContext(t.Context(), http.MethodPost, hs.URL+"/events", nil)
				req.Header.Set("Idempotency-Key", key)
				res, err := hs.Client().Do(req)
				if err != nil {
					t.Fatalf("request: %v", err)
				}
				got, rerr := io.ReadAll(res.Body)
				res.Body.Close()
				full(false)
				if res.Proto != proto && res.Proto != proto+".0" {
					t.Fatalf("protocol: got %s, want %s", res.Proto, proto)
				}
				if tc.clean {
					if rerr != nil || string(got) != body {
						t.Fatalf("control: got %d bytes, %v, want the whole body and a clean end", len(got), rerr)
					}
					return
				}
				if rerr == nil {
					t.Fatalf("got %d %d bytes ending cleanly, want an incomplete response (its record was refused)", res.StatusCode, len(got))
				}
				if e := events.get(0); e.Outcome != idemhttp.OutcomeNotRecorded || e.Status != 200 || e.Err == nil {
					t.Errorf("event: got %v %d %v, want not-recorded 200 with the store's error", e.Outcome, e.Status, e.Err)
				}
				l := logs.String()
				if !strings.Contains(l, "level=ERROR") || !strings.Contains(l, "connection is aborted") {
					t.Errorf("log: got %q, want an ERROR line saying the connection is aborted", l)
				}
				if tc.overMax && (strings.Contains(l, "the key is FAILED") || !strings.Contains(l, "could not be marked FAILED")) {
					t.Errorf("log: got %q, want it to say the key could not be marked FAILED", l)
				}
				// Nothing recorded: the key stays IN_PROGRESS until a
				// little after its lease, which the refused completion's
				// repetitions may have outlasted.
				rec, err := store.Get(t.Context(), idemhttp.PathKey(http.MethodPost, "/events", key).Digest())
				if !errors.Is(err, storekit.ErrNotFound) && (err != nil || rec.State != storekit.StateInProgress) {
					t.Errorf("record: got %v, %v, want IN_PROGRESS or expired", rec.State, err)
				}
			})
		}
	}
}
