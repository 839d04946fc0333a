package idemhttp_test

import (
	"net/http"
	"strings"
	"testing"

	"github.com/idemgo/idem"
	"github.com/idemgo/idem/idemhttp"
	"github.com/idemgo/idem/keysource"
	"github.com/idemgo/idem/memstore"
)

func mustSource(t *testing.T, spec string) keysource.Source {
	t.Helper()
	s, err := keysource.Parse(spec)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

func mustFingerprint(t *testing.T, spec string) keysource.Fingerprint {
	t.Helper()
	f, err := keysource.ParseFingerprint(spec)
	if err != nil {
		t.Fatal(err)
	}
	return f
}

func newMemstore(t *testing.T) idem.Store {
	t.Helper()
	s, err := memstore.New()
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// TestKeyFromBody checks a key taken from a JSON body: one execution per
// key, scoped by method, path and principal; a body that is not JSON or
// lacks the member gets the 400 of a missing key and runs nothing.
func TestKeyFromBody(t *testing.T) {
	var c counter
	mw := newMiddleware(t, newExecutor(t, newMemstore(t)),
		idemhttp.WithKeySource(mustSource(t, "json:/id")),
		idemhttp.WithMethods("POST", "PUT"),
		idemhttp.WithPrincipal(func(r *http.Request) string { return r.Header.Get("X-User") }))
	h := mw.Handler(&c)
	send := func(method, target, user, body string) response {
		r := request(method, target, "", body)
		r.Header.Set("X-User", user)
		return serve(h, r)
	}
	evt := `{"id":"evt_1","type":"charge.succeeded"}`
	steps := []struct {
		method, target, user, body string
		status                     int
		want                       string // body, or the problem type
	}{
		{"POST", "/hooks", "a", evt, 201, "execution 1: " + evt},
		{"POST", "/hooks", "a", `{ "type":"charge.succeeded", "id":"evt_1" }`, 422, idemhttp.TypeKeyMismatch},
		{"POST", "/hooks", "a", evt, 201, "execution 1: " + evt},
		{"POST", "/other", "a", evt, 201, "execution 2: " + evt}, // another path
		{"PUT", "/hooks", "a", evt, 201, "execution 3: " + evt},  // another method
		{"POST", "/hooks", "b", evt, 201, "execution 4: " + evt}, // another principal
		{"POST", "/hooks", "a", `{"type":"x"}`, 400, idemhttp.TypeKeyMissing},
		{"POST", "/hooks", "a", `{"id":null}`, 400, idemhttp.TypeKeyMissing},
		{"POST", "/hooks", "a", `id=evt_1`, 400, idemhttp.TypeKeyMissing},
		{"POST", "/hooks", "a", ``, 400, idemhttp.TypeKeyMissing},
		{"POST", "/hooks", "a", `{"id":""}`, 400, idemhttp.TypeKeyInvalid},
		{"POST", "/hooks", "a", `{"id":{"x":1}}`, 400, idemhttp.TypeKeyInvalid},
		{"POST", "/hooks", "a", `{"id":"` + strings.Repeat("k", 256) + `"}`, 400, idemhttp.TypeKeyInvalid},
		{"POST", "/hooks", "", evt, 400, idemhttp.TypePrincipalMissing},
	}
	for i, s := range steps {
		res := send(s.method, s.target, s.user, s.body)
		if s.status == 201 {
			if res.status != 201 || res.body != s.want {
				t.Errorf("step %d: got %d %q, want 201 %q", i, res.status, res.body, s.want)
			}
			continue
		}
		p := checkProblem(t, res, s.status, s.want)
		if s.want == idemhttp.TypeKeyMissing && !strings.Contains(p.Detail, "/id") {
			t.Errorf("step %d: detail %q does not name the member /id", i, p.Detail)
		}
	}
	if n := c.n.Load(); n != 4 {
		t.Errorf("executions: got %d, want 4", n)
	}
	// A request the middleware does not cover is not told its key was
	// ignored: no header field carries it.
	res := serve(h, request("GET", "/hooks", "k", ""))
	if res.header.Get(idemhttp.IgnoredHeader) != "" {
		t.Errorf("GET with a body key source: got %s: %q", idemhttp.IgnoredHeader, res.header.Get(idemhttp.IgnoredHeader))
	}
}

// TestKeyFromBodyOptional checks that a body without the key passes
// through unprotected, with its body, when the key is not required.
func TestKeyFromBodyOptional(t *testing.T) {
	var c counter
	h := newMiddleware(t, newExecutor(t, newMemstore(t)), idemhttp.WithKeySource(mustSource(t, "json:/id")), idemhttp.WithKeyRequired(false)).Handler(&c)
	for i := 1; i <= 2; i++ {
		if res := post(h, "", `{"n":1}`); res.status != 201 || res.body != `execution `+string(rune('0'+i))+`: {"n":1}` {
			t.Errorf("request %d: got %d %q", i, res.status, res.body)
		}
	}
}

// TestKeyFromHeaderSource checks WithKeySource with a header source.
func TestKeyFromHeaderSource(t *testing.T) {
	var c counter
	h := newMiddleware(t, newExecutor(t, newMemstore(t)), idemhttp.WithKeySource(mustSource(t, "header:X-GitHub-Delivery"))).Handler(&c)
	r := func() *http.Request {
		r := request("POST", "/hooks", "", "x")
		r.Header.Set("X-GitHub-Delivery", "d-1")
		return r
	}
	first, again := serve(h, r()), serve(h, r())
	if first.status != 201 || again.body != first.body || again.header.Get(idemhttp.ReplayedHeader) != "true" {
		t.Errorf("got %d %q then %q replayed=%q", first.status, first.body, again.body, again.header.Get(idemhttp.ReplayedHeader))
	}
	p := checkProblem(t, post(h, "d-1", "x"), 400, idemhttp.TypeKeyMissing) // Idempotency-Key is not the source
	if !strings.Contains(p.Detail, "X-Github-Delivery") {
		t.Errorf("detail %q does not name the field", p.Detail)
	}
	if _, err := idemhttp.New(newExecutor(t, newMemstore(t)), idemhttp.WithKeySource(keysource.Source{})); err == nil {
		t.Error("New with the zero Source: got no error")
	}
}

// TestFingerprintSubset checks json:POINTER,... fingerprints: a retry that
// differs outside the members is replayed, one that differs inside gets
// 422; none ignores the body.
func TestFingerprintSubset(t *testing.T) {
	for _, tt := range []struct {
		name, spec, then string
		want             int
	}{
		{"outside the subset", "json:/amount,/currency", `{"id":"e1","amount":100,"currency":"eur","delivered_at":"later"}`, 201},
		{"reordered", "json:/amount,/currency", `{"currency":"eur","amount":100,"id":"e1"}`, 201},
		{"inside the subset", "json:/amount,/currency", `{"id":"e1","amount":101,"currency":"eur","delivered_at":"now"}`, 422},
		{"a member gone", "json:/amount,/currency", `{"id":"e1","amount":100}`, 422},
		{"none", "none", `{"id":"e1","anything":true}`, 201},
		{"body", "body", `{"id":"e1","amount":100,"currency":"eur","delivered_at":"later"}`, 422},
	} {
		t.Run(tt.name, func(t *testing.T) {
			var c counter
			h := newMiddleware(t, newExecutor(t, newMemstore(t)),
				idemhttp.WithKeySource(mustSource(t, "json:/id")),
				idemhttp.WithFingerprint(mustFingerprint(t, tt.spec))).Handler(&c)
			first := post(h, "", `{"id":"e1","amount":100,"currency":"eur","delivered_at":"now"}`)
			if first.status != 201 {
				t.Fatalf("first: got %d", first.status)
			}
			res := post(h, "", tt.then)
			if tt.want == 422 {
				checkProblem(t, res, 422, idemhttp.TypeKeyMismatch)
			} else if res.status != 201 || res.body != first.body {
				t.Errorf("got %d %q, want the replay %q", res.status, res.body, first.body)
			}
			if n := c.n.Load(); n != 1 {
				t.Errorf("executions: got %d, want 1", n)
			}
		})
	}
}
