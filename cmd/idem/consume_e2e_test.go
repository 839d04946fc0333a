package main

import (
	"bytes"
	"encoding/base64"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/idemgo/idem"
	"github.com/idemgo/idem/consumer/sidecar"
	"github.com/idemgo/idem/redisstore"
	"github.com/idemgo/idem/testkit/redistest"
)

// handlerCall is one request the test handler got.
type handlerCall struct {
	key, fence, body string
	header           http.Header
}

// testHandler is the HTTP handler of the consume tests: it records every
// call, answers with the status its answer function gives (200 by
// default), and holds a call while hold is set for its key.
type testHandler struct {
	mu     sync.Mutex
	calls  []handlerCall
	answer func(key string, n int) int // n: the key's calls so far, this one included
	hold   map[string]chan struct{}
	inCall chan string
	srv    *httptest.Server
}

func newTestHandler(t *testing.T, answer func(key string, n int) int) *testHandler {
	h := &testHandler{answer: answer, hold: map[string]chan struct{}{}, inCall: make(chan string, 100)}
	h.srv = httptest.NewServer(h)
	t.Cleanup(h.srv.Close)
	return h
}

func (h *testHandler) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	body, _ := io.ReadAll(r.Body)
	key := r.Header.Get("Idempotency-Key")
	h.mu.Lock()
	h.calls = append(h.calls, handlerCall{key: key, fence: r.Header.Get("Idempotency-Fence"), body: string(body), header: r.Header.Clone()})
	n := h.countLocked(key)
	hold := h.hold[key]
	h.mu.Unlock()
	select {
	case h.inCall <- key:
	default:
	}
	if hold != nil {
		select {
		case <-hold:
		case <-r.Context().Done():
			return
		}
	}
	status := 200
	if h.answer != nil {
		status = h.answer(key, n)
	}
	w.Header().Set("X-Handled", key)
	w.WriteHeader(status)
	io.WriteString(w, "answer "+strconv.Itoa(status)+" to "+key)
}

func (h *testHandler) countLocked(key string) int {
	n := 0
	for _, c := range h.calls {
		if c.key == key {
			n++
		}
	}
	return n
}

func (h *testHandler) count(key string) int {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.countLocked(key)
}

func (h *testHandler) callsOf(key string) []handlerCall {
	h.mu.Lock()
	defer h.mu.Unlock()
	var out []handlerCall
	for _, c := range h.calls {
		if c.key == key {
			out = append(out, c)
		}
	}
	return out
}

// waitFor polls cond until it holds, for at most 20s (the state is in
// Redis and the handler: there is no event to wait on across processes).
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func xadd(t *testing.T, rdb *redis.Client, stream string, values ...any) string {
	t.Helper()
	id, err := rdb.XAdd(t.Context(), &redis.XAddArgs{Stream: stream, Values: values}).Result()
	if err != nil {
		t.Fatal(err)
	}
	return id
}

func pendingCount(t *testing.T, rdb *redis.Client, stream, group string) int64 {
	t.Helper()
	p, err := rdb.XPending(t.Context(), stream, group).Result()
	if err != nil {
		return -1
	}
	return p.Count
}

// TestConsumeRedisStream: each entry is POSTed once per key with its
// headers; a duplicate of a completed key is acked without a call; a 5xx
// is retried; a 400 is dead-lettered with the handler's answer; nothing
// stays pending; SIGTERM ends the command with code 0.
func TestConsumeRedisStream(t *testing.T) {
	t.Parallel()
	testConsumeRedisStream(t, "--to")
}

// TestConsumeBatch: TestConsumeRedisStream with one request per batch
// (--to-batch) to a Go batch handler in front of the same test handler:
// every message decided as in the per-message mode, with the same headers,
// fences and stored results, the first batch in one request.
func TestConsumeBatch(t *testing.T) {
	t.Parallel()
	b := testConsumeRedisStream(t, "--to-batch")
	if n := b.sizes(); len(n) == 0 || n[0] != 4 {
		t.Errorf("batch requests of %v messages, want the first with the 4 entries but k1's repeat", n)
	}
}

// testConsumeRedisStream runs TestConsumeRedisStream's scenario with the
// handler at flag (--to, or --to-batch: then behind a batchHandler, which
// it returns).
func testConsumeRedisStream(t *testing.T, flag string) *batchHandler {
	srv := redistest.Start(t)
	rdb := srv.GoRedis(t)
	h := newTestHandler(t, func(key string, n int) int {
		switch {
		case key == "bad":
			return 400
		case key == "flaky" && n == 1:
			return 503
		case key == "busy" && n == 1:
			return 429
		}
		return 200
	})
	tp := "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
	id1 := xadd(t, rdb, "orders", "key", "k1", "payload", `{"amount":1}`, "traceparent", tp, "type", "order")
	xadd(t, rdb, "orders", "key", "k1", "payload", `{"amount":1}`)
	xadd(t, rdb, "orders", "key", "bad", "payload", `{}`)
	xadd(t, rdb, "orders", "key", "flaky", "payload", `{}`)
	xadd(t, rdb, "orders", "key", "busy", "payload", `{}`)
	admin := freeAddr(t)
	url := h.srv.URL + "/messages"
	var b *batchHandler
	if flag == "--to-batch" {
		b = newBatchHandler(t, h)
		url = b.srv.URL
	}
	p := startIdem(t, "consume", "--from", "redis-stream://"+srv.Addr()+"/orders?group=billing", flag, url,
		"--lease", "300ms", "--retry-delay", "10ms", "--batch", "10", "--admin-listen", admin)
	waitFor(t, "every entry settled", func() bool {
		dl, _ := rdb.XLen(t.Context(), "orders:dlq").Result()
		return h.count("flaky") == 2 && h.count("busy") == 2 && dl == 1 && pendingCount(t, rdb, "orders", "billing") == 0
	})
	if n := h.count("k1"); n != 1 {
		t.Errorf("k1: %d calls, want 1 (the duplicate is acked without a call)", n)
	}
	if n := h.count("bad"); n != 1 {
		t.Errorf("bad: %d calls, want 1 (a 400 is terminal)", n)
	}
	c := h.callsOf("k1")[0]
	for name, want := range map[string]string{
		"Idem-Broker": "redis-stream", "Idem-Topic": "orders", "Idem-Message-Id": id1, "Idem-Deliveries": "1",
		"Traceparent": tp, "Idem-Header-Type": "order",
	} {
		if got := c.header.Get(name); got != want {
			t.Errorf("header %s: got %q, want %q", name, got, want)
		}
	}
	if c.body != `{"amount":1}` || c.fence == "" {
		t.Errorf("k1's call: body %q fence %q, want the payload and a fence", c.body, c.fence)
	}
	flaky := h.callsOf("flaky")
	if f0, _ := strconv.Atoi(flaky[0].fence); flaky[1].fence == "" || mustAtoi(flaky[1].fence) <= f0 {
		t.Errorf("flaky's fences: %q then %q, want a larger one on the retry", flaky[0].fence, flaky[1].fence)
	}
	if d := flaky[1].header.Get("Idem-Deliveries"); d != "2" {
		t.Errorf("flaky's second call: Idem-Deliveries %q, want 2", d)
	}
	dl, err := rdb.XRange(t.Context(), "orders:dlq", "-", "+").Result()
	if err != nil || len(dl) != 1 {
		t.Fatalf("dead letters: %v %v", dl, err)
	}
	if e, _ := dl[0].Values["dlq-error"].(string); dl[0].Values["key"] != "bad" || !strings.Contains(e, "400") || !strings.Contains(e, "answer 400 to bad") {
		t.Errorf("dead letter: got %v, want key bad with the handler's status and body in dlq-error", dl[0].Values)
	}
	res, err := http.Get("http://" + admin + "/readyz")
	if err != nil || res.StatusCode != 200 {
		t.Errorf("/readyz: %v %v, want 200", res, err)
	}
	// The stored result is the handler's response.
	if v := storedResult(t, rdb, "orders", "k1"); v.Status != 200 || string(v.Body) != "answer 200 to k1" || v.Header.Get("X-Handled") != "k1" {
		t.Errorf("k1's stored result: got %+v, want the handler's 200 with its header and body", v)
	}
	p.terminate()
	if code := p.wait(); code != 0 {
		t.Errorf("exit code after SIGTERM: %d, want 0", code)
	}
	return b
}

// batchHandler is a batch handler (--to-batch) that answers each message
// of a request with what h answers to it as a request of its own.
type batchHandler struct {
	h   http.Handler
	mu  sync.Mutex
	n   []int // the messages of each request
	srv *httptest.Server
}

func newBatchHandler(t *testing.T, h http.Handler) *batchHandler {
	b := &batchHandler{h: h}
	b.srv = httptest.NewServer(b)
	t.Cleanup(b.srv.Close)
	return b
}

func (b *batchHandler) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	var msgs []sidecar.BatchMessage
	if err := json.NewDecoder(r.Body).Decode(&msgs); err != nil {
		http.Error(w, err.Error(), 400)
		return
	}
	b.mu.Lock()
	b.n = append(b.n, len(msgs))
	b.mu.Unlock()
	out := make([]sidecar.BatchOutcome, len(msgs))
	for k, m := range msgs {
		body := []byte(m.Body)
		if m.Encoding == "base64" {
			body, _ = base64.StdEncoding.DecodeString(m.Body)
		}
		req := httptest.NewRequestWithContext(r.Context(), http.MethodPost, "/messages", bytes.NewReader(body))
		for name, v := range m.Headers {
			req.Header.Set(name, v)
		}
		rec := httptest.NewRecorder()
		b.h.ServeHTTP(rec, req)
		out[k] = sidecar.BatchOutcome{Status: rec.Code, Headers: map[string]string{}, Body: rec.Body.String()}
		for name := range rec.Header() {
			out[k].Headers[name] = rec.Header().Get(name)
		}
	}
	json.NewEncoder(w).Encode(out)
}

func (b *batchHandler) sizes() []int {
	b.mu.Lock()
	defer b.mu.Unlock()
	return append([]int(nil), b.n...)
}

// storedResult returns the result stored for key in scope.
func storedResult(t *testing.T, rdb *redis.Client, scope, key string) sidecar.Result {
	t.Helper()
	st, err := redisstore.New(rdb)
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	exec, err := idem.New(st)
	if err != nil {
		t.Fatal(err)
	}
	_, a, err := exec.Begin(t.Context(), idem.Key{Scope: scope, ID: key}, "")
	if err != nil {
		t.Fatalf("the record of %s: %v", key, err)
	}
	if !a.Replayed() {
		a.Release(t.Context())
		t.Fatalf("%s was not completed", key)
	}
	var r sidecar.Result
	if err := json.Unmarshal(a.Value(), &r); err != nil {
		t.Fatalf("stored result %q: %v", a.Value(), err)
	}
	return r
}

func mustAtoi(s string) int {
	n, _ := strconv.Atoi(s)
	return n
}

// TestConsumeDrainOnSIGTERM: a handler in flight when SIGTERM comes is
// let finish, its key completed and its entry acked before the exit.
func TestConsumeDrainOnSIGTERM(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t)
	rdb := srv.GoRedis(t)
	h := newTestHandler(t, nil)
	release := make(chan struct{})
	h.hold["slow"] = release
	xadd(t, rdb, "jobs", "key", "slow", "payload", "x")
	p := startIdem(t, "consume", "--from", "redis-stream://"+srv.Addr()+"/jobs?group=g", "--to", h.srv.URL, "--shutdown-timeout", "10s")
	select {
	case <-h.inCall:
	case <-time.After(20 * time.Second):
		t.Fatal("the handler was not called")
	}
	p.terminate()
	time.AfterFunc(200*time.Millisecond, func() { close(release) }) // the drain waits for it
	if code := p.wait(); code != 0 {
		t.Errorf("exit code: %d, want 0", code)
	}
	if n := pendingCount(t, rdb, "jobs", "g"); n != 0 {
		t.Errorf("pending after the drain: %d, want 0 (the handled entry acked)", n)
	}
	// Negative control: a second run calls nothing (the key is completed
	// and the entry acked).
	p2 := startIdem(t, "consume", "--from", "redis-stream://"+srv.Addr()+"/jobs?group=g", "--to", h.srv.URL)
	xadd(t, rdb, "jobs", "key", "slow", "payload", "x")
	waitFor(t, "the duplicate acked", func() bool { return pendingCount(t, rdb, "jobs", "g") == 0 && lastDelivered(t, rdb, "jobs", "g") })
	p2.terminate()
	p2.wait()
	if n := h.count("slow"); n != 1 {
		t.Errorf("slow: %d calls, want 1", n)
	}
}

// lastDelivered reports whether the group read every entry of the stream.
func lastDelivered(t *testing.T, rdb *redis.Client, stream, group string) bool {
	gs, err := rdb.XInfoGroups(t.Context(), stream).Result()
	if err != nil {
		return false
	}
	last, _ := rdb.XRevRangeN(t.Context(), stream, "+", "-", 1).Result()
	for _, g := range gs {
		if g.Name == group && len(last) == 1 && g.LastDeliveredID == last[0].ID {
			return true
		}
	}
	return false
}

// TestConsumeRefusesEmbeddedStore: the embedded store is refused, and the
// error says why.
func TestConsumeRefusesEmbeddedStore(t *testing.T) {
	code, _, stderr := runIdem(t, "consume", "--from", "kafka://127.0.0.1:9092/events?group=g", "--to", "http://127.0.0.1:9/")
	if code != exitUsage || !strings.Contains(stderr, "embedded store is refused") || !strings.Contains(stderr, "second consumer") {
		t.Errorf("got code %d, stderr %q; want %d and why the embedded store is refused", code, stderr, exitUsage)
	}
}

// TestConsumeParallel: with --parallel 4 the handler gets four calls of a
// batch at once and never more, and no entry is acked while its call runs
// (record before ack); every key is called once.
func TestConsumeParallel(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t)
	rdb := srv.GoRedis(t)
	const parallel, n = 4, 8
	var mu sync.Mutex
	running, peak, calls := 0, 0, map[string]int{}
	all, release := make(chan struct{}), make(chan struct{})
	h := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		running++
		peak = max(peak, running)
		calls[r.Header.Get("Idempotency-Key")]++
		if running == parallel && len(calls) == parallel {
			close(all)
		}
		mu.Unlock()
		select {
		case <-release:
		case <-r.Context().Done():
		}
		mu.Lock()
		running--
		mu.Unlock()
	}))
	t.Cleanup(h.Close)
	for i := range n {
		xadd(t, rdb, "par", "key", "k"+strconv.Itoa(i), "payload", "x")
	}
	p := startIdem(t, "consume", "--from", "redis-stream://"+srv.Addr()+"/par?group=g", "--to", h.URL,
		"--batch", strconv.Itoa(n), "--parallel", strconv.Itoa(parallel), "--handler-timeout", "30s")
	select {
	case <-all:
	case <-time.After(30 * time.Second):
		mu.Lock()
		defer mu.Unlock()
		t.Fatalf("got %d calls running at once, want %d", running, parallel)
	}
	if got := pendingCount(t, rdb, "par", "g"); got != n {
		t.Errorf("pending while the batch's calls run: %d, want %d (nothing acked before its call answered)", got, n)
	}
	close(release)
	waitFor(t, "every entry acked", func() bool {
		return pendingCount(t, rdb, "par", "g") == 0 && lastDelivered(t, rdb, "par", "g")
	})
	p.terminate()
	p.wait()
	mu.Lock()
	defer mu.Unlock()
	if peak != parallel || len(calls) != n {
		t.Errorf("got %d calls at once and %d keys called, want %d and %d", peak, len(calls), parallel, n)
	}
	for k, c := range calls {
		if c != 1 {
			t.Errorf("%s: %d calls, want 1", k, c)
		}
	}
}
