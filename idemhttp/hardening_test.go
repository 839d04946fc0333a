package idemhttp_test

import (
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/idemgo/idem"
	"github.com/idemgo/idem/idemhttp"
	"github.com/idemgo/idem/memstore"
)

func newMemExecutor(t *testing.T, opts ...idem.Option) *idem.Executor {
	t.Helper()
	s, err := memstore.New()
	if err != nil {
		t.Fatal(err)
	}
	return newExecutor(t, s, opts...)
}

// TestMethodCase: "post" is POST. Go's server accepts a method in any case;
// a case-sensitive check let "post" with the same key run twice.
func TestMethodCase(t *testing.T) {
	t.Parallel()
	var c counter
	var seen []string
	h := newMiddleware(t, newMemExecutor(t)).Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		seen = append(seen, r.Method)
		c.ServeHTTP(w, r)
	}))
	first := serve(h, request("post", "/payments", "k", "b"))
	second := serve(h, request("post", "/payments", "k", "b"))
	third := serve(h, request("POST", "/payments", "k", "b"))
	if first.status != 201 || !second.replayed() || !third.replayed() || c.n.Load() != 1 {
		t.Errorf("got %d, replayed %v, %v after %d executions, want one execution replayed twice",
			first.status, second.replayed(), third.replayed(), c.n.Load())
	}
	if len(seen) != 1 || seen[0] != "POST" {
		t.Errorf("handler saw methods %q, want [POST]", seen)
	}
	if res := serve(h, request("pAtCh", "/payments", "", "b")); res.status != 400 {
		t.Errorf("pAtCh without a key: got %d, want 400", res.status)
	}
}

// TestIgnoredKey: a key on a method that is not covered is not ignored
// silently: the response says so.
func TestIgnoredKey(t *testing.T) {
	t.Parallel()
	var c counter
	h := newMiddleware(t, newMemExecutor(t)).Handler(&c)
	for _, method := range []string{"PUT", "GET", "DELETE"} {
		res := serve(h, request(method, "/payments", "k", "b"))
		if res.status != 201 || res.header.Get(idemhttp.IgnoredHeader) != "true" {
			t.Errorf("%s with a key: got %d, %s %q, want 201 with %[3]s: true", method, res.status, idemhttp.IgnoredHeader, res.header.Get(idemhttp.IgnoredHeader))
		}
		if res := serve(h, request(method, "/payments", "", "b")); res.header.Get(idemhttp.IgnoredHeader) != "" {
			t.Errorf("%s without a key: got %s %q, want none", method, idemhttp.IgnoredHeader, res.header.Get(idemhttp.IgnoredHeader))
		}
	}
	if res := post(h, "k", "b"); res.header.Get(idemhttp.IgnoredHeader) != "" {
		t.Errorf("covered POST: got %s %q, want none", idemhttp.IgnoredHeader, res.header.Get(idemhttp.IgnoredHeader))
	}
}

func (r response) replayed() bool { return r.header.Get(idemhttp.ReplayedHeader) == "true" }

// TestEmptyPrincipal: with WithPrincipal, requests without a principal do
// not share one scope (where one anonymous client would get another's
// response): 400, unless WithEmptyPrincipal(true) says so.
func TestEmptyPrincipal(t *testing.T) {
	t.Parallel()
	user := idemhttp.WithPrincipal(func(r *http.Request) string { return r.Header.Get("X-User") })
	var c counter
	h := newMiddleware(t, newMemExecutor(t), user).Handler(&c)
	for range 2 {
		checkProblem(t, post(h, "anon", "b"), 400, idemhttp.TypePrincipalMissing)
	}
	r := request("POST", "/payments", "anon", "b")
	r.Header.Set("X-User", "alice")
	if res := serve(h, r); res.status != 201 || c.n.Load() != 1 {
		t.Errorf("with a principal: got %d after %d executions, want 201 after 1", res.status, c.n.Load())
	}
	// A missing key is reported first: it is the client's first fix.
	checkProblem(t, post(h, "", "b"), 400, idemhttp.TypeKeyMissing)

	var c2 counter
	h2 := newMiddleware(t, newMemExecutor(t), user, idemhttp.WithEmptyPrincipal(true)).Handler(&c2)
	first, second := post(h2, "anon", "b"), post(h2, "anon", "b")
	if first.status != 201 || !second.replayed() || c2.n.Load() != 1 {
		t.Errorf("WithEmptyPrincipal(true): got %d then replayed=%v after %d executions, want one shared execution", first.status, second.replayed(), c2.n.Load())
	}
}

// TestMaxBufferedBodies: bodies held in memory are bounded; a stalled
// upload holds what it sent, not what it announced; a body over the bound
// gets 503 while small requests are still served.
func TestMaxBufferedBodies(t *testing.T) {
	t.Parallel()
	var c counter
	h := newMiddleware(t, newMemExecutor(t), idemhttp.WithMaxBufferedBodies(64<<10)).Handler(&c)
	// A stalled upload: 48 KiB of an announced 1 MiB arrived.
	pr, pw := io.Pipe()
	slow := request("POST", "/up", "slow", "")
	slow.Body, slow.ContentLength = pr, 1<<20
	done := make(chan response, 1)
	go func() { done <- serve(h, slow) }()
	if _, err := pw.Write(make([]byte, 48<<10)); err != nil { // returns once the middleware read it all
		t.Fatal(err)
	}
	big := strings.Repeat("x", 40<<10)
	res := serve(h, request("POST", "/up", "big", big))
	checkProblem(t, res, 503, idemhttp.TypeServerBusy)
	checkRetryAfter(t, res, 1, 1)
	if res := post(h, "small", "hello"); res.status != 201 {
		t.Errorf("small request while the bodies' memory is used up: got %d, want 201", res.status)
	}
	pw.Close()
	if res := <-done; res.status != 201 {
		t.Errorf("stalled upload, once ended: got %d, want 201", res.status)
	}
	// Its memory was given back.
	if res := serve(h, request("POST", "/up", "big", big)); res.status != 201 {
		t.Errorf("large request after the upload ended: got %d, want 201", res.status)
	}
	if n := c.n.Load(); n != 3 {
		t.Errorf("executions: got %d, want 3", n)
	}
}

// TestBodyTimeout: a body that does not arrive before the connection's
// read deadline gets 408 (not 400), and the handler does not run.
func TestBodyTimeout(t *testing.T) {
	t.Parallel()
	var c counter
	srv := httptest.NewUnstartedServer(newMiddleware(t, newMemExecutor(t)).Handler(&c))
	srv.Config.ReadTimeout = 300 * time.Millisecond
	srv.Start()
	t.Cleanup(srv.Close)
	pr, pw := io.Pipe()
	defer pw.Close()
	req, err := http.NewRequest("POST", srv.URL+"/up", pr)
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Idempotency-Key", "slow")
	req.ContentLength = 100
	go pw.Write([]byte("only part of it"))
	res, err := srv.Client().Do(req)
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(res.Body)
	res.Body.Close()
	checkProblem(t, response{status: res.StatusCode, header: res.Header, body: string(b)}, 408, idemhttp.TypeBodyTimeout)
	if c.n.Load() != 0 {
		t.Errorf("executions: got %d, want 0", c.n.Load())
	}
}
