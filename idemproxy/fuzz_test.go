package idemproxy

import (
	"bytes"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idemgo/idem"
	"github.com/idemgo/idem/idemhttp"
	"github.com/idemgo/idem/internal/httpsyntax"
	"github.com/idemgo/idem/memstore"
)

// Limits of the proxy under fuzz, small so that the fuzzer reaches them.
const (
	fuzzMaxBody     = 64
	fuzzMaxResponse = 512
)

// fuzzUpstream is the API behind the fuzzed proxy: every call is a new
// execution, numbered, and its answer names the execution, the principal
// it saw and the body, so that a response can be traced to the request
// that made it. A query containing "big" makes the answer larger than the
// proxy stores.
type fuzzUpstream struct {
	execs atomic.Int64
	mu    sync.Mutex
	calls map[string]int // by X-Fuzz-Iter
}

func (u *fuzzUpstream) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	body, _ := io.ReadAll(r.Body)
	n := u.execs.Add(1)
	u.mu.Lock()
	u.calls[r.Header.Get("X-Fuzz-Iter")]++
	u.mu.Unlock()
	w.Header().Set("Content-Type", "application/octet-stream")
	w.Header().Set("X-Exec", strconv.FormatInt(n, 10))
	w.WriteHeader(http.StatusCreated)
	fmt.Fprintf(w, "exec=%d principal=%q body=%q\n", n, r.Header.Get("X-Scope"), body)
	if strings.Contains(r.URL.RawQuery, "big") {
		w.Write(bytes.Repeat([]byte("x"), fuzzMaxResponse+1))
	}
}

func (u *fuzzUpstream) callsOf(iter string) int {
	u.mu.Lock()
	defer u.mu.Unlock()
	return u.calls[iter]
}

// newFuzzProxy returns a proxy configured as `idem proxy` configures one
// (an Executor that reads stored responses whatever their size), on a
// fresh in-memory store, with the scope header X-Scope.
func newFuzzProxy(t testing.TB, target *url.URL, transport http.RoundTripper) *Proxy {
	store, err := memstore.New()
	if err != nil {
		t.Fatal(err)
	}
	exec, err := idem.New(store, idem.WithLease(10*time.Second), idem.WithRetention(time.Hour), idem.WithMaxResultSize(1<<30+1<<20))
	if err != nil {
		t.Fatal(err)
	}
	p := &Proxy{
		Target: target, Executor: exec, Transport: transport,
		MaxBodySize: fuzzMaxBody, MaxResponseSize: fuzzMaxResponse,
		ScopeHeader: "X-Scope",
		Logger:      slog.New(slog.DiscardHandler),
	}
	if err := p.Init(); err != nil {
		t.Fatal(err)
	}
	return p
}

// fieldValue reports whether a server could deliver s as a header field
// value, and returns it as the server would (without surrounding spaces).
func fieldValue(s string) (string, bool) {
	for i := 0; i < len(s); i++ {
		if c := s[i]; (c < 0x20 && c != '\t') || c == 0x7f {
			return "", false
		}
	}
	return strings.Trim(s, " \t"), true
}

// queryOK reports whether a server could deliver q as a raw query.
func queryOK(q string) bool {
	for i := 0; i < len(q); i++ {
		if c := q[i]; c <= 0x20 || c >= 0x7f || c == '#' {
			return false
		}
	}
	return true
}

type fuzzResponse struct {
	status int
	header http.Header
	body   []byte
}

var fuzzMethods = []string{http.MethodPost, http.MethodPatch, http.MethodPut, http.MethodGet, http.MethodDelete}

// FuzzProxyRequest fuzzes the proxy's request path in process: a Proxy
// as `idem proxy` configures one, scoped by the X-Scope
// header, in front of an upstream that numbers its executions. Method,
// path, query, Idempotency-Key value, scope value and bodies come from the
// fuzzer. It checks that the proxy never panics; never answers a 5xx other
// than 502, 503 or 504; answers an invalid key or a request without the
// scope header with 400 and an oversized body with 413 without calling the
// upstream; for a covered request, that
// the same request again gets the original response back (status, body,
// X-Exec) with Idempotent-Replayed: true, or 422 when the response was over
// the stored limit, without a second execution; that another body with the
// same key gets 422 (413 if over the limit); and that another principal
// with the same key runs on its own and never receives the first
// principal's response.
func FuzzProxyRequest(f *testing.F) {
	for _, s := range []struct {
		m                  uint8
		method, path, q    string
		key, scope, scope2 string
		body, body2        []byte
	}{
		{0, "", "/payments", "", "order-17", "Bearer a", "Bearer b", []byte(`{"amount":100}`), []byte(`{"amount":200}`)},
		{1, "", "/p/1", "x=1&y=2", `"quoted-key"`, "", "k", []byte(`{"a":1}`), []byte(`{ "a":1}`)},
		{0, "", "/", "big", "k", "a", "b", []byte("x"), []byte("y")},
		{0, "", "/a%2Fb/caf\xc3\xa9", "", "", "a", "b", nil, nil},
		{0, "", "/x", "", `"`, "a", "b", nil, nil},
		{0, "", "/x", "", `"a\"b\\c"`, "a", "b", nil, nil},
		{0, "", "/x", "", `"abc";p=1`, "a", "b", nil, nil},
		{0, "", "/x", "", "caf\xc3\xa9", "a", "b", nil, nil},
		{0, "", "/x", "", "\tkey ", "a", "b", nil, nil},
		{0, "", "/x", "", strings.Repeat("k", 255), "a", "b", nil, nil},
		{0, "", "/x", "", strings.Repeat("k", 256), "a", "b", nil, nil},
		{0, "", "/x", "", `"` + strings.Repeat("k", 255) + `"`, "a", "b", nil, nil},
		{0, "", "/x", "", "k", "Bearer \xff", "Bearer \xfe", bytes.Repeat([]byte("b"), fuzzMaxBody+1), []byte("small")},
		{2, "", "/x", "", "k", "a", "b", []byte("put"), nil},
		{5, "PROPFIND", "/dav", "", "k", "", "", []byte("x"), nil},
		{5, "post", "/x", "", "k", "", "", []byte("x"), nil},
		{0, "", "x\x00y", "a=%00", "k\x7f", "a\x00", "b", []byte("\x00"), []byte("\x00\x00")},
	} {
		f.Add(s.m, s.method, s.path, s.q, s.key, s.scope, s.scope2, s.body, s.body2)
	}
	up := &fuzzUpstream{calls: make(map[string]int)}
	srv := httptest.NewServer(up)
	f.Cleanup(srv.Close)
	target, _ := url.Parse(srv.URL)
	transport := newTransport(10*time.Second, false)
	f.Cleanup(transport.CloseIdleConnections)
	var iters atomic.Int64

	f.Fuzz(func(t *testing.T, m uint8, method, path, query, key, scope, scope2 string, body, body2 []byte) {
		if int(m) < len(fuzzMethods) {
			method = fuzzMethods[m]
		}
		if !httpsyntax.IsToken(method) || !queryOK(query) {
			return
		}
		if !strings.HasPrefix(path, "/") {
			path = "/" + path
		}
		key, ok1 := fieldValue(key)
		scope, ok2 := fieldValue(scope)
		scope2, ok3 := fieldValue(scope2)
		if !ok1 || !ok2 || !ok3 {
			return
		}
		iter := strconv.FormatInt(iters.Add(1), 10)
		gw := newFuzzProxy(t, target, transport)

		send := func(what, principal string, b []byte) fuzzResponse {
			t.Helper()
			r := &http.Request{
				Method: method, URL: &url.URL{Path: path, RawQuery: query}, Proto: "HTTP/1.1", ProtoMajor: 1, ProtoMinor: 1,
				Header: http.Header{"Idempotency-Key": {key}, "X-Fuzz-Iter": {iter}},
				Body:   io.NopCloser(bytes.NewReader(b)), ContentLength: int64(len(b)),
				Host: "proxy.test", RemoteAddr: "127.0.0.1:40000",
			}
			r.RequestURI = r.URL.RequestURI()
			if principal != "" {
				r.Header.Set("X-Scope", principal)
			}
			r = r.WithContext(t.Context())
			w := httptest.NewRecorder()
			func() {
				defer func() {
					if v := recover(); v != nil {
						t.Fatalf("%s: %s %q?%q key %q: the proxy panicked: %v", what, method, path, query, key, v)
					}
				}()
				gw.ServeHTTP(w, r)
			}()
			res := fuzzResponse{status: w.Code, header: w.Header(), body: w.Body.Bytes()}
			if res.status >= 500 && res.status != 502 && res.status != 503 && res.status != 504 {
				t.Fatalf("%s: %s %q?%q key %q: status %d, body %q", what, method, path, query, key, res.status, res.body)
			}
			return res
		}
		expectProblem := func(what string, res fuzzResponse, status int, typ string) {
			t.Helper()
			if res.status != status || !strings.HasPrefix(res.header.Get("Content-Type"), "application/problem+json") ||
				!bytes.Contains(res.body, []byte(typ)) {
				t.Fatalf("%s: %s %q key %q: got %d %q %q, want %d %s", what, method, path, key, res.status, res.header.Get("Content-Type"), res.body, status, typ)
			}
		}
		calls := func() int { return up.callsOf(iter) }

		r1 := send("first", scope, body)
		if !strings.EqualFold(method, http.MethodPost) && !strings.EqualFold(method, http.MethodPatch) {
			return // passed through, unprotected
		}
		if _, err := idemhttp.ParseKey(key); err != nil {
			expectProblem("invalid key", r1, 400, idemhttp.TypeKeyInvalid)
			if calls() != 0 {
				t.Fatalf("a request with the invalid key %q reached the upstream", key)
			}
			return
		}
		if scope == "" {
			expectProblem("no principal", r1, 400, idemhttp.TypePrincipalMissing)
			if calls() != 0 {
				t.Fatalf("a request without the scope header reached the upstream")
			}
			return
		}
		if len(body) > fuzzMaxBody {
			expectProblem("oversized body", r1, 413, idemhttp.TypeBodyTooLarge)
			if calls() != 0 {
				t.Fatalf("a request with a %d-byte body reached the upstream", len(body))
			}
			return
		}
		if r1.status != http.StatusCreated || r1.header.Get("Idempotent-Replayed") != "" || calls() != 1 {
			t.Fatalf("first request: status %d, replayed %q, %d upstream calls; want 201, not replayed, 1 call (body %q)",
				r1.status, r1.header.Get("Idempotent-Replayed"), calls(), r1.body)
		}
		tooBig := strings.Contains(query, "big")

		r2 := send("retry", scope, body)
		switch {
		case r2.status == 422 && bytes.Contains(r2.body, []byte(idemhttp.TypeKeyFailed)):
			if !tooBig && len(r1.body) <= fuzzMaxResponse/2 {
				t.Fatalf("retry: 422 key failed for a %d-byte response", len(r1.body))
			}
		case tooBig:
			t.Fatalf("retry after a response over the limit: got %d %q, want 422 %s", r2.status, r2.body, idemhttp.TypeKeyFailed)
		case r2.status != r1.status || !bytes.Equal(r2.body, r1.body) || r2.header.Get("X-Exec") != r1.header.Get("X-Exec") ||
			r2.header.Get("Idempotent-Replayed") != "true":
			t.Fatalf("retry: got %d %q X-Exec %s replayed %q, want the first response %d %q X-Exec %s replayed",
				r2.status, r2.body, r2.header.Get("X-Exec"), r2.header.Get("Idempotent-Replayed"), r1.status, r1.body, r1.header.Get("X-Exec"))
		}
		if calls() != 1 {
			t.Fatalf("after a retry: %d upstream calls, want 1", calls())
		}

		if !bytes.Equal(body2, body) {
			r3 := send("other body", scope, body2)
			if len(body2) > fuzzMaxBody {
				expectProblem("other, oversized body", r3, 413, idemhttp.TypeBodyTooLarge)
			} else if r3.status != 422 {
				t.Fatalf("same key, other body: got %d %q, want 422", r3.status, r3.body)
			}
			if calls() != 1 {
				t.Fatalf("after a mismatch: %d upstream calls, want 1", calls())
			}
		}

		if scope2 == "" {
			expectProblem("no principal", send("no principal", scope2, body), 400, idemhttp.TypePrincipalMissing)
		} else if scope2 != scope {
			r4 := send("other principal", scope2, body)
			if r4.status != http.StatusCreated || r4.header.Get("Idempotent-Replayed") != "" || calls() != 2 {
				t.Fatalf("other principal, same key: status %d replayed %q, %d upstream calls; want 201, not replayed, 2 calls",
					r4.status, r4.header.Get("Idempotent-Replayed"), calls())
			}
			if r4.header.Get("X-Exec") == r1.header.Get("X-Exec") || bytes.Equal(r4.body, r1.body) {
				t.Fatalf("principal %q got principal %q's response %q", scope2, scope, r1.body)
			}
		}
	})
}
