package idemhttp_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idemgo/idem"
	"github.com/idemgo/idem/adapterkit"
	"github.com/idemgo/idem/idemhttp"
	"github.com/idemgo/idem/idemhttp/httpkit"
	"github.com/idemgo/idem/memstore"
	"github.com/idemgo/idem/storekit"
)

func TestMemstore(t *testing.T) {
	runSuite(t, func(t *testing.T) idem.Store {
		t.Helper()
		s, err := memstore.New()
		if err != nil {
			t.Fatal(err)
		}
		return s
	})
}

// runSuite runs the middleware's tests against the stores that newStore
// returns, a fresh one per test.
func runSuite(t *testing.T, newStore func(t *testing.T) idem.Store) {
	tests := []struct {
		name string
		fn   func(t *testing.T, newStore func(t *testing.T) idem.Store)
	}{
		{"DesignTable", testDesignTable},
		{"Concurrent", testConcurrent},
		{"ConcurrentWait", testConcurrentWait},
		{"WaitTimeout", testWaitTimeout},
		{"WaitReleased", testWaitReleased},
		{"Fingerprint", testFingerprint},
		{"PrincipalIsolation", testPrincipalIsolation},
		{"RouteScope", testRouteScope},
		{"ReplayByteIdentity", testReplayByteIdentity},
		{"StoredHeaders", testStoredHeaders},
		{"StorePolicy", testStorePolicy},
		{"PolicyPerRoute", testPolicyPerRoute},
		{"Streaming", testStreaming},
		{"Hijack", testHijack},
		{"Panic", testPanic},
		{"ResponseTooLarge", testResponseTooLarge},
		{"StoreDown", testStoreDown},
		{"FailOpen", testFailOpen},
		{"CommitFails", testCommitFails},
		{"CommitRepeated", testCommitRepeated},
		{"RecordBeforeSuccess", testRecordBeforeSuccess},
		{"ClientGone", testClientGone},
		{"Methods", testMethods},
		{"OptionalKey", testOptionalKey},
		{"Hooks", testHooks},
		{"ErrorHandler", testErrorHandler},
		{"Fence", testFence},
		{"Abandon", testAbandon},
		{"PathKey", testPathKey},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) { tt.fn(t, newStore) })
	}
}

// counter is a handler that counts its executions and answers 201 with the
// request body and the execution's number.
type counter struct {
	n atomic.Int64
}

func (c *counter) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	n := c.n.Add(1)
	body, _ := io.ReadAll(r.Body)
	w.Header().Set("Content-Type", "text/plain; charset=utf-8")
	w.WriteHeader(http.StatusCreated)
	fmt.Fprintf(w, "execution %d: %s", n, body)
}

func newExecutor(t *testing.T, store idem.Store, opts ...idem.Option) *idem.Executor {
	t.Helper()
	exec, err := idem.New(store, opts...)
	if err != nil {
		t.Fatalf("idem.New: %v", err)
	}
	return exec
}

func newMiddleware(t *testing.T, exec *idem.Executor, opts ...idemhttp.Option) *idemhttp.Middleware {
	t.Helper()
	m, err := idemhttp.New(exec, opts...)
	if err != nil {
		t.Fatalf("idemhttp.New: %v", err)
	}
	return m
}

// request builds a request; key "" means no Idempotency-Key field.
func request(method, target, key, body string) *http.Request {
	r := httptest.NewRequest(method, target, strings.NewReader(body))
	if key != "" {
		r.Header.Set("Idempotency-Key", key)
	}
	return r
}

type response struct {
	status int
	header http.Header
	body   string
}

func serve(h http.Handler, r *http.Request) response {
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, r)
	res := rec.Result()
	b, _ := io.ReadAll(res.Body)
	return response{status: res.StatusCode, header: res.Header, body: string(b)}
}

func post(h http.Handler, key, body string) response {
	return serve(h, request(http.MethodPost, "/payments", key, body))
}

type problem struct {
	Type   string `json:"type"`
	Title  string `json:"title"`
	Status int    `json:"status"`
	Detail string `json:"detail"`
}

// checkProblem checks that res is a problem+json response of the status and
// type.
func checkProblem(t *testing.T, res response, status int, typ string) problem {
	t.Helper()
	if res.status != status {
		t.Fatalf("status: got %d, want %d (body %s)", res.status, status, res.body)
	}
	if ct := res.header.Get("Content-Type"); ct != "application/problem+json" {
		t.Errorf("Content-Type: got %q, want application/problem+json", ct)
	}
	var p problem
	if err := json.Unmarshal([]byte(res.body), &p); err != nil {
		t.Fatalf("decoding problem %q: %v", res.body, err)
	}
	if p.Type != typ {
		t.Errorf("problem type: got %q, want %q", p.Type, typ)
	}
	if p.Status != status {
		t.Errorf("problem status: got %d, want %d", p.Status, status)
	}
	if p.Title == "" || p.Detail == "" {
		t.Errorf("problem title and detail: got %q and %q, want both set", p.Title, p.Detail)
	}
	return p
}

func checkRetryAfter(t *testing.T, res response, lo, hi int) {
	t.Helper()
	v := res.header.Get("Retry-After")
	n, err := strconv.Atoi(v)
	if err != nil || n < lo || n > hi {
		t.Errorf("Retry-After: got %q, want an integer in [%d, %d]", v, lo, hi)
	}
}

// blocking is a handler that signals when it starts and waits until
// released.
type blocking struct {
	counter
	started chan struct{}
	release chan struct{}
}

func newBlocking() *blocking {
	return &blocking{started: make(chan struct{}, 1000), release: make(chan struct{})}
}

func (b *blocking) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	b.started <- struct{}{}
	<-b.release
	b.counter.ServeHTTP(w, r)
}

// testDesignTable checks every row of docs/design.md#http-semantics.
func testDesignTable(t *testing.T, newStore func(t *testing.T) idem.Store) {
	longKey := strings.Repeat("k", 256)
	tests := []struct {
		name   string
		setup  func(h http.Handler) // requests made before
		req    func() *http.Request
		status int
		typ    string // problem type; "" for a handler response
		body   string // handler response body, when typ is ""
	}{
		{name: "missing key", req: func() *http.Request { return request("POST", "/payments", "", "{}") }, status: 400, typ: idemhttp.TypeKeyMissing},
		{name: "empty key", req: func() *http.Request {
			r := request("POST", "/payments", "", "{}")
			r.Header.Set("Idempotency-Key", "")
			return r
		}, status: 400, typ: idemhttp.TypeKeyInvalid},
		{name: "empty quoted key", req: func() *http.Request { return request("POST", "/payments", `""`, "{}") }, status: 400, typ: idemhttp.TypeKeyInvalid},
		{name: "key over 255", req: func() *http.Request { return request("POST", "/payments", longKey, "{}") }, status: 400, typ: idemhttp.TypeKeyInvalid},
		{name: "key with control character", req: func() *http.Request { return request("POST", "/payments", "ab\x01c", "{}") }, status: 400, typ: idemhttp.TypeKeyInvalid},
		{name: "bad sf-string", req: func() *http.Request { return request("POST", "/payments", `"abc`, "{}") }, status: 400, typ: idemhttp.TypeKeyInvalid},
		{name: "two key fields", req: func() *http.Request {
			r := request("POST", "/payments", "a", "{}")
			r.Header.Add("Idempotency-Key", "b")
			return r
		}, status: 400, typ: idemhttp.TypeKeyInvalid},
		{name: "key of 255", req: func() *http.Request { return request("POST", "/payments", longKey[:255], "{}") }, status: 201, body: "execution 1: {}"},
		{
			name:   "different payload",
			setup:  func(h http.Handler) { post(h, "k1", `{"amount":100}`) },
			req:    func() *http.Request { return request("POST", "/payments", "k1", `{"amount":200}`) },
			status: 422, typ: idemhttp.TypeKeyMismatch,
		},
		{
			name:   "completed",
			setup:  func(h http.Handler) { post(h, "k1", `{"amount":100}`) },
			req:    func() *http.Request { return request("POST", "/payments", "k1", `{"amount":100}`) },
			status: 201, body: `execution 1: {"amount":100}`,
		},
		{
			name:   "completed, quoted key",
			setup:  func(h http.Handler) { post(h, "k1", `{"amount":100}`) },
			req:    func() *http.Request { return request("POST", "/payments", `"k1"`, `{"amount":100}`) },
			status: 201, body: `execution 1: {"amount":100}`,
		},
		{name: "body over limit", req: func() *http.Request { return request("POST", "/payments", "k1", strings.Repeat("x", 1025)) }, status: 413, typ: idemhttp.TypeBodyTooLarge},
		{name: "chunked body over limit", req: func() *http.Request {
			r := request("POST", "/payments", "k1", strings.Repeat("x", 1025))
			r.ContentLength = -1
			return r
		}, status: 413, typ: idemhttp.TypeBodyTooLarge},
		{name: "body at limit", req: func() *http.Request { return request("POST", "/payments", "k1", strings.Repeat("x", 1024)) }, status: 201, body: "execution 1: " + strings.Repeat("x", 1024)},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var c counter
			h := newMiddleware(t, newExecutor(t, newStore(t)), idemhttp.WithMaxBodySize(1024)).Handler(&c)
			if tt.setup != nil {
				tt.setup(h)
			}
			before := c.n.Load()
			res := serve(h, tt.req())
			if tt.typ != "" {
				checkProblem(t, res, tt.status, tt.typ)
				if got := c.n.Load(); got != before {
					t.Errorf("handler executions: got %d, want %d", got, before)
				}
				return
			}
			if res.status != tt.status || res.body != tt.body {
				t.Errorf("got %d %q, want %d %q", res.status, res.body, tt.status, tt.body)
			}
			replayed := before > 0
			if got := res.header.Get(idemhttp.ReplayedHeader) == "true"; got != replayed {
				t.Errorf("replayed: got %v, want %v", got, replayed)
			}
		})
	}

	t.Run("in progress", func(t *testing.T) {
		b := newBlocking()
		exec := newExecutor(t, newStore(t), idem.WithLease(5*time.Second))
		h := newMiddleware(t, exec).Handler(b)
		done := make(chan response)
		go func() { done <- post(h, "k1", "{}") }()
		<-b.started
		res := post(h, "k1", "{}")
		checkProblem(t, res, 409, idemhttp.TypeInProgress)
		checkRetryAfter(t, res, 1, 5)
		close(b.release)
		if first := <-done; first.status != 201 {
			t.Errorf("first request: got %d, want 201", first.status)
		}
	})

	t.Run("store unreachable", func(t *testing.T) {
		fs := &flakyStore{Store: newStore(t)}
		fs.down.Store(true)
		var c counter
		h := newMiddleware(t, newExecutor(t, fs), idemhttp.WithRetryAfter(2500*time.Millisecond)).Handler(&c)
		res := post(h, "k1", "{}")
		checkProblem(t, res, 503, idemhttp.TypeStoreUnavailable)
		if got := res.header.Get("Retry-After"); got != "3" {
			t.Errorf("Retry-After: got %q, want 3", got)
		}
		if n := c.n.Load(); n != 0 {
			t.Errorf("handler executions: got %d, want 0", n)
		}
	})
}

// testConcurrent sends 100 identical requests at once: one runs the handler,
// the others get 409.
func testConcurrent(t *testing.T, newStore func(t *testing.T) idem.Store) {
	const n = 100
	b := newBlocking()
	h := newMiddleware(t, newExecutor(t, newStore(t))).Handler(b)
	results := make(chan response, n)
	var wg sync.WaitGroup
	for range n {
		wg.Go(func() { results <- post(h, "same", `{"amount":1}`) })
	}
	<-b.started
	// Release the handler only when every other request was answered.
	conflicts := 0
	for range n - 1 {
		res := <-results
		checkProblem(t, res, 409, idemhttp.TypeInProgress)
		conflicts++
	}
	close(b.release)
	wg.Wait()
	if res := <-results; res.status != 201 {
		t.Errorf("executing request: got %d, want 201", res.status)
	}
	if got := b.n.Load(); got != 1 {
		t.Errorf("handler executions: got %d, want 1", got)
	}
	if conflicts != n-1 {
		t.Errorf("409 responses: got %d, want %d", conflicts, n-1)
	}
}

// testConcurrentWait sends 100 identical requests at once with waiting on:
// one runs the handler, all get its response.
func testConcurrentWait(t *testing.T, newStore func(t *testing.T) idem.Store) {
	const n = 100
	b := newBlocking()
	h := newMiddleware(t, newExecutor(t, newStore(t)), idemhttp.WithWait(10*time.Second)).Handler(b)
	results := make(chan response, n)
	var wg sync.WaitGroup
	for range n {
		wg.Go(func() { results <- post(h, "same", `{"amount":1}`) })
	}
	<-b.started
	time.Sleep(50 * time.Millisecond) // let most requests reach the wait
	close(b.release)
	wg.Wait()
	close(results)
	replayed := 0
	for res := range results {
		if res.status != 201 || res.body != `execution 1: {"amount":1}` {
			t.Errorf("got %d %q, want 201 %q", res.status, res.body, `execution 1: {"amount":1}`)
		}
		if res.header.Get(idemhttp.ReplayedHeader) == "true" {
			replayed++
		}
	}
	if got := b.n.Load(); got != 1 {
		t.Errorf("handler executions: got %d, want 1", got)
	}
	if replayed != n-1 {
		t.Errorf("replayed responses: got %d, want %d", replayed, n-1)
	}
}

// testWaitTimeout checks that a waiting request gets 409 when the wait runs
// out.
func testWaitTimeout(t *testing.T, newStore func(t *testing.T) idem.Store) {
	b := newBlocking()
	exec := newExecutor(t, newStore(t), idem.WithLease(10*time.Second))
	h := newMiddleware(t, exec, idemhttp.WithWait(100*time.Millisecond)).Handler(b)
	done := make(chan response)
	go func() { done <- post(h, "k", "{}") }()
	<-b.started
	start := time.Now()
	res := post(h, "k", "{}")
	if d := time.Since(start); d < 100*time.Millisecond {
		t.Errorf("waited %v, want at least 100ms", d)
	}
	checkProblem(t, res, 409, idemhttp.TypeInProgress)
	checkRetryAfter(t, res, 1, 10)
	close(b.release)
	<-done
}

// testWaitReleased checks that when the first request releases the key, a
// waiting duplicate runs the handler itself.
func testWaitReleased(t *testing.T, newStore func(t *testing.T) idem.Store) {
	started := make(chan struct{}, 2)
	release := make(chan struct{})
	var n atomic.Int64
	h := newMiddleware(t, newExecutor(t, newStore(t)), idemhttp.WithWait(10*time.Second)).Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		started <- struct{}{}
		if n.Add(1) == 1 {
			<-release
			w.WriteHeader(http.StatusServiceUnavailable)
			return
		}
		w.WriteHeader(http.StatusCreated)
	}))
	first := make(chan response)
	go func() { first <- post(h, "k", "{}") }()
	<-started
	second := make(chan response)
	go func() { second <- post(h, "k", "{}") }()
	time.Sleep(20 * time.Millisecond)
	close(release)
	if res := <-first; res.status != 503 {
		t.Errorf("first: got %d, want 503", res.status)
	}
	if res := <-second; res.status != 201 || res.header.Get(idemhttp.ReplayedHeader) != "" {
		t.Errorf("second: got %d replayed=%q, want 201 executed", res.status, res.header.Get(idemhttp.ReplayedHeader))
	}
}

// testFingerprint checks what the fingerprint covers.
func testFingerprint(t *testing.T, newStore func(t *testing.T) idem.Store) {
	type req struct {
		target, body string
		hdr          http.Header
	}
	tests := []struct {
		name        string
		opts        []idemhttp.Option
		first, then req
		want        int // status of the second request: 201 replayed or 422
	}{
		{"same body", nil, req{"/p", `{"a":1}`, nil}, req{"/p", `{"a":1}`, nil}, 201},
		{"other body", nil, req{"/p", `{"a":1}`, nil}, req{"/p", `{"a":2}`, nil}, 422},
		{"reordered JSON", nil, req{"/p", `{"a":1,"b":2}`, nil}, req{"/p", `{ "b": 2, "a": 1 }`, nil}, 422},
		{"reordered JSON, canonical", []idemhttp.Option{idemhttp.WithCanonicalJSON(true)}, req{"/p", `{"a":1,"b":[1,{"y":1,"x":2}]}`, nil}, req{"/p", "{ \"b\": [1, {\"x\":2,\"y\":1}],\n \"a\": 1 }", nil}, 201},
		{"other JSON, canonical", []idemhttp.Option{idemhttp.WithCanonicalJSON(true)}, req{"/p", `{"a":1}`, nil}, req{"/p", `{"a":1.0}`, nil}, 422},
		{"not JSON, canonical", []idemhttp.Option{idemhttp.WithCanonicalJSON(true)}, req{"/p", `a=1`, nil}, req{"/p", `a=1`, nil}, 201},
		{"other query", nil, req{"/p?x=1", `{}`, nil}, req{"/p?x=2", `{}`, nil}, 422},
		{"unselected field", nil, req{"/p", `{}`, http.Header{"X-Account": {"1"}}}, req{"/p", `{}`, http.Header{"X-Account": {"2"}}}, 201},
		{"selected field", []idemhttp.Option{idemhttp.WithFingerprintHeaders("x-account")}, req{"/p", `{}`, http.Header{"X-Account": {"1"}}}, req{"/p", `{}`, http.Header{"X-Account": {"2"}}}, 422},
		{"selected field, same", []idemhttp.Option{idemhttp.WithFingerprintHeaders("x-account")}, req{"/p", `{}`, http.Header{"X-Account": {"1"}}}, req{"/p", `{}`, http.Header{"X-Account": {"1"}}}, 201},
		{"selected field, missing", []idemhttp.Option{idemhttp.WithFingerprintHeaders("x-account")}, req{"/p", `{}`, http.Header{"X-Account": {""}}}, req{"/p", `{}`, nil}, 422},
	}
	// Paths differ only in the query here, so that the default scope (the
	// URL path) is the same.
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var c counter
			h := newMiddleware(t, newExecutor(t, newStore(t)), tt.opts...).Handler(&c)
			send := func(q req) response {
				r := request("POST", q.target, "key", q.body)
				for k, v := range q.hdr {
					r.Header[k] = v
				}
				return serve(h, r)
			}
			first := send(tt.first)
			if first.status != 201 {
				t.Fatalf("first: got %d, want 201", first.status)
			}
			res := send(tt.then)
			if tt.want == 422 {
				checkProblem(t, res, 422, idemhttp.TypeKeyMismatch)
				return
			}
			if res.status != tt.want || res.body != first.body || res.header.Get(idemhttp.ReplayedHeader) != "true" {
				t.Errorf("got %d %q replayed=%q, want %d %q replayed", res.status, res.body, res.header.Get(idemhttp.ReplayedHeader), tt.want, first.body)
			}
			if n := c.n.Load(); n != 1 {
				t.Errorf("handler executions: got %d, want 1", n)
			}
		})
	}
}

// testPrincipalIsolation checks that principal B reusing A's key gets its
// own execution, never A's response.
func testPrincipalIsolation(t *testing.T, newStore func(t *testing.T) idem.Store) {
	var c counter
	h := newMiddleware(t, newExecutor(t, newStore(t)), idemhttp.WithPrincipal(func(r *http.Request) string {
		return r.Header.Get("X-User")
	})).Handler(&c)
	as := func(user, body string) response {
		r := request("POST", "/payments", "shared-key", body)
		r.Header.Set("X-User", user)
		return serve(h, r)
	}
	steps := []struct {
		user, body string
		want       string
		replayed   bool
	}{
		{"alice", `{"amount":1}`, `execution 1: {"amount":1}`, false},
		{"bob", `{"amount":1}`, `execution 2: {"amount":1}`, false},
		{"mallory", `{"amount":9}`, `execution 3: {"amount":9}`, false}, // another body is no mismatch across principals
		{"alice", `{"amount":1}`, `execution 1: {"amount":1}`, true},
		{"bob", `{"amount":1}`, `execution 2: {"amount":1}`, true},
	}
	for i, s := range steps {
		res := as(s.user, s.body)
		if res.status != 201 || res.body != s.want || (res.header.Get(idemhttp.ReplayedHeader) == "true") != s.replayed {
			t.Errorf("step %d (%s): got %d %q replayed=%q, want 201 %q replayed=%v", i, s.user, res.status, res.body, res.header.Get(idemhttp.ReplayedHeader), s.want, s.replayed)
		}
	}
}

// testRouteScope checks that keys are scoped by method and route.
func testRouteScope(t *testing.T, newStore func(t *testing.T) idem.Store) {
	var c counter
	mw := newMiddleware(t, newExecutor(t, newStore(t)), idemhttp.WithMethods("POST", "PUT"))
	mux := http.NewServeMux()
	mux.Handle("POST /a", mw.Handler(&c))
	mux.Handle("POST /b", mw.Handler(&c))
	mux.Handle("PUT /a", mw.Handler(&c))
	mux.Handle("POST /accounts/{id}/charges", mw.Handler(&c))
	steps := []struct {
		method, target string
		status         int
		body           string
	}{
		{"POST", "/a", 201, "execution 1: x"},
		{"POST", "/b", 201, "execution 2: x"},
		{"PUT", "/a", 201, "execution 3: x"},
		{"POST", "/a", 201, "execution 1: x"},
		{"POST", "/accounts/1/charges", 201, "execution 4: x"},
		// Same route pattern, same key, another path: a mismatch, not a
		// second execution.
		{"POST", "/accounts/2/charges", 422, ""},
	}
	for i, s := range steps {
		res := serve(mux, request(s.method, s.target, "k", "x"))
		if res.status != s.status || s.body != "" && res.body != s.body {
			t.Errorf("step %d: %s %s: got %d %q, want %d %q", i, s.method, s.target, res.status, res.body, s.status, s.body)
		}
	}

	// Without a mux, the URL path is the route.
	h := newMiddleware(t, newExecutor(t, newStore(t))).Handler(&c)
	c.n.Store(0)
	for i, target := range []string{"/x/1", "/x/2"} {
		want := fmt.Sprintf("execution %d: x", i+1)
		if res := serve(h, request("POST", target, "k", "x")); res.body != want {
			t.Errorf("%s: got %q, want %q", target, res.body, want)
		}
	}
}

// testReplayByteIdentity checks over a real connection that a replay is the
// first response byte for byte, Date aside, plus Idempotent-Replayed.
func testReplayByteIdentity(t *testing.T, newStore func(t *testing.T) idem.Store) {
	mw := newMiddleware(t, newExecutor(t, newStore(t), idem.WithCompressAbove(16)))
	var n atomic.Int64
	mux := http.NewServeMux()
	mux.Handle("POST /orders", mw.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		n.Add(1)
		h := w.Header()
		h.Set("Content-Type", "application/json")
		h.Set("Location", "/orders/42")
		h.Add("X-Multi", "one")
		h.Add("X-Multi", "two")
		h["x-not-canonical"] = []string{"kept as is"}
		h.Set("X-Empty", "")
		h.Set("Cache-Control", "no-store")
		w.WriteHeader(http.StatusCreated)
		io.WriteString(w, `{"id":42,"status":"created",`)
		w.Write([]byte(`"note":"` + strings.Repeat("é", 100) + `"}`))
	})))
	srv := httptest.NewServer(mux)
	t.Cleanup(srv.Close)

	raw := func() string {
		t.Helper()
		conn, err := net.Dial("tcp", srv.Listener.Addr().String())
		if err != nil {
			t.Fatal(err)
		}
		defer conn.Close()
		body := `{"item":"book"}`
		fmt.Fprintf(conn, "POST /orders HTTP/1.1\r\nHost: example.com\r\nIdempotency-Key: order-1\r\nContent-Type: application/json\r\nContent-Length: %d\r\nConnection: close\r\n\r\n%s", len(body), body)
		b, err := io.ReadAll(conn)
		if err != nil {
			t.Fatal(err)
		}
		// Date is added by net/http at each response.
		var out []string
		for line := range strings.SplitSeq(string(b), "\r\n") {
			if !strings.HasPrefix(line, "Date: ") {
				out = append(out, line)
			}
		}
		return strings.Join(out, "\r\n")
	}
	first := raw()
	replay := raw()
	if !strings.Contains(replay, "\r\nIdempotent-Replayed: true\r\n") {
		t.Fatalf("replay has no Idempotent-Replayed: true field:\n%s", replay)
	}
	if strings.Contains(first, "Idempotent-Replayed") {
		t.Errorf("first response has an Idempotent-Replayed field:\n%s", first)
	}
	if got := strings.Replace(replay, "Idempotent-Replayed: true\r\n", "", 1); got != first {
		t.Errorf("replay differs from the first response:\ngot  %q\nwant %q", got, first)
	}
	if got := n.Load(); got != 1 {
		t.Errorf("handler executions: got %d, want 1", got)
	}
}

// testStoredHeaders checks which fields are stored.
func testStoredHeaders(t *testing.T, newStore func(t *testing.T) idem.Store) {
	tests := []struct {
		name    string
		opts    []idemhttp.Option
		kept    []string
		dropped []string
	}{
		{"default deny-list", nil, []string{"X-Kept", "X-Empty-Values"}, []string{"Set-Cookie", "Keep-Alive", "Connection", "X-Hop", "Upgrade"}},
		{"custom deny-list", []idemhttp.Option{idemhttp.WithDenyHeaders("x-kept")}, []string{"Set-Cookie", "X-Empty-Values"}, []string{"X-Kept", "X-Hop"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			h := newMiddleware(t, newExecutor(t, newStore(t)), tt.opts...).Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				h := w.Header()
				h.Set("X-Kept", "1")
				h["X-Empty-Values"] = nil
				h.Set("Set-Cookie", "session=secret")
				h.Set("Keep-Alive", "timeout=5")
				h.Set("Connection", "X-Hop")
				h.Set("X-Hop", "1")
				h.Set("Trailer", "X-Checksum")
				h.Set("Upgrade", "h2c")
				w.WriteHeader(200)
				w.Header().Set("X-Checksum", "late") // after WriteHeader: a trailer (TestTrailers)
				io.WriteString(w, "ok")
			}))
			if res := post(h, "k", ""); res.status != 200 {
				t.Fatalf("first: got %d, want 200", res.status)
			}
			res := post(h, "k", "")
			if res.status != 200 || res.body != "ok" || res.header.Get(idemhttp.ReplayedHeader) != "true" {
				t.Fatalf("replay: got %d %q, want replayed 200 \"ok\"", res.status, res.body)
			}
			for _, k := range tt.kept {
				if _, ok := res.header[k]; !ok {
					t.Errorf("replay lacks %s", k)
				}
			}
			for _, k := range append(tt.dropped, "X-Checksum") {
				if v, ok := res.header[k]; ok {
					t.Errorf("replay has %s: %q, want it dropped", k, v)
				}
			}
		})
	}
}

// testStorePolicy checks, per status, whether a retry replays the response
// or runs the handler again: 503 then retry executes again, 500 then retry
// replays the 500.
func testStorePolicy(t *testing.T, newStore func(t *testing.T) idem.Store) {
	released := map[int]bool{408: true, 409: true, 425: true, 429: true, 503: true}
	for _, policy := range []struct {
		name string
		p    idemhttp.Policy
		rel  func(status int) bool
	}{
		{"default", idemhttp.DefaultPolicy, func(s int) bool { return released[s] }},
		{"release server errors", idemhttp.ReleaseServerErrors, func(s int) bool { return released[s] || s >= 500 }},
	} {
		for _, status := range []int{200, 201, 204, 400, 404, 408, 409, 422, 425, 429, 500, 502, 503, 504} {
			t.Run(fmt.Sprintf("%s/%d", policy.name, status), func(t *testing.T) {
				var n atomic.Int64
				h := newMiddleware(t, newExecutor(t, newStore(t)), idemhttp.WithPolicy(policy.p)).Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
					i := n.Add(1)
					if i == 1 {
						w.WriteHeader(status)
						if status != 204 {
							io.WriteString(w, "first")
						}
						return
					}
					io.WriteString(w, "second")
				}))
				first := post(h, "k", "")
				if first.status != status {
					t.Fatalf("first: got %d, want %d", first.status, status)
				}
				res := post(h, "k", "")
				if policy.rel(status) {
					if res.status != 200 || res.body != "second" || n.Load() != 2 {
						t.Errorf("retry: got %d %q after %d executions, want 200 \"second\" after 2", res.status, res.body, n.Load())
					}
					return
				}
				if res.status != status || res.body != first.body || res.header.Get(idemhttp.ReplayedHeader) != "true" || n.Load() != 1 {
					t.Errorf("retry: got %d %q replayed=%q after %d executions, want replayed %d %q after 1", res.status, res.body, res.header.Get(idemhttp.ReplayedHeader), n.Load(), status, first.body)
				}
			})
		}
	}
}

// testPolicyPerRoute checks a policy that decides per route.
func testPolicyPerRoute(t *testing.T, newStore func(t *testing.T) idem.Store) {
	policy := func(r *http.Request, status int) idemhttp.Decision {
		if r.Pattern == "POST /transactional" {
			return idemhttp.ReleaseServerErrors(r, status)
		}
		return idemhttp.DefaultPolicy(r, status)
	}
	mw := newMiddleware(t, newExecutor(t, newStore(t)), idemhttp.WithPolicy(policy))
	var n atomic.Int64
	fail := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		n.Add(1)
		w.WriteHeader(500)
	})
	mux := http.NewServeMux()
	mux.Handle("POST /transactional", mw.Handler(fail))
	mux.Handle("POST /other", mw.Handler(fail))
	for _, tt := range []struct {
		target string
		want   int64 // executions after two requests
	}{{"/transactional", 2}, {"/other", 1}} {
		n.Store(0)
		serve(mux, request("POST", tt.target, "k", ""))
		serve(mux, request("POST", tt.target, "k", ""))
		if got := n.Load(); got != tt.want {
			t.Errorf("%s: handler executions: got %d, want %d", tt.target, got, tt.want)
		}
	}
}

// testStreaming checks that a streaming handler's chunks reach the client
// as they are flushed, and that the whole response is replayed.
func testStreaming(t *testing.T, newStore func(t *testing.T) idem.Store) {
	proceed := make(chan struct{})
	mw := newMiddleware(t, newExecutor(t, newStore(t)))
	srv := httptest.NewServer(mw.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Link", "</style.css>; rel=preload")
		w.WriteHeader(http.StatusEarlyHints)
		w.Header().Set("Content-Type", "text/event-stream")
		io.WriteString(w, "data: one\n\n")
		if err := http.NewResponseController(w).Flush(); err != nil {
			t.Errorf("ResponseController.Flush: %v", err)
		}
		<-proceed
		io.WriteString(w, "data: two\n\n")
		w.(http.Flusher).Flush()
		if err := http.NewResponseController(w).SetWriteDeadline(time.Now().Add(time.Minute)); err != nil {
			t.Errorf("ResponseController.SetWriteDeadline: %v", err)
		}
	})))
	t.Cleanup(srv.Close)

	req, _ := http.NewRequestWithContext(t.Context(), "POST", srv.URL+"/events", nil)
	req.Header.Set("Idempotency-Key", "stream")
	res, err := srv.Client().Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer res.Body.Close()
	if res.StatusCode != 200 {
		t.Fatalf("status: got %d, want 200", res.StatusCode)
	}
	first := make([]byte, len("data: one\n\n"))
	if _, err := io.ReadFull(res.Body, first); err != nil || string(first) != "data: one\n\n" {
		t.Fatalf("first chunk before the handler went on: got %q, %v, want %q", first, err, "data: one\n\n")
	}
	close(proceed)
	rest, _ := io.ReadAll(res.Body)
	if string(rest) != "data: two\n\n" {
		t.Errorf("second chunk: got %q, want %q", rest, "data: two\n\n")
	}

	// The replay has the whole stream, and the final status and fields.
	req, _ = http.NewRequestWithContext(t.Context(), "POST", srv.URL+"/events", nil)
	req.Header.Set("Idempotency-Key", "stream")
	res2, err := srv.Client().Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer res2.Body.Close()
	all, _ := io.ReadAll(res2.Body)
	if res2.StatusCode != 200 || string(all) != "data: one\n\ndata: two\n\n" || res2.Header.Get("Content-Type") != "text/event-stream" || res2.Header.Get(idemhttp.ReplayedHeader) != "true" {
		t.Errorf("replay: got %d %q %v, want replayed 200 text/event-stream %q", res2.StatusCode, all, res2.Header, "data: one\n\ndata: two\n\n")
	}
}

// testHijack checks that a handler that hijacks the connection releases the
// key.
func testHijack(t *testing.T, newStore func(t *testing.T) idem.Store) {
	var n atomic.Int64
	var events eventLog
	ended := make(chan struct{}, 2)
	mw := newMiddleware(t, newExecutor(t, newStore(t)), idemhttp.WithHook(events.hook), idemhttp.WithHook(func(*http.Request, idemhttp.Event) {
		ended <- struct{}{}
	}))
	srv := httptest.NewServer(mw.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if n.Add(1) > 1 {
			io.WriteString(w, "second")
			return
		}
		conn, buf, err := w.(http.Hijacker).Hijack()
		if err != nil {
			t.Errorf("Hijack: %v", err)
			return
		}
		defer conn.Close()
		buf.WriteString("HTTP/1.1 200 OK\r\nContent-Length: 5\r\nConnection: close\r\n\r\nfirst")
		buf.Flush()
	})))
	t.Cleanup(srv.Close)
	for _, want := range []string{"first", "second"} {
		req, _ := http.NewRequestWithContext(t.Context(), "POST", srv.URL, nil)
		req.Header.Set("Idempotency-Key", "k")
		res, err := srv.Client().Do(req)
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(res.Body)
		res.Body.Close()
		if string(b) != want {
			t.Errorf("got %q, want %q", b, want)
		}
		// The hijacked response reaches the client before the handler
		// returns and the key is released.
		<-ended
	}
	if e := events.get(0); e.Outcome != idemhttp.OutcomeReleased || !errors.Is(e.Err, idemhttp.ErrHijacked) {
		t.Errorf("event: got %v %v, want released, ErrHijacked", e.Outcome, e.Err)
	}
}

// testPanic checks that a panicking handler releases the key and that the
// panic goes on with its value.
func testPanic(t *testing.T, newStore func(t *testing.T) idem.Store) {
	for _, value := range []any{http.ErrAbortHandler, "boom"} {
		t.Run(fmt.Sprint(value), func(t *testing.T) {
			var n atomic.Int64
			var events eventLog
			h := newMiddleware(t, newExecutor(t, newStore(t)), idemhttp.WithHook(events.hook)).Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				if n.Add(1) == 1 {
					w.WriteHeader(http.StatusCreated)
					panic(value)
				}
				io.WriteString(w, "second")
			}))
			got := func() (v any) {
				defer func() { v = recover() }()
				post(h, "k", "")
				return nil
			}()
			if got != value {
				t.Fatalf("panic value: got %v, want %v", got, value)
			}
			if e := events.get(0); e.Outcome != idemhttp.OutcomeReleased || !errors.Is(e.Err, idemhttp.ErrHandlerPanicked) {
				t.Errorf("event: got %v %v, want released, ErrHandlerPanicked", e.Outcome, e.Err)
			}
			if res := post(h, "k", ""); res.status != 200 || res.body != "second" {
				t.Errorf("retry: got %d %q, want 200 \"second\"", res.status, res.body)
			}
		})
	}
}

// testResponseTooLarge checks that a response over the stored-size limit
// reaches the client in full, and that the key becomes FAILED.
func testResponseTooLarge(t *testing.T, newStore func(t *testing.T) idem.Store) {
	tests := []struct {
		name     string
		execOpts []idem.Option
		opts     []idemhttp.Option
	}{
		{"middleware limit", nil, []idemhttp.Option{idemhttp.WithMaxResponseSize(1000)}},
		{"executor limit", []idem.Option{idem.WithMaxResultSize(1000)}, nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var events eventLog
			var n atomic.Int64
			big := strings.Repeat("0123456789", 200)
			h := newMiddleware(t, newExecutor(t, newStore(t), tt.execOpts...), append(tt.opts, idemhttp.WithHook(events.hook))...).Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				n.Add(1)
				io.WriteString(w, big[:1000])
				io.WriteString(w, big[1000:])
			}))
			if res := post(h, "k", ""); res.status != 200 || res.body != big {
				t.Fatalf("first: got %d and %d bytes, want 200 and %d bytes", res.status, len(res.body), len(big))
			}
			if e := events.get(0); e.Outcome != idemhttp.OutcomeExecuted || !errors.Is(e.Err, idem.ErrResultTooLarge) {
				t.Errorf("event: got %v %v, want executed, ErrResultTooLarge", e.Outcome, e.Err)
			}
			checkProblem(t, post(h, "k", ""), 422, idemhttp.TypeKeyFailed)
			if got := n.Load(); got != 1 {
				t.Errorf("handler executions: got %d, want 1", got)
			}
			if e := events.get(1); e.Outcome != idemhttp.OutcomeFailed {
				t.Errorf("retry event: got %v, want failed", e.Outcome)
			}
		})
	}
}

// flakyStore wraps a Store and fails every call while down is set.
type flakyStore struct {
	idem.Store
	down atomic.Bool
}

var errStoreDown = errors.New("test: store down")

func (s *flakyStore) err() error {
	if s.down.Load() {
		return errStoreDown
	}
	return nil
}

func (s *flakyStore) Acquire(ctx context.Context, key string, req storekit.AcquireRequest) (storekit.Acquisition, error) {
	if err := s.err(); err != nil {
		return storekit.Acquisition{}, err
	}
	return s.Store.Acquire(ctx, key, req)
}

func (s *flakyStore) Complete(ctx context.Context, key string, lease idem.Lease, result []byte, retention time.Duration) error {
	if err := s.err(); err != nil {
		return err
	}
	return s.Store.Complete(ctx, key, lease, result, retention)
}

func (s *flakyStore) Fail(ctx context.Context, key string, lease idem.Lease, f storekit.Failure) (storekit.State, error) {
	if err := s.err(); err != nil {
		return 0, err
	}
	return s.Store.Fail(ctx, key, lease, f)
}

func (s *flakyStore) Extend(ctx context.Context, key string, lease idem.Lease, d time.Duration) error {
	if err := s.err(); err != nil {
		return err
	}
	return s.Store.Extend(ctx, key, lease, d)
}

func (s *flakyStore) Release(ctx context.Context, key string, lease idem.Lease, retention time.Duration) error {
	if err := s.err(); err != nil {
		return err
	}
	return s.Store.Release(ctx, key, lease, retention)
}

func (s *flakyStore) Get(ctx context.Context, key string) (storekit.Record, error) {
	if err := s.err(); err != nil {
		return storekit.Record{}, err
	}
	return s.Store.Get(ctx, key)
}

func (s *flakyStore) Delete(ctx context.Context, key string) error {
	if err := s.err(); err != nil {
		return err
	}
	return s.Store.Delete(ctx, key)
}

// testStoreDown checks failing closed: 503 with Retry-After, then, once the
// store is back, the request runs.
func testStoreDown(t *testing.T, newStore func(t *testing.T) idem.Store) {
	fs := &flakyStore{Store: newStore(t)}
	var c counter
	var events eventLog
	h := newMiddleware(t, newExecutor(t, fs), idemhttp.WithHook(events.hook)).Handler(&c)
	fs.down.Store(true)
	res := post(h, "k", "x")
	checkProblem(t, res, 503, idemhttp.TypeStoreUnavailable)
	checkRetryAfter(t, res, 1, 1)
	if e := events.get(0); e.Outcome != idemhttp.OutcomeStoreError || !errors.Is(e.Err, errStoreDown) {
		t.Errorf("event: got %v %v, want store-error, %v", e.Outcome, e.Err, errStoreDown)
	}
	fs.down.Store(false)
	if res := post(h, "k", "x"); res.status != 201 || res.body != "execution 1: x" {
		t.Errorf("after recovery: got %d %q, want 201 \"execution 1: x\"", res.status, res.body)
	}
}

// testFailOpen checks that with WithFailOpen the handler runs without
// protection when the store is down, and that it is logged and reported.
func testFailOpen(t *testing.T, newStore func(t *testing.T) idem.Store) {
	fs := &flakyStore{Store: newStore(t)}
	fs.down.Store(true)
	var c counter
	var events eventLog
	var logs bytes.Buffer
	logger := slog.New(slog.NewTextHandler(&logs, nil))
	h := newMiddleware(t, newExecutor(t, fs), idemhttp.WithFailOpen(true), idemhttp.WithLogger(logger), idemhttp.WithHook(events.hook)).Handler(&c)
	for i := 1; i <= 2; i++ {
		want := fmt.Sprintf("execution %d: body", i)
		if res := post(h, "secret-key-value", "body"); res.status != 201 || res.body != want {
			t.Errorf("request %d: got %d %q, want 201 %q", i, res.status, res.body, want)
		}
	}
	if e := events.get(0); e.Outcome != idemhttp.OutcomeFailedOpen || !errors.Is(e.Err, errStoreDown) {
		t.Errorf("event: got %v %v, want failed-open, %v", e.Outcome, e.Err, errStoreDown)
	}
	if !strings.Contains(logs.String(), "without idempotency protection") {
		t.Errorf("log: got %q, want a warning about running unprotected", logs.String())
	}
	if strings.Contains(logs.String(), "secret-key-value") {
		t.Errorf("log contains the raw key: %q", logs.String())
	}
}

// testCommitFails checks that a response that cannot be stored does not
// reach the client: it gets 503 TypeOutcomeUnknown with Retry-After, the
// key stays IN_PROGRESS until its lease ends (a retry gets 409), and then a
// retry runs the handler again. On code that wrote the response through,
// the client got the handler's 200.
func testCommitFails(t *testing.T, newStore func(t *testing.T) idem.Store) {
	fs := &flakyStore{Store: newStore(t)}
	var events eventLog
	var n atomic.Int64
	var logs bytes.Buffer
	exec := newExecutor(t, fs, idem.WithLease(300*time.Millisecond))
	mw := newMiddleware(t, exec, idemhttp.WithHook(events.hook), idemhttp.WithLogger(slog.New(slog.NewTextHandler(&logs, nil))))
	inner := mw.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		i := n.Add(1)
		if i == 1 {
			fs.down.Store(true) // the store fails while the handler runs
		}
		w.Header().Set("Location", "/payments/1")
		w.Header().Set("Set-Cookie", "session=1")
		fmt.Fprintf(w, "execution %d", i)
	}))
	// An outer middleware's field survives the error response; the
	// handler's do not.
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("X-Request-Id", "r1")
		inner.ServeHTTP(w, r)
	})
	start := time.Now()
	res := post(h, "k", "")
	checkProblem(t, res, 503, idemhttp.TypeOutcomeUnknown)
	checkRetryAfter(t, res, 1, 1)
	if res.header.Get("Location") != "" || res.header.Get("Set-Cookie") != "" || res.header.Get("X-Request-Id") != "r1" {
		t.Errorf("fields: got %v, want X-Request-Id only, none of the handler's", res.header)
	}
	if e := events.get(0); e.Outcome != idemhttp.OutcomeNotRecorded || e.Status != 503 || !errors.Is(e.Err, errStoreDown) {
		t.Errorf("event: got %v %d %v, want not-recorded 503 %v", e.Outcome, e.Status, e.Err, errStoreDown)
	}
	if got := idemhttp.OutcomeNotRecorded.String(); got != "not-recorded" {
		t.Errorf("OutcomeNotRecorded.String(): got %q, want \"not-recorded\"", got)
	}
	if !strings.Contains(logs.String(), "level=ERROR") || !strings.Contains(logs.String(), "response not recorded") {
		t.Errorf("log: got %q, want an ERROR line about the response not recorded", logs.String())
	}
	fs.down.Store(false)
	// The key was neither stored nor released: until the lease ends a
	// retry gets 409, then it runs again.
	rec, err := fs.Get(t.Context(), idemhttp.PathKey("POST", "/payments", "k").Digest())
	if err != nil || rec.State != storekit.StateInProgress {
		t.Fatalf("record: got %v, %v, want IN_PROGRESS", rec.State, err)
	}
	if time.Since(start) < 250*time.Millisecond { // the lease was not over yet
		checkProblem(t, post(h, "k", ""), 409, idemhttp.TypeInProgress)
	}
	deadline := time.Now().Add(5 * time.Second)
	for {
		res := post(h, "k", "")
		if res.status == 200 {
			if res.body != "execution 2" {
				t.Errorf("after the lease: got %q, want \"execution 2\"", res.body)
			}
			break
		}
		if res.status != 409 || time.Now().After(deadline) {
			t.Fatalf("retry: got %d %q, want 409 until the lease ends, then 200", res.status, res.body)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// countingStore fails the first failures calls of Complete with an error
// that leaves the outcome unknown, and lets Complete block on gate when it
// is set.
type countingStore struct {
	idem.Store
	failures atomic.Int64
	gate     chan struct{} // nil: no blocking
	entered  chan struct{}
}

func (s *countingStore) Complete(ctx context.Context, key string, lease idem.Lease, result []byte, retention time.Duration) error {
	if s.entered != nil {
		s.entered <- struct{}{}
	}
	if s.gate != nil {
		<-s.gate
	}
	if s.failures.Add(-1) >= 0 {
		return errStoreDown
	}
	return s.Store.Complete(ctx, key, lease, result, retention)
}

// testCommitRepeated checks that a completion the store refuses is
// repeated while the lease lasts, and that the client gets the handler's
// response once it was stored.
func testCommitRepeated(t *testing.T, newStore func(t *testing.T) idem.Store) {
	cs := &countingStore{Store: newStore(t)}
	cs.failures.Store(3)
	var c counter
	h := newMiddleware(t, newExecutor(t, cs, idem.WithLease(2*time.Second))).Handler(&c)
	if res := post(h, "k", "x"); res.status != 201 || res.body != "execution 1: x" {
		t.Fatalf("first: got %d %q, want 201 \"execution 1: x\"", res.status, res.body)
	}
	if res := post(h, "k", "x"); res.status != 201 || res.header.Get(idemhttp.ReplayedHeader) != "true" || c.n.Load() != 1 {
		t.Errorf("retry: got %d replayed=%q after %d executions, want a replayed 201 after 1", res.status, res.header.Get(idemhttp.ReplayedHeader), c.n.Load())
	}
}

// testRecordBeforeSuccess checks that the status line of a response that
// fits the stored-size limit reaches the client only after the response was
// stored, also when it is larger than net/http's write buffer, and that a
// handler's flush or a text/event-stream response streams instead.
func testRecordBeforeSuccess(t *testing.T, newStore func(t *testing.T) idem.Store) {
	body := strings.Repeat("x", 256<<10) // over net/http's buffers, under 1 MiB
	for _, tt := range []struct {
		name   string
		stream bool
		write  func(w http.ResponseWriter)
	}{
		{"held", false, func(w http.ResponseWriter) {
			w.WriteHeader(http.StatusCreated)
			for i := 0; i < len(body); i += 1000 {
				io.WriteString(w, body[i:min(i+1000, len(body))])
			}
		}},
		{"flushed", true, func(w http.ResponseWriter) {
			w.WriteHeader(http.StatusCreated)
			io.WriteString(w, body)
			w.(http.Flusher).Flush()
		}},
		{"event-stream", true, func(w http.ResponseWriter) {
			w.Header().Set("Content-Type", "text/event-stream")
			w.WriteHeader(http.StatusCreated)
			io.WriteString(w, body)
		}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			cs := &countingStore{Store: newStore(t), gate: make(chan struct{}), entered: make(chan struct{}, 1)}
			h := newMiddleware(t, newExecutor(t, cs)).Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { tt.write(w) }))
			srv := httptest.NewServer(h)
			t.Cleanup(srv.Close)
			var once sync.Once
			open := func() { once.Do(func() { close(cs.gate) }) }
			t.Cleanup(open) // before srv.Close, if the test stops early
			got := make(chan *http.Response, 1)
			go func() {
				req, _ := http.NewRequestWithContext(t.Context(), "POST", srv.URL+"/payments", nil)
				req.Header.Set("Idempotency-Key", "k")
				res, err := srv.Client().Do(req)
				if err != nil {
					t.Error(err)
					close(got)
					return
				}
				got <- res
			}()
			<-cs.entered // the middleware is storing the response
			var res *http.Response
			if tt.stream {
				// A stream reaches the client before it is stored.
				res = <-got
				open()
			} else {
				// The header must not arrive while Complete is blocked:
				// wait on the client a while, then let Complete go.
				select {
				case res = <-got:
					t.Fatalf("the client got %d before the response was stored", res.StatusCode)
				case <-time.After(200 * time.Millisecond):
				}
				open()
				res = <-got
			}
			if res == nil {
				t.FailNow()
			}
			defer res.Body.Close()
			b, _ := io.ReadAll(res.Body)
			if res.StatusCode != 201 || string(b) != body {
				t.Errorf("got %d and %d bytes, want 201 and %d", res.StatusCode, len(b), len(body))
			}
		})
	}
}

// testClientGone checks that the response is stored although the client
// went away while the handler ran.
func testClientGone(t *testing.T, newStore func(t *testing.T) idem.Store) {
	var n atomic.Int64
	ctx, cancel := context.WithCancel(t.Context())
	h := newMiddleware(t, newExecutor(t, newStore(t))).Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		n.Add(1)
		cancel() // the client goes away
		<-r.Context().Done()
		w.WriteHeader(http.StatusAccepted)
		io.WriteString(w, "done")
	}))
	serve(h, request("POST", "/payments", "k", "").WithContext(ctx))
	res := post(h, "k", "")
	if res.status != 202 || res.body != "done" || res.header.Get(idemhttp.ReplayedHeader) != "true" || n.Load() != 1 {
		t.Errorf("retry: got %d %q replayed=%q after %d executions, want replayed 202 \"done\" after 1", res.status, res.body, res.header.Get(idemhttp.ReplayedHeader), n.Load())
	}
}

// testMethods checks which methods are covered.
func testMethods(t *testing.T, newStore func(t *testing.T) idem.Store) {
	tests := []struct {
		name    string
		opts    []idemhttp.Option
		method  string
		covered bool
	}{
		{"POST", nil, "POST", true},
		{"PATCH", nil, "PATCH", true},
		{"GET", nil, "GET", false},
		{"PUT", nil, "PUT", false},
		{"DELETE", nil, "DELETE", false},
		{"PUT configured", []idemhttp.Option{idemhttp.WithMethods("PUT")}, "PUT", true},
		{"POST not configured", []idemhttp.Option{idemhttp.WithMethods("PUT")}, "POST", false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var c counter
			h := newMiddleware(t, newExecutor(t, newStore(t)), tt.opts...).Handler(&c)
			res := serve(h, request(tt.method, "/x", "", "b"))
			if tt.covered {
				checkProblem(t, res, 400, idemhttp.TypeKeyMissing)
				return
			}
			serve(h, request(tt.method, "/x", "k", "b"))
			if res.status != 201 || c.n.Load() != 2 {
				t.Errorf("got %d after %d executions, want 201 after 2", res.status, c.n.Load())
			}
		})
	}
}

// testOptionalKey checks WithKeyRequired(false).
func testOptionalKey(t *testing.T, newStore func(t *testing.T) idem.Store) {
	var c counter
	var events eventLog
	h := newMiddleware(t, newExecutor(t, newStore(t)), idemhttp.WithKeyRequired(false), idemhttp.WithHook(events.hook)).Handler(&c)
	post(h, "", "x")
	res := post(h, "", "x")
	if res.status != 201 || res.body != "execution 2: x" {
		t.Errorf("got %d %q, want 201 \"execution 2: x\"", res.status, res.body)
	}
	if e := events.get(0); e.Outcome != idemhttp.OutcomeNoKey {
		t.Errorf("event: got %v, want no-key", e.Outcome)
	}
	// A malformed key is still rejected.
	checkProblem(t, post(h, "a\x7fb", "x"), 400, idemhttp.TypeKeyInvalid)
}

type eventLog struct {
	mu     sync.Mutex
	events []idemhttp.Event
}

func (l *eventLog) hook(_ *http.Request, e idemhttp.Event) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.events = append(l.events, e)
}

func (l *eventLog) get(i int) idemhttp.Event {
	l.mu.Lock()
	defer l.mu.Unlock()
	if i >= len(l.events) {
		return idemhttp.Event{}
	}
	return l.events[i]
}

// testHooks checks the outcome, status and duration of each kind of
// request, and that every hook is called.
func testHooks(t *testing.T, newStore func(t *testing.T) idem.Store) {
	var events, second eventLog
	b := newBlocking()
	h := newMiddleware(t, newExecutor(t, newStore(t)), idemhttp.WithHook(events.hook), idemhttp.WithHook(second.hook)).Handler(b)
	done := make(chan struct{})
	go func() { post(h, "k", "x"); close(done) }()
	<-b.started
	post(h, "k", "x") // conflict
	close(b.release)
	<-done
	post(h, "k", "x")  // replayed
	post(h, "k", "y")  // mismatch
	post(h, "", "x")   // rejected
	post(h, "k2", "x") // executed
	want := []struct {
		o      idemhttp.Outcome
		status int
	}{
		{idemhttp.OutcomeConflict, 409},
		{idemhttp.OutcomeExecuted, 201},
		{idemhttp.OutcomeReplayed, 201},
		{idemhttp.OutcomeMismatch, 422},
		{idemhttp.OutcomeRejected, 400},
		{idemhttp.OutcomeExecuted, 201},
	}
	for i, w := range want {
		e := events.get(i)
		if e.Outcome != w.o || e.Status != w.status || e.Duration <= 0 {
			t.Errorf("event %d: got %v %d %v, want %v %d and a positive duration", i, e.Outcome, e.Status, e.Duration, w.o, w.status)
		}
		if e.Outcome.String() != w.o.String() || strings.Contains(e.Outcome.String(), "invalid") {
			t.Errorf("event %d: outcome name %q", i, e.Outcome)
		}
		if s := second.get(i); s.Outcome != e.Outcome {
			t.Errorf("second hook, event %d: got %v, want %v", i, s.Outcome, e.Outcome)
		}
	}
}

// testErrorHandler checks a custom error handler: it gets the problem, and
// Retry-After is set already.
func testErrorHandler(t *testing.T, newStore func(t *testing.T) idem.Store) {
	b := newBlocking()
	h := newMiddleware(t, newExecutor(t, newStore(t)), idemhttp.WithErrorHandler(func(w http.ResponseWriter, r *http.Request, p *idemhttp.Problem) {
		w.Header().Set("Content-Type", "text/plain")
		w.WriteHeader(p.Status)
		fmt.Fprintf(w, "%s|%t", p.Type, p.RetryAfter > 0)
	})).Handler(b)
	done := make(chan struct{})
	go func() { post(h, "k", ""); close(done) }()
	<-b.started
	res := post(h, "k", "")
	close(b.release)
	<-done
	if want := idemhttp.TypeInProgress + "|true"; res.status != 409 || res.body != want || res.header.Get("Retry-After") == "" {
		t.Errorf("got %d %q Retry-After %q, want 409 %q and a Retry-After", res.status, res.body, res.header.Get("Retry-After"), want)
	}
}

// testFence checks that the handler's context carries the lease.
func testFence(t *testing.T, newStore func(t *testing.T) idem.Store) {
	var fences []int64
	h := newMiddleware(t, newExecutor(t, newStore(t))).Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		f, ok := idem.FenceFrom(r.Context())
		if !ok || f <= 0 {
			t.Errorf("FenceFrom: got %d, %v, want a positive fence", f, ok)
		}
		fences = append(fences, f)
		w.WriteHeader(503)
	}))
	post(h, "k", "")
	post(h, "k", "")
	if len(fences) != 2 || fences[1] <= fences[0] {
		t.Errorf("fences: got %v, want two, increasing", fences)
	}
}

func TestNewInvalid(t *testing.T) {
	s, _ := memstore.New()
	exec := newExecutor(t, s)
	tests := []struct {
		name string
		exec *idem.Executor
		opts []idemhttp.Option
	}{
		{"nil executor", nil, nil},
		{"nil option", exec, []idemhttp.Option{nil}},
		{"empty header", exec, []idemhttp.Option{idemhttp.WithHeader("")}},
		{"bad header", exec, []idemhttp.Option{idemhttp.WithHeader("Idempotency Key")}},
		{"no methods", exec, []idemhttp.Option{idemhttp.WithMethods()}},
		{"bad method", exec, []idemhttp.Option{idemhttp.WithMethods("PO ST")}},
		{"bad fingerprint header", exec, []idemhttp.Option{idemhttp.WithFingerprintHeaders("a:b")}},
		{"nil principal", exec, []idemhttp.Option{idemhttp.WithPrincipal(nil)}},
		{"nil route", exec, []idemhttp.Option{idemhttp.WithRoute(nil)}},
		{"zero body size", exec, []idemhttp.Option{idemhttp.WithMaxBodySize(0)}},
		{"zero response size", exec, []idemhttp.Option{idemhttp.WithMaxResponseSize(0)}},
		{"negative wait", exec, []idemhttp.Option{idemhttp.WithWait(-1)}},
		{"zero retry-after", exec, []idemhttp.Option{idemhttp.WithRetryAfter(0)}},
		{"nil policy", exec, []idemhttp.Option{idemhttp.WithPolicy(nil)}},
		{"nil hook", exec, []idemhttp.Option{idemhttp.WithHook(nil)}},
		{"nil error handler", exec, []idemhttp.Option{idemhttp.WithErrorHandler(nil)}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			m, err := idemhttp.New(tt.exec, tt.opts...)
			if !errors.Is(err, idem.ErrInvalid) || m != nil {
				t.Errorf("got %v, %v, want nil and an error wrapping idem.ErrInvalid", m, err)
			}
		})
	}
	if _, err := idemhttp.New(exec, idemhttp.WithHeader("x-request-key"), idemhttp.WithMethods("POST", "PUT")); err != nil {
		t.Errorf("valid options: got %v, want nil", err)
	}
}

func TestCustomHeader(t *testing.T) {
	s, _ := memstore.New()
	var c counter
	h := newMiddleware(t, newExecutor(t, s), idemhttp.WithHeader("x-request-id")).Handler(&c)
	send := func() response {
		r := request("POST", "/", "", "x")
		r.Header.Set("X-Request-Id", "abc")
		return serve(h, r)
	}
	send()
	res := send()
	if res.header.Get(idemhttp.ReplayedHeader) != "true" {
		t.Errorf("replayed: got %q, want true", res.header.Get(idemhttp.ReplayedHeader))
	}
	p := checkProblem(t, post(h, "k", "x"), 400, idemhttp.TypeKeyMissing)
	if !strings.Contains(p.Detail, "X-Request-Id") {
		t.Errorf("detail: got %q, want it to name X-Request-Id", p.Detail)
	}
}

func TestHandlerNilPanics(t *testing.T) {
	s, _ := memstore.New()
	m := newMiddleware(t, newExecutor(t, s))
	defer func() {
		if recover() == nil {
			t.Error("Handler(nil): got no panic, want one")
		}
	}()
	m.Handler(nil)
}

// TestReadBodyError checks that a body that fails to read is a 400.
func TestReadBodyError(t *testing.T) {
	s, _ := memstore.New()
	var c counter
	h := newMiddleware(t, newExecutor(t, s)).Handler(&c)
	r := request("POST", "/", "k", "")
	r.Body = io.NopCloser(io.MultiReader(strings.NewReader("abc"), iotestErrReader{}))
	r.ContentLength = -1
	checkProblem(t, serve(h, r), 400, idemhttp.TypeBodyUnreadable)
	r = request("POST", "/", "k", "")
	r.Body = http.MaxBytesReader(httptest.NewRecorder(), io.NopCloser(strings.NewReader("abcdef")), 3)
	r.ContentLength = -1
	checkProblem(t, serve(h, r), 413, idemhttp.TypeBodyTooLarge)
	if c.n.Load() != 0 {
		t.Errorf("handler executions: got %d, want 0", c.n.Load())
	}
}

type iotestErrReader struct{}

func (iotestErrReader) Read([]byte) (int, error) { return 0, errors.New("read failed") }

// testAbandon checks AbandonKey: nothing is stored, the key stays
// IN_PROGRESS (retries get 409) until its lease expires, and then the
// handler runs again.
func testAbandon(t *testing.T, newStore func(t *testing.T) idem.Store) {
	store := newStore(t)
	exec := newExecutor(t, store, idem.WithLease(300*time.Millisecond))
	var events eventLog
	var n atomic.Int64
	policy := func(r *http.Request, status int) idemhttp.Decision {
		if status == http.StatusGatewayTimeout {
			return idemhttp.AbandonKey
		}
		return idemhttp.DefaultPolicy(r, status)
	}
	h := newMiddleware(t, exec, idemhttp.WithPolicy(policy), idemhttp.WithHook(events.hook)).Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if n.Add(1) == 1 {
			w.WriteHeader(http.StatusGatewayTimeout)
			io.WriteString(w, "timed out")
			return
		}
		w.WriteHeader(http.StatusCreated)
		io.WriteString(w, "done")
	}))
	start := time.Now()
	if res := post(h, "k", "x"); res.status != 504 || res.body != "timed out" {
		t.Fatalf("first: got %d %q, want 504 \"timed out\"", res.status, res.body)
	}
	if e := events.get(0); e.Outcome != idemhttp.OutcomeAbandoned || e.Status != 504 || e.Err != nil {
		t.Errorf("event: got %v %d %v, want abandoned 504 <nil>", e.Outcome, e.Status, e.Err)
	}
	if got := idemhttp.OutcomeAbandoned.String(); got != "abandoned" {
		t.Errorf("OutcomeAbandoned.String(): got %q, want \"abandoned\"", got)
	}
	rec, err := store.Get(t.Context(), idemhttp.PathKey("POST", "/payments", "k").Digest())
	if err != nil || rec.State != storekit.StateInProgress {
		t.Fatalf("record: got %v, %v, want IN_PROGRESS", rec.State, err)
	}
	res := post(h, "k", "x")
	if time.Since(start) < 250*time.Millisecond {
		checkProblem(t, res, 409, idemhttp.TypeInProgress)
		checkRetryAfter(t, res, 1, 1)
	}
	// No heartbeat extends an abandoned lease: after it, the key is taken
	// over and the handler runs again.
	time.Sleep(time.Until(start.Add(350 * time.Millisecond)))
	if res := post(h, "k", "x"); res.status != 201 || res.body != "done" || n.Load() != 2 {
		t.Fatalf("after the lease: got %d %q after %d executions, want 201 \"done\" after 2", res.status, res.body, n.Load())
	}
	if res := post(h, "k", "x"); res.header.Get(idemhttp.ReplayedHeader) != "true" || res.body != "done" {
		t.Errorf("retry: got %d %q replayed=%q, want the replay of \"done\"", res.status, res.body, res.header.Get(idemhttp.ReplayedHeader))
	}
}

// testPathKey checks that PathKey and PrincipalPathKey name the record the
// middleware writes for a request routed by URL path, and that the stored
// response decodes with httpkit.DecodeResponse.
func testPathKey(t *testing.T, newStore func(t *testing.T) idem.Store) {
	tests := []struct {
		name string
		opts []idemhttp.Option
		key  idem.Key
	}{
		{"no principal", nil, idemhttp.PathKey("POST", "/payments/7", "k 1")},
		{"principal", []idemhttp.Option{idemhttp.WithPrincipal(func(r *http.Request) string { return r.Header.Get("X-User") })},
			idemhttp.PrincipalPathKey("POST", "/payments/7", "alice", "k 1")},
		{"empty principal", []idemhttp.Option{idemhttp.WithPrincipal(func(r *http.Request) string { return r.Header.Get("X-Nobody") }), httpkit.EmptyPrincipal(true)},
			idemhttp.PrincipalPathKey("POST", "/payments/7", "", "k 1")},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			store := newStore(t)
			exec := newExecutor(t, store)
			var c counter
			h := newMiddleware(t, exec, tt.opts...).Handler(&c)
			r := request("POST", "/payments/7?x=1", `"k 1"`, "body")
			r.Header.Set("X-User", "alice")
			if res := serve(h, r); res.status != 201 {
				t.Fatalf("got %d, want 201", res.status)
			}
			rec, err := store.Get(t.Context(), tt.key.Digest())
			if err != nil {
				t.Fatalf("Get(%s): %v", tt.key.Digest(), err)
			}
			value, err := adapterkit.DecodeResult(exec, tt.key.Digest(), rec.Result)
			if err != nil {
				t.Fatal(err)
			}
			res, err := httpkit.DecodeResponse(value)
			if err != nil {
				t.Fatal(err)
			}
			if res.Status != 201 || string(res.Body) != "execution 1: body" || res.Header.Get("Content-Type") != "text/plain; charset=utf-8" {
				t.Errorf("stored response: got %d %q %v, want 201 \"execution 1: body\" with its Content-Type", res.Status, res.Body, res.Header)
			}
			// Another principal, method or path is another key.
			for _, other := range []idem.Key{
				idemhttp.PrincipalPathKey("POST", "/payments/7", "bob", "k 1"),
				idemhttp.PathKey("PATCH", "/payments/7", "k 1"),
				idemhttp.PathKey("POST", "/payments/8", "k 1"),
			} {
				if other == tt.key {
					continue
				}
				if _, err := store.Get(t.Context(), other.Digest()); !errors.Is(err, storekit.ErrNotFound) {
					t.Errorf("Get(%q): got %v, want ErrNotFound", other.Scope, err)
				}
			}
		})
	}
	if _, err := httpkit.DecodeResponse([]byte("garbage")); !errors.Is(err, idem.ErrCorruptResult) {
		t.Errorf("httpkit.DecodeResponse(garbage): got %v, want ErrCorruptResult", err)
	}
}
