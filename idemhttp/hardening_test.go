package idemhttp_test

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idemgo/idem"
	"github.com/idemgo/idem/idemhttp"
	"github.com/idemgo/idem/idemhttp/httpkit"
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
// response): 400, unless httpkit.EmptyPrincipal(true) says so.
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
	h2 := newMiddleware(t, newMemExecutor(t), user, httpkit.EmptyPrincipal(true)).Handler(&c2)
	first, second := post(h2, "anon", "b"), post(h2, "anon", "b")
	if first.status != 201 || !second.replayed() || c2.n.Load() != 1 {
		t.Errorf("httpkit.EmptyPrincipal(true): got %d then replayed=%v after %d executions, want one shared execution", first.status, second.replayed(), c2.n.Load())
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

// TestRetryAfterEstimated: the Retry-After of a 409 comes from how long
// requests take, not from the whole lease left (30s for a request that
// takes milliseconds).
func TestRetryAfterEstimated(t *testing.T) {
	t.Parallel()
	b := newBlocking()
	var fast atomic.Bool
	h := newMiddleware(t, newMemExecutor(t, idem.WithLease(30*time.Second)),
		idemhttp.WithPrincipal(func(r *http.Request) string { return "p" })).Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if fast.Load() {
			b.counter.ServeHTTP(w, r)
			return
		}
		b.ServeHTTP(w, r)
	}))
	inFlight := func() (response, func()) {
		done := make(chan struct{})
		go func() { post(h, "slow", "b"); close(done) }()
		<-b.started
		return post(h, "slow", "b"), func() { b.release <- struct{}{}; <-done }
	}
	// Nothing finished yet: a second, not the lease left (30 s).
	res, finish := inFlight()
	checkProblem(t, res, 409, idemhttp.TypeInProgress)
	checkRetryAfter(t, res, 1, 1)
	finish()
	// Requests on this route take milliseconds: 1 s.
	fast.Store(true)
	for i := range 5 {
		post(h, fmt.Sprintf("fast-%d", i), "b")
	}
	fast.Store(false)
	b.release = make(chan struct{})
	r2 := request("POST", "/payments", "slow-2", "b")
	done := make(chan struct{})
	go func() { serve(h, r2); close(done) }()
	<-b.started
	res = post(h, "slow-2", "b")
	checkProblem(t, res, 409, idemhttp.TypeInProgress)
	checkRetryAfter(t, res, 1, 1)
	close(b.release)
	<-done
}

// TestErrorShapes: the Stripe preset and a JSON template give clients that
// read every JSON body as their API's objects an error they recognise, with
// the same statuses and Retry-After, and Stripe-Should-Retry hints.
func TestErrorShapes(t *testing.T) {
	t.Parallel()
	tmpl, err := idemhttp.TemplateErrorHandler([]byte(`{"err":{"kind":"{{code}}","status":"{{status}}","msg":"{{title}}: {{detail}}","retry":"{{retry}}","tags":["{{type}}",1]}}`))
	if err != nil {
		t.Fatal(err)
	}
	for _, bad := range []string{"", "{", `{"a":1} {}`, "nope"} {
		if _, err := idemhttp.TemplateErrorHandler([]byte(bad)); err == nil {
			t.Errorf("TemplateErrorHandler(%q): got no error", bad)
		}
	}
	for _, tc := range []struct {
		name    string
		handler idemhttp.ErrorHandler
		check   func(t *testing.T, status int, res response, retry bool)
	}{
		{"stripe", idemhttp.WriteStripeError, func(t *testing.T, status int, res response, retry bool) {
			var b struct {
				Error struct{ Type, Code, Message string }
			}
			if err := json.Unmarshal([]byte(res.body), &b); err != nil || b.Error.Code == "" || b.Error.Message == "" {
				t.Fatalf("%d: body %q, %v: want {\"error\":{...}}", status, res.body, err)
			}
			wantType := map[int]string{400: "invalid_request_error", 409: "idempotency_error", 422: "idempotency_error"}[status]
			if b.Error.Code == "key_mismatch" {
				wantType = "idempotency_error"
			}
			if b.Error.Type != wantType {
				t.Errorf("%d: error type %q, want %q", status, b.Error.Type, wantType)
			}
			if got := res.header.Get("Stripe-Should-Retry"); got != strconv.FormatBool(retry) {
				t.Errorf("%d: Stripe-Should-Retry %q, want %v", status, got, retry)
			}
		}},
		{"template", tmpl, func(t *testing.T, status int, res response, retry bool) {
			var b struct {
				Err struct {
					Kind, Msg string
					Status    int
					Retry     bool
					Tags      []any
				}
			}
			if err := json.Unmarshal([]byte(res.body), &b); err != nil || b.Err.Status != status || b.Err.Retry != retry || b.Err.Kind == "" ||
				!strings.Contains(b.Err.Msg, ": ") || len(b.Err.Tags) != 2 || !strings.HasPrefix(b.Err.Tags[0].(string), idemhttp.DefaultProblemTypeBase) {
				t.Errorf("%d: body %q, %v: want the template filled in", status, res.body, err)
			}
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			b := newBlocking()
			h := newMiddleware(t, newMemExecutor(t), idemhttp.WithErrorHandler(tc.handler)).Handler(b)
			check := func(res response, status int, retry bool) {
				t.Helper()
				if res.status != status || res.header.Get("Content-Type") != "application/json" {
					t.Fatalf("got %d %q, want %d application/json", res.status, res.header.Get("Content-Type"), status)
				}
				tc.check(t, status, res, retry)
			}
			check(post(h, "", "b"), 400, false)
			done := make(chan struct{})
			go func() { post(h, "k", "b"); close(done) }()
			<-b.started
			res := post(h, "k", "b")
			check(res, 409, true)
			if res.header.Get("Retry-After") == "" {
				t.Errorf("409: no Retry-After")
			}
			close(b.release)
			<-done
			// A key reused with another body: 400 in Stripe's shape, as
			// Stripe answers it (stripe-node makes an idempotency_error a
			// StripeIdempotencyError only for 400 and 404); 422 otherwise.
			mismatch := 422
			if tc.name == "stripe" {
				mismatch = 400
			}
			check(post(h, "k", "other body"), mismatch, false)
		})
	}
	if got := (&idemhttp.Problem{Type: idemhttp.TypeKeyMismatch}).Code(); got != "key_mismatch" {
		t.Errorf("Code of TypeKeyMismatch: got %q, want key_mismatch", got)
	}
	if got := (&idemhttp.Problem{Type: "about:blank", Status: 502}).Code(); got != "bad_gateway" {
		t.Errorf("Code of a 502: got %q, want bad_gateway", got)
	}
}

// TestHandlerReplayedField: a handler's own Idempotent-Replayed field (an
// upstream's, behind a proxy) never reaches the client of a response that
// ran it, held or streamed, which would take it for a replay; a replay
// says true.
func TestHandlerReplayedField(t *testing.T) {
	t.Parallel()
	for _, ct := range []string{"text/plain", "text/event-stream"} {
		h := newMiddleware(t, newMemExecutor(t)).Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			w.Header().Set("Content-Type", ct)
			w.Header().Set(idemhttp.ReplayedHeader, "true")
			io.WriteString(w, "ran")
		}))
		if res := post(h, "k", ""); res.body != "ran" || res.header.Get(idemhttp.ReplayedHeader) != "" {
			t.Errorf("%s, first: got %q %v, want no %s", ct, res.body, res.header, idemhttp.ReplayedHeader)
		}
		if res := post(h, "k", ""); res.body != "ran" || res.header.Get(idemhttp.ReplayedHeader) != "true" {
			t.Errorf("%s, replay: got %q %v, want %s: true", ct, res.body, res.header, idemhttp.ReplayedHeader)
		}
	}
}

// TestProblemTypeBase: problem types are URNs by default, documented in
// docs/problems.md (they pointed at pkg.go.dev pages of a module that is
// not published); WithProblemTypeBase puts them under a base of the
// caller's, Problem.Code names the kind whatever the base, and a base that
// is not an absolute URI is refused.
func TestProblemTypeBase(t *testing.T) {
	t.Parallel()
	var c counter
	var codes []string
	capture := func(w http.ResponseWriter, r *http.Request, p *idemhttp.Problem) {
		codes = append(codes, p.Code())
		idemhttp.WriteProblem(w, r, p)
	}
	for _, tc := range []struct {
		opts []idemhttp.Option
		want string
	}{
		{nil, "urn:idem:problem:key-mismatch"},
		{[]idemhttp.Option{idemhttp.WithProblemTypeBase("https://docs.example.com/errors#")}, "https://docs.example.com/errors#key-mismatch"},
	} {
		codes = nil
		h := newMiddleware(t, newMemExecutor(t), append(tc.opts, idemhttp.WithErrorHandler(capture))...).Handler(&c)
		post(h, "k", "a")
		checkProblem(t, post(h, "k", "b"), 422, tc.want)
		if len(codes) != 1 || codes[0] != "key_mismatch" {
			t.Errorf("codes: got %q, want [key_mismatch]", codes)
		}
	}
	if idemhttp.TypeKeyMismatch != "urn:idem:problem:key-mismatch" {
		t.Errorf("TypeKeyMismatch: got %q", idemhttp.TypeKeyMismatch)
	}
	for _, bad := range []string{"", "errors#", "://x"} {
		if _, err := idemhttp.New(newMemExecutor(t), idemhttp.WithProblemTypeBase(bad)); !errors.Is(err, idem.ErrInvalid) {
			t.Errorf("WithProblemTypeBase(%q): got %v, want ErrInvalid", bad, err)
		}
	}
	// A type of the caller's own stays as it is.
	p := &idemhttp.Problem{Type: "about:blank", Status: http.StatusBadGateway}
	if got := p.Code(); got != "bad_gateway" {
		t.Errorf("Code of about:blank 502: got %q, want bad_gateway", got)
	}
}
