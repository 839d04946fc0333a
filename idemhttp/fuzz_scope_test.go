package idemhttp

import (
	"net/http"
	"net/url"
	"strings"
	"testing"

	"github.com/idemgo/idem/internal/httpsyntax"
)

// FuzzScope checks the keys of two requests: two different (method, path,
// principal, key) tuples never get the same store key, with or without a
// principal function, so that one principal or route can never replay
// another's response; and the scope the middleware computes for a request
// is the one PathKey and PrincipalPathKey (which the idem binary's admin
// commands use) document. The seeds are pairs that a careless
// concatenation would confuse.
func FuzzScope(f *testing.F) {
	digest32 := strings.Repeat("\x01", 32)
	for _, s := range [][8]string{
		{"POST", "/a", "alice", "k", "POST", "/a", "bob", "k"},
		{"POST", "/a", "", "k", "POST", "/a", " ", "k"},
		{"POST", "/a b", "", "k", "POST", "/a", "b", "k"},
		{"POST", "/a\x00" + digest32, "", "k", "POST", "/a", digest32, "k"},
		{"PATCH", "/x", "Bearer t", "k", "POST", "/x", "Bearer t", "k"},
		{"POST", "/u:/", "p", "key", "POST", "/u", ":/p", "key"},
		{"POST", "/p", "caf\xc3\xa9", "\"q\"", "POST", "/p", "café", `"q"`},
		{"POST", "/", "\r\n", strings.Repeat("k", 255), "POST", "//", "\n", strings.Repeat("k", 254)},
	} {
		f.Add(s[0], s[1], s[2], s[3], s[4], s[5], s[6], s[7])
	}
	withP := newTestMiddleware(f, WithPrincipal(func(r *http.Request) string { return r.Header.Get("X-Principal") }))
	withoutP := newTestMiddleware(f)
	f.Fuzz(func(t *testing.T, m1, p1, pr1, id1, m2, p2, pr2, id2 string) {
		if !httpsyntax.IsToken(m1) || !httpsyntax.IsToken(m2) || id1 == "" || id2 == "" {
			return
		}
		a := PrincipalPathKey(m1, p1, pr1, id1)
		b := PrincipalPathKey(m2, p2, pr2, id2)
		if same := m1 == m2 && p1 == p2 && pr1 == pr2 && id1 == id2; same != (a.Digest() == b.Digest()) {
			t.Fatalf("(%q %q %q %q) and (%q %q %q %q): same=%v, digests %q and %q",
				m1, p1, pr1, id1, m2, p2, pr2, id2, same, a.Digest(), b.Digest())
		}
		c, d := PathKey(m1, p1, id1), PathKey(m2, p2, id2)
		if same := m1 == m2 && p1 == p2 && id1 == id2; same != (c.Digest() == d.Digest()) {
			t.Fatalf("(%q %q %q) and (%q %q %q): same=%v, digests %q and %q",
				m1, p1, id1, m2, p2, id2, same, c.Digest(), d.Digest())
		}
		// The middleware's own scope for such a request.
		r := &http.Request{Method: m1, URL: &url.URL{Path: p1}, Header: http.Header{"X-Principal": {pr1}}}
		if got := withP.scope(r); got != a.Scope {
			t.Fatalf("scope of %s %q with principal %q = %q, want PrincipalPathKey's %q", m1, p1, pr1, got, a.Scope)
		}
		if got := withoutP.scope(r); got != c.Scope {
			t.Fatalf("scope of %s %q = %q, want PathKey's %q", m1, p1, got, c.Scope)
		}
	})
}
