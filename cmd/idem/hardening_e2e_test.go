package main

import (
	"bufio"
	"bytes"
	"compress/gzip"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// TestProxyMethodCase: "post" is POST for the proxy too; a request with a
// key on a method that is not covered is forwarded with a header that says
// the key was ignored.
func TestProxyMethodCase(t *testing.T) {
	t.Parallel()
	up := newUpstream(t)
	px := startProxy(t, up.url(), []string{"--data", t.TempDir()})
	first := send(t, "post", px.url("/orders"), "lower", "x")
	second := send(t, "post", px.url("/orders"), "lower", "x")
	third := send(t, "POST", px.url("/orders"), "lower", "x")
	if first.status != 201 || !second.replayed() || !third.replayed() || up.executions("lower") != 1 {
		t.Errorf("got %d, replayed %v, %v after %d executions, want 1 execution replayed twice",
			first.status, second.replayed(), third.replayed(), up.executions("lower"))
	}
	res := send(t, http.MethodPut, px.url("/orders"), "put-key", "x")
	if res.status != 201 || res.header.Get("Idempotency-Key-Ignored") != "true" {
		t.Errorf("PUT with a key: got %d Idempotency-Key-Ignored %q, want 201 and true", res.status, res.header.Get("Idempotency-Key-Ignored"))
	}
	if res := send(t, http.MethodGet, px.url("/orders"), "", ""); res.header.Get("Idempotency-Key-Ignored") != "" {
		t.Errorf("GET without a key: got Idempotency-Key-Ignored %q, want none", res.header.Get("Idempotency-Key-Ignored"))
	}
}

// TestProxyHelpScope: the help says what another method or path does (it
// is another key), not that it gets 422.
func TestProxyHelpScope(t *testing.T) {
	t.Parallel()
	var out, errOut strings.Builder
	run(t.Context(), []string{"help", "proxy"}, &out, &errOut, noEnv)
	help := strings.Join(strings.Fields(out.String()), " ")
	if strings.Contains(help, "another method, path, query or body gets 422") {
		t.Errorf("help still says another method or path gets 422")
	}
	for _, want := range []string{"the same key with another method or path is another key", "/orders and /orders/ are two paths", "Methods are compared ignoring case"} {
		if !strings.Contains(help, want) {
			t.Errorf("help: want %q", want)
		}
	}
	// And it is so: the same key on /orders and /orders/ runs twice.
	up := newUpstream(t)
	px := startProxy(t, up.url(), []string{"--data", t.TempDir()})
	a := post(t, px.url("/orders"), "slash", "x")
	b := post(t, px.url("/orders/"), "slash", "x")
	if a.status != 201 || b.status != 201 || b.replayed() || up.executions("slash") != 2 {
		t.Errorf("got %d then %d (replayed %v) after %d executions, want two executions", a.status, b.status, b.replayed(), up.executions("slash"))
	}
}

// trailerUpstream records the trailers of the requests it gets.
type trailerUpstream struct {
	mu       sync.Mutex
	trailers []http.Header
}

func (u *trailerUpstream) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	io.Copy(io.Discard, r.Body)
	u.mu.Lock()
	u.trailers = append(u.trailers, r.Trailer.Clone())
	u.mu.Unlock()
	w.WriteHeader(http.StatusCreated)
}

// TestProxyStripsTrailers: a client's Idempotency-Fence or Idempotency-Key
// sent as a trailer never reaches the upstream, for covered requests and
// for requests passed through; other trailers do.
func TestProxyStripsTrailers(t *testing.T) {
	t.Parallel()
	tu := &trailerUpstream{}
	srv := httptest.NewServer(tu)
	t.Cleanup(srv.Close)
	px := startProxy(t, srv.URL, []string{"--data", t.TempDir()})
	for i, tc := range []struct{ method, key string }{{"POST", "trailer-1"}, {"PUT", ""}} {
		pr, pw := io.Pipe()
		req, err := http.NewRequest(tc.method, px.url("/orders"), pr)
		if err != nil {
			t.Fatal(err)
		}
		if tc.key != "" {
			req.Header.Set("Idempotency-Key", tc.key)
		}
		req.Trailer = http.Header{"Idempotency-Fence": nil, "Idempotency-Key": nil, "Idempotency_fence": nil, "X-Other": nil}
		go func() {
			io.WriteString(pw, "body")
			req.Trailer.Set("Idempotency-Fence", "999999999999999999")
			req.Trailer.Set("Idempotency-Key", "forged")
			req.Trailer["Idempotency_fence"] = []string{"999999999999999999"}
			req.Trailer.Set("X-Other", "kept")
			pw.Close()
		}()
		res, err := client.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		readAll(res)
		if res.StatusCode != 201 {
			t.Fatalf("%s: got %d, want 201", tc.method, res.StatusCode)
		}
		tu.mu.Lock()
		got := tu.trailers[i]
		tu.mu.Unlock()
		for name := range got {
			if n := strings.ToLower(strings.ReplaceAll(name, "_", "-")); n == "idempotency-fence" || n == "idempotency-key" {
				t.Errorf("%s: the upstream got the client's trailer %s: %q", tc.method, name, got[name])
			}
		}
		if tc.method == "POST" && got.Get("X-Other") != "kept" {
			t.Errorf("%s: trailer X-Other: got %q, want kept", tc.method, got.Get("X-Other"))
		}
	}
}

// TestProxyExpectContinue: a request with Expect: 100-continue gets one 100
// Continue, not the proxy's and then the upstream's.
func TestProxyExpectContinue(t *testing.T) {
	t.Parallel()
	up := newUpstream(t)
	px := startProxy(t, up.url(), []string{"--data", t.TempDir()})
	for _, key := range []string{"expect", ""} { // covered, and passed through
		conn, err := net.DialTimeout("tcp", px.addr, 5*time.Second)
		if err != nil {
			t.Fatal(err)
		}
		conn.SetDeadline(time.Now().Add(10 * time.Second))
		method := "POST"
		hdr := "Idempotency-Key: " + key + "\r\n"
		if key == "" {
			method, hdr = "PUT", ""
		}
		io.WriteString(conn, method+" /orders HTTP/1.1\r\nHost: x\r\n"+hdr+"Content-Length: 4\r\nExpect: 100-continue\r\nConnection: close\r\n\r\n")
		br := bufio.NewReader(conn)
		// Wait for the 100 Continue before sending the body, as clients do.
		line, err := br.ReadString('\n')
		if err != nil || !strings.HasPrefix(line, "HTTP/1.1 100 ") {
			t.Fatalf("%s: first line %q, %v, want 100 Continue", method, line, err)
		}
		io.WriteString(conn, "body")
		rest, _ := io.ReadAll(br)
		conn.Close()
		if n := strings.Count(string(rest), "HTTP/1.1 100 "); n != 0 {
			t.Errorf("%s: got %d more 100 Continue responses, want 1 in all:\n%s%s", method, n, line, rest)
		}
		if !strings.Contains(string(rest), "HTTP/1.1 201 ") {
			t.Errorf("%s: got %q, want a 201 after the 100 Continue", method, rest)
		}
	}
}

// TestSecretsRedacted: a password in a URL flag never appears in the
// message that rejects it, for every flag that takes a URL, whether the
// URL parses or not.
func TestSecretsRedacted(t *testing.T) {
	t.Parallel()
	const pw = "s3cr3tPW"
	up := newUpstream(t)
	for _, tc := range []struct {
		name string
		args []string
	}{
		{"redis bad port", []string{"proxy", "--upstream", up.url(), "--redis", "redis://:" + pw + "@localhost:63x79"}},
		{"redis user bad port", []string{"proxy", "--upstream", up.url(), "--redis", "redis://admin:" + pw + "@localhost:63x79/0"}},
		{"redis no scheme", []string{"proxy", "--upstream", up.url(), "--redis", "admin:" + pw + "@localhost:6379"}},
		{"redis bad scheme", []string{"proxy", "--upstream", up.url(), "--redis", "http://:" + pw + "@localhost:6379"}},
		{"redis-cluster bad port", []string{"proxy", "--upstream", up.url(), "--redis-cluster", "redis://:" + pw + "@localhost:63x79?addr=localhost:7001"}},
		{"upstream bad host", []string{"proxy", "--upstream", "http://user:" + pw + "@bad host:9000"}},
		{"upstream bad scheme", []string{"proxy", "--upstream", "ftp://user:" + pw + "@localhost:9000"}},
		{"upstream no scheme", []string{"proxy", "--upstream", "user:" + pw + "@localhost:9000"}},
		{"otel-endpoint bad port", []string{"proxy", "--upstream", up.url(), "--otel-endpoint", "http://user:" + pw + "@collector:43x18"}},
		{"otel-endpoint no scheme", []string{"proxy", "--upstream", up.url(), "--otel-endpoint", "user:" + pw + "@collector:4318"}},
		{"doctor redis", []string{"doctor", "--redis", "redis://:" + pw + "@localhost:63x79"}},
		{"get redis", []string{"get", "k", "--redis", "redis://:" + pw + "@localhost:63x79"}},
		{"ls redis-cluster", []string{"ls", "--redis-cluster", "redis://u:" + pw + "@localhost:63x79"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var out, errOut strings.Builder
			code := run(t.Context(), tc.args, &out, &errOut, noEnv)
			if code == 0 {
				t.Fatalf("exit 0, want an error")
			}
			if all := out.String() + errOut.String(); strings.Contains(all, pw) || !strings.Contains(all, "xxxxx") {
				t.Errorf("got %q, want the password hidden as xxxxx", all)
			}
		})
	}
}

// TestProxyScopeHeaderRequired: with --scope-header, requests without the
// header do not share one scope (where anonymous clients got each other's
// responses): 400, unless --allow-missing-scope.
func TestProxyScopeHeaderRequired(t *testing.T) {
	t.Parallel()
	up := newUpstream(t)
	px := startProxy(t, up.url(), []string{"--data", t.TempDir()}, "--scope-header", "Authorization")
	for range 2 {
		res := post(t, px.url("/orders"), "anon", "x")
		if res.status != 400 || !strings.Contains(res.body, "principal-missing") {
			t.Errorf("without Authorization: got %d %q, want 400 TypePrincipalMissing", res.status, res.body)
		}
	}
	if res := post(t, px.url("/orders"), "anon", "x", "Authorization", "Bearer a"); res.status != 201 || up.executions("anon") != 1 {
		t.Errorf("with Authorization: got %d after %d executions, want 201 after 1", res.status, up.executions("anon"))
	}
	if res := send(t, http.MethodGet, px.url("/orders"), "", ""); res.status != 201 {
		t.Errorf("GET (not covered) without Authorization: got %d, want it passed through", res.status)
	}

	up2 := newUpstream(t)
	open := startProxy(t, up2.url(), []string{"--data", t.TempDir()}, "--scope-header", "Authorization", "--allow-missing-scope")
	first, second := post(t, open.url("/orders"), "anon", "x"), post(t, open.url("/orders"), "anon", "x")
	if first.status != 201 || !second.replayed() || up2.executions("anon") != 1 {
		t.Errorf("--allow-missing-scope: got %d then replayed=%v after %d executions, want one shared execution", first.status, second.replayed(), up2.executions("anon"))
	}
}

// TestProxyStorePolicy: --store-policy chooses which upstream answers are
// stored.
func TestProxyStorePolicy(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		policy             string
		rerun500, rerun402 bool
	}{
		{"default", false, false},
		{"release-5xx", true, false},
		{"only-2xx", true, true},
	} {
		t.Run(tc.policy, func(t *testing.T) {
			t.Parallel()
			up := newUpstream(t)
			px := startProxy(t, up.url(), []string{"--data", t.TempDir()}, "--store-policy", tc.policy)
			for _, s := range []struct {
				status string
				rerun  bool
			}{{"500", tc.rerun500}, {"402", tc.rerun402}, {"201", false}} {
				key := tc.policy + "-" + s.status
				first := post(t, px.url("/orders"), key, "x", "X-Test-Status", s.status)
				retry := post(t, px.url("/orders"), key, "x")
				want := 1
				if s.rerun {
					want = 2
				}
				if first.status != atoi(s.status) || up.executions(key) != want || retry.replayed() == s.rerun {
					t.Errorf("%s: got %d, then %d replayed=%v after %d executions, want %d executions", s.status, first.status, retry.status, retry.replayed(), up.executions(key), want)
				}
			}
		})
	}
	code, _, stderr := runIdem(t, "proxy", "--upstream", "http://127.0.0.1:1", "--store-policy", "sometimes")
	if code != exitUsage || !strings.Contains(stderr, "invalid --store-policy") {
		t.Errorf("bad policy: got %d %q, want a usage error", code, stderr)
	}
}

func atoi(s string) int {
	n, _ := strconv.Atoi(s)
	return n
}

// TestMaxResponseLowered: --max-response limits what is stored, never what
// is read: a response stored under a larger limit is still replayed after
// the proxy restarts with a smaller one, and idem get decodes it without
// being told the limit.
func TestMaxResponseLowered(t *testing.T) {
	t.Parallel()
	up := newUpstream(t)
	data := []string{"--data", t.TempDir()}
	body := strings.Repeat("a", 2<<20) // 2 MiB, stored compressed
	px := startProxy(t, up.url(), data, "--max-body", "4MiB", "--max-response", "4MiB")
	if res := post(t, px.url("/big"), "big", body); res.status != 201 {
		t.Fatalf("first: got %d", res.status)
	}
	px.terminate()
	px.wait()
	code, out, stderr := runIdem(t, append([]string{"get", "big", "--path", "/big", "--show-body"}, data...)...)
	if code != 0 || !strings.Contains(out, "status      201") || !strings.Contains(out, "execution 1 of big: aaaa") {
		t.Errorf("get: got %d %q %q, want the stored 201 and its body", code, out[:min(len(out), 400)], stderr)
	}
	px = startProxy(t, up.url(), data, "--max-body", "4MiB", "--max-response", "1KiB")
	res := post(t, px.url("/big"), "big", body)
	if res.status != 201 || !res.replayed() || len(res.body) != len("execution 1 of big: ")+len(body) || up.executions("big") != 1 {
		t.Errorf("retry after lowering --max-response: got %d replayed=%v, %d bytes after %d executions, want the stored response",
			res.status, res.replayed(), len(res.body), up.executions("big"))
	}
}

// gzipUpstream answers with a gzip-encoded body when the request accepts
// gzip, and plain text otherwise.
type gzipUpstream struct{ calls atomic.Int64 }

func (u *gzipUpstream) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	io.Copy(io.Discard, r.Body)
	n := u.calls.Add(1)
	msg := fmt.Sprintf("created order %d", n)
	w.Header().Set("Content-Type", "text/plain")
	w.Header().Set("Vary", "Accept-Encoding")
	if strings.Contains(r.Header.Get("Accept-Encoding"), "gzip") {
		w.Header().Set("Content-Encoding", "gzip")
		w.WriteHeader(http.StatusCreated)
		zw := gzip.NewWriter(w)
		io.WriteString(zw, msg)
		zw.Close()
		return
	}
	w.WriteHeader(http.StatusCreated)
	io.WriteString(w, msg)
}

// TestProxyGzipReplay: a response to a client that accepted gzip is
// replayed in a form that a retry without Accept-Encoding: gzip can read.
func TestProxyGzipReplay(t *testing.T) {
	t.Parallel()
	gu := &gzipUpstream{}
	srv := httptest.NewServer(gu)
	t.Cleanup(srv.Close)
	px := startProxy(t, srv.URL, []string{"--data", t.TempDir()})
	// The header is set explicitly, so the client's transport does not
	// decode: the bytes on the wire are seen.
	decode := func(res response) string {
		if res.header.Get("Content-Encoding") != "gzip" {
			return res.body
		}
		zr, err := gzip.NewReader(strings.NewReader(res.body))
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(zr)
		return string(b)
	}
	first := post(t, px.url("/orders"), "gz", "x", "Accept-Encoding", "gzip")
	if first.status != 201 || decode(first) != "created order 1" {
		t.Fatalf("first: got %d %q", first.status, decode(first))
	}
	retry := post(t, px.url("/orders"), "gz", "x", "Accept-Encoding", "identity")
	if !retry.replayed() || retry.header.Get("Content-Encoding") != "" || retry.body != "created order 1" {
		t.Errorf("retry accepting identity only: got %d replayed=%v Content-Encoding %q body %q, want the plain replay",
			retry.status, retry.replayed(), retry.header.Get("Content-Encoding"), retry.body)
	}
	if gu.calls.Load() != 1 {
		t.Errorf("upstream calls: got %d, want 1", gu.calls.Load())
	}
}

// stalledUpload opens a connection to addr and sends a covered request
// whose header announces size bytes of body, and sent bytes of it.
//
// A write error is not the test's failure: the proxy may answer before the
// body is in (503 when the bodies' memory is full) and close the
// connection, which the kernel then resets, as it holds bytes the proxy
// did not read. The caller that reads the answer gets it still.
func stalledUpload(t *testing.T, addr, key string, size, sent int) net.Conn {
	t.Helper()
	conn, err := net.DialTimeout("tcp", addr, 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	fmt.Fprintf(conn, "POST /up HTTP/1.1\r\nHost: x\r\nIdempotency-Key: %s\r\nContent-Length: %d\r\n\r\n", key, size)
	conn.Write(make([]byte, sent)) // see above for an error
	return conn
}

// uploadRaw sends a POST of body with key and Connection: close to addr on
// a connection of its own, writing the body from another goroutine, and
// reads the answer whatever became of the write, then how the connection
// ends: closed is nil when the proxy closed it cleanly (FIN: the client
// reads the end of the stream), and "connection reset by peer" when it
// closed it with bytes it did not read (RST), which can destroy the answer
// before the client reads it.
func uploadRaw(t *testing.T, addr, key string, body io.Reader, size int) (res response, closed error) {
	t.Helper()
	conn, err := net.DialTimeout("tcp", addr, 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	conn.SetDeadline(time.Now().Add(30 * time.Second))
	fmt.Fprintf(conn, "POST /up HTTP/1.1\r\nHost: x\r\nIdempotency-Key: %s\r\nContent-Length: %d\r\nConnection: close\r\n\r\n", key, size)
	wrote := make(chan struct{})
	go func() {
		defer close(wrote)
		io.Copy(conn, body) // see above for an error
	}()
	defer func() { <-wrote }() // the write ends at the latest when conn is closed
	br := bufio.NewReader(conn)
	r, err := http.ReadResponse(br, nil)
	if err != nil {
		t.Errorf("POST %s: %v", key, err)
		return response{}, err
	}
	b, err := io.ReadAll(r.Body)
	if err != nil {
		t.Errorf("POST %s: reading the body: %v", key, err)
	}
	if _, err := br.ReadByte(); err != io.EOF {
		closed = fmt.Errorf("after the answer: got %v, want the end of the stream", err)
	}
	return response{status: r.StatusCode, header: r.Header, body: string(b)}, closed
}

// TestProxySlowUploads: --body-timeout ends a body that does not arrive
// (408, the upstream never called); the deadline ends with the body, so a
// slow upstream is not cut off; --max-body-memory refuses a large body
// while stalled uploads hold the memory, and still serves small requests;
// --max-concurrent answers 503 beyond its bound. The large body is sent by
// uploadRaw, which reads the 503 however late the client is with the end
// of the body.
func TestProxySlowUploads(t *testing.T) {
	t.Parallel()
	up := newUpstream(t)
	px := startProxy(t, up.url(), []string{"--data", t.TempDir()},
		"--body-timeout", "500ms", "--max-body-memory", "64KiB")

	conn := stalledUpload(t, px.addr, "stalled", 100, 10)
	conn.SetReadDeadline(time.Now().Add(10 * time.Second))
	res, err := http.ReadResponse(bufio.NewReader(conn), nil)
	if err != nil {
		t.Fatalf("stalled upload: %v, want a 408", err)
	}
	body, _ := io.ReadAll(res.Body)
	if res.StatusCode != 408 || !strings.Contains(string(body), "body-timeout") || up.executions("stalled") != 0 {
		t.Errorf("stalled upload: got %d %q after %d executions, want 408 TypeBodyTimeout and none", res.StatusCode, body, up.executions("stalled"))
	}

	// The upstream takes longer than --body-timeout once the body is in:
	// covered and passed through.
	if res := post(t, px.url("/slow"), "slow-upstream", "x", "X-Test-Sleep", "1200ms"); res.status != 201 {
		t.Errorf("covered, slow upstream: got %d %q, want 201", res.status, res.body)
	}
	if res := send(t, http.MethodPut, px.url("/slow"), "", "x", "X-Test-Sleep", "1200ms"); res.status != 201 {
		t.Errorf("passed through, slow upstream: got %d %q, want 201", res.status, res.body)
	}

	// Memory: a stalled upload holds 48 KiB over the allowance; another
	// 40 KiB body does not fit, a small one does. The two race for the
	// memory (the stalled bytes may not be read yet when the large body
	// comes): repeat with new keys until the large body came second. The
	// stalled uploads hold their memory until the test ends (a
	// --body-timeout the test never reaches, whatever the load).
	px = startProxy(t, up.url(), []string{"--data", t.TempDir()},
		"--body-timeout", "1m", "--max-body-memory", "64KiB")
	for i := 0; ; i++ {
		stalledUpload(t, px.addr, fmt.Sprintf("holding-%d", i), 1<<20, 48<<10)
		res, closed := uploadRaw(t, px.addr, fmt.Sprintf("big-%d", i), strings.NewReader(strings.Repeat("x", 40<<10)), 40<<10)
		if res.status == 503 {
			if !strings.Contains(res.body, "server-busy") || res.header.Get("Retry-After") != "1" {
				t.Errorf("big body: got %d %q Retry-After %q, want 503 TypeServerBusy, Retry-After 1", res.status, res.body, res.header.Get("Retry-After"))
			}
			// The proxy read the rest of the body it refused: a reset would
			// race the answer to the client.
			if closed != nil {
				t.Errorf("big body: the connection after the 503: %v", closed)
			}
			break
		}
		if i == 50 {
			t.Fatalf("big body while the memory is held: got %d, want 503", res.status)
		}
	}
	if res := post(t, px.url("/up"), "small", "hello"); res.status != 201 {
		t.Errorf("small body while the memory is held: got %d, want 201", res.status)
	}

	// Concurrency: 4 requests in the upstream, a fifth gets 503.
	up = newUpstream(t)
	px = startProxy(t, up.url(), []string{"--data", t.TempDir()}, "--max-concurrent", "4")
	done := make(chan int, 4)
	for i := range 4 {
		go func() { done <- post(t, px.url("/c"), fmt.Sprintf("c%d", i), "x", "X-Test-Sleep", "2s").status }()
	}
	for range 4 {
		select {
		case <-up.started:
		case <-time.After(10 * time.Second):
			t.Fatal("the upstream did not get 4 requests")
		}
	}
	res5 := post(t, px.url("/c"), "c-extra", "x")
	if res5.status != 503 || !strings.Contains(res5.body, "server-busy") || up.executions("c-extra") != 0 {
		t.Errorf("over --max-concurrent: got %d %q, want 503 TypeServerBusy", res5.status, res5.body)
	}
	for range 4 {
		if s := <-done; s != 201 {
			t.Errorf("concurrent request: got %d, want 201", s)
		}
	}
	if n := px.metric("idem_busy_requests_total"); n < 1 {
		t.Errorf("idem_busy_requests_total: got %v, want at least 1", n)
	}
}

// TestProxyErrorBody: --error-body stripe gives Stripe's SDKs an error
// they read as one (and Stripe-Should-Retry); a template gives any shape;
// the proxy's own errors (upstream unreachable) take the shape too.
func TestProxyErrorBody(t *testing.T) {
	t.Parallel()
	up := newUpstream(t)
	// --wait 0: the preset's own wait (TestProxyStripeSDK) would replay.
	stripe := startProxy(t, up.url(), []string{"--data", t.TempDir()}, "--error-body", "stripe", "--wait", "0s")
	done := make(chan struct{})
	go func() { post(t, stripe.url("/v1/customers"), "cus", "x", "X-Test-Sleep", "1s"); close(done) }()
	if key := <-up.started; key != "cus" {
		t.Fatalf("upstream started %q", key)
	}
	res := post(t, stripe.url("/v1/customers"), "cus", "x")
	if res.status != 409 || res.header.Get("Content-Type") != "application/json" || res.header.Get("Stripe-Should-Retry") != "true" ||
		!strings.HasPrefix(res.body, `{"error":{"type":"idempotency_error","code":"in_progress","message":`) {
		t.Errorf("409: got %d %q Stripe-Should-Retry %q %s", res.status, res.header.Get("Content-Type"), res.header.Get("Stripe-Should-Retry"), res.body)
	}
	<-done
	res = post(t, stripe.url("/v1/customers"), "cus", "other")
	if res.status != 400 || res.header.Get("Stripe-Should-Retry") != "false" || !strings.Contains(res.body, `{"error":{"type":"idempotency_error","code":"key_mismatch"`) {
		t.Errorf("key reused: got %d Stripe-Should-Retry %q %s, want 400 idempotency_error, as Stripe answers", res.status, res.header.Get("Stripe-Should-Retry"), res.body)
	}

	tmpl := filepath.Join(t.TempDir(), "error.json")
	os.WriteFile(tmpl, []byte(`{"message":"{{detail}}","status":"{{status}}","kind":"{{code}}"}`), 0o600)
	closed := "http://" + freeAddr(t)
	custom := startProxy(t, closed, []string{"--data", t.TempDir()}, "--error-body", "@"+tmpl, "--check-upstream=false")
	res = post(t, custom.url("/orders"), "", "x")
	if res.status != 400 || !strings.HasPrefix(res.body, `{"kind":"key_missing","message":"`) || !strings.HasSuffix(res.body, `","status":400}`) {
		t.Errorf("400 with a template: got %d %s", res.status, res.body)
	}
	res = post(t, custom.url("/orders"), "k", "x")
	if res.status != 502 || !strings.Contains(res.body, `"kind":"bad_gateway"`) {
		t.Errorf("upstream down with a template: got %d %s", res.status, res.body)
	}
	for _, bad := range []string{"xml", "{not json", "@" + filepath.Join(t.TempDir(), "missing.json")} {
		code, _, stderr := runIdem(t, "proxy", "--upstream", closed, "--check-upstream=false", "--error-body", bad)
		if code != exitUsage || !strings.Contains(stderr, "--error-body") {
			t.Errorf("--error-body %q: got %d %q, want a usage error", bad, code, stderr)
		}
	}
}

// TestProxyResponseTrailers: an upstream's trailers, announced or not,
// reach the client as trailers and never in the header, with the
// response's own fields intact, on the first response and on its replay
// (which, before trailers were stored, came with Content-Length and none).
func TestProxyResponseTrailers(t *testing.T) {
	t.Parallel()
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.Copy(io.Discard, r.Body)
		w.Header().Set("Trailer", "X-Checksum")
		w.Header().Set("Content-Type", "text/plain")
		w.WriteHeader(http.StatusCreated)
		io.WriteString(w, "body")
		w.Header().Set("X-Checksum", "abc")
		w.Header().Set(http.TrailerPrefix+"X-Late", "late")
	}))
	t.Cleanup(up.Close)
	px := startProxy(t, up.URL, []string{"--data", t.TempDir()})
	for _, what := range []string{"first", "replay"} {
		req, err := http.NewRequest(http.MethodPost, px.url("/orders"), strings.NewReader("x"))
		if err != nil {
			t.Fatal(err)
		}
		req.Header.Set("Idempotency-Key", "trailers")
		res, err := client.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		body, err := io.ReadAll(res.Body)
		res.Body.Close()
		if err != nil {
			t.Fatal(err)
		}
		if res.StatusCode != 201 || string(body) != "body" || res.Header.Get("Content-Type") != "text/plain" {
			t.Errorf("%s: got %d %q, Content-Type %q, want 201 \"body\" text/plain", what, res.StatusCode, body, res.Header.Get("Content-Type"))
		}
		if replayed := res.Header.Get("Idempotent-Replayed") == "true"; replayed != (what == "replay") {
			t.Errorf("%s: Idempotent-Replayed %v", what, replayed)
		}
		if v := res.Header.Get("X-Checksum"); v != "" {
			t.Errorf("%s: the trailer X-Checksum came in the header too: %q", what, v)
		}
		if v := res.Header.Get("X-Late"); v != "" {
			t.Errorf("%s: the unannounced trailer X-Late came in the header: %q", what, v)
		}
		if got := res.Trailer.Get("X-Checksum"); got != "abc" {
			t.Errorf("%s: trailer X-Checksum: got %q, want abc (trailers %v, Content-Length %d)", what, got, res.Trailer, res.ContentLength)
		}
		if got := res.Trailer.Get("X-Late"); got != "late" {
			t.Errorf("%s: trailer X-Late: got %q, want late (trailers %v)", what, got, res.Trailer)
		}
	}
}

// TestProxyKeepsUpstreamFields: the client gets the upstream's fields
// exactly. A gzip body without Content-Type, which the proxy's transport
// decodes, came with a Content-Type: text/plain that net/http sniffed;
// and an upstream's own Idempotent-Replayed: true passed through on a
// first response, which a client takes for a replay. Covered requests,
// first and replayed, and passed-through ones (whose body of declared
// length net/http sniffed too).
func TestProxyKeepsUpstreamFields(t *testing.T) {
	t.Parallel()
	var gz bytes.Buffer
	zw := gzip.NewWriter(&gz)
	io.WriteString(zw, "plain words, no type")
	zw.Close()
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.Copy(io.Discard, r.Body)
		h := w.Header()
		h.Set("Idempotent-Replayed", "true") // the upstream's own
		if r.Method == http.MethodPost && strings.Contains(r.Header.Get("Accept-Encoding"), "gzip") {
			h.Set("Content-Encoding", "gzip")
			w.WriteHeader(http.StatusCreated)
			w.Write(gz.Bytes())
			return
		}
		h["Content-Type"] = nil // plain, without a type
		h.Set("Content-Length", "20")
		w.WriteHeader(http.StatusCreated)
		io.WriteString(w, "plain words, no type")
	}))
	t.Cleanup(up.Close)
	px := startProxy(t, up.URL, []string{"--data", t.TempDir()})
	// Without an Accept-Encoding of the client's, the proxy's transport
	// asks for gzip and decodes the body for passed-through requests too.
	plain := &http.Client{Timeout: 30 * time.Second, Transport: &http.Transport{DisableCompression: true, DisableKeepAlives: true}}
	for _, tc := range []struct {
		what, method string
		replayed     string // the Idempotent-Replayed wanted
	}{
		{"first", http.MethodPost, ""},
		{"replay", http.MethodPost, "true"},
		{"passed through", http.MethodGet, "true"}, // not covered: the upstream's field as it is
	} {
		req, _ := http.NewRequest(tc.method, px.url("/orders"), strings.NewReader("x"))
		req.Header.Set("Idempotency-Key", "fields")
		res, err := plain.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		body, err := io.ReadAll(res.Body)
		res.Body.Close()
		if err != nil || res.StatusCode != 201 || string(body) != "plain words, no type" {
			t.Fatalf("%s: got %d %q, %v", tc.what, res.StatusCode, body, err)
		}
		if v, ok := res.Header["Content-Type"]; ok {
			t.Errorf("%s: Content-Type %q, want none, as the upstream sent", tc.what, v)
		}
		if got := res.Header.Get("Idempotent-Replayed"); got != tc.replayed {
			t.Errorf("%s: Idempotent-Replayed %q, want %q", tc.what, got, tc.replayed)
		}
	}
}

// TestProxyProblemTypeBase: problem types are urn:idem:problem: names by
// default (documented in docs/problems.md; they linked to pkg.go.dev pages
// of an unpublished module); --problem-type-base puts them, the proxy's
// own included, under the operator's base; a base that is not an absolute
// URI is a usage error.
func TestProxyProblemTypeBase(t *testing.T) {
	t.Parallel()
	closed := "http://" + freeAddr(t)
	def := startProxy(t, closed, []string{"--data", t.TempDir()}, "--check-upstream=false")
	if res := post(t, def.url("/orders"), "", "x"); res.status != 400 || !strings.Contains(res.body, `"type":"urn:idem:problem:key-missing"`) {
		t.Errorf("default: got %d %s, want 400 of type urn:idem:problem:key-missing", res.status, res.body)
	}
	own := startProxy(t, closed, []string{"--data", t.TempDir()}, "--check-upstream=false", "--problem-type-base", "https://docs.example.com/errors#")
	if res := post(t, own.url("/orders"), "", "x"); res.status != 400 || !strings.Contains(res.body, `"type":"https://docs.example.com/errors#key-missing"`) {
		t.Errorf("own base: got %d %s, want 400 of type https://docs.example.com/errors#key-missing", res.status, res.body)
	}
	for _, bad := range []string{"errors#", ""} {
		code, _, stderr := runIdem(t, "proxy", "--upstream", closed, "--check-upstream=false", "--problem-type-base", bad)
		if code != exitUsage || !strings.Contains(stderr, "--problem-type-base") {
			t.Errorf("--problem-type-base %q: got %d %q, want a usage error", bad, code, stderr)
		}
	}
}
