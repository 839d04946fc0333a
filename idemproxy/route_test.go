package idemproxy

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/idemgo/idem/idemhttp"
	"github.com/idemgo/idem/keysource"
	"github.com/idemgo/idem/webhook"
)

func TestCheckRoutes(t *testing.T) {
	for _, tt := range []struct {
		routes []Route
		index  int
		want   string
	}{
		{[]Route{{PathPrefix: "/a"}, {PathPrefix: "/b"}, {PathPrefix: "/a", Methods: []string{"PUT"}}}, -1, ""},
		{[]Route{{PathPrefix: "/hooks"}, {PathPrefix: "/hooksx"}}, -1, ""},
		{[]Route{{PathPrefix: "/hooks"}, {PathPrefix: "/hooks/github"}}, 1, "overlaps /hooks"},
		{[]Route{{PathPrefix: "/hooks/"}, {PathPrefix: "/hooks/github", Methods: []string{"post"}}}, 1, "overlaps"},
		{[]Route{{PathPrefix: "/a"}, {PathPrefix: "/a"}}, 1, "overlaps"},
		{[]Route{{PathPrefix: ""}}, 0, "no path"},
		{[]Route{{PathPrefix: "hooks"}}, 0, "does not start with /"},
		{[]Route{{PathPrefix: "/a?b=1"}}, 0, "query"},
		{[]Route{{PathPrefix: "/a//b"}}, 0, "empty segment"},
		{[]Route{{PathPrefix: "/a/../b"}}, 0, ".. segment"},
		{[]Route{{PathPrefix: "/a b"}}, 0, "space"},
		{[]Route{{PathPrefix: "/a", Methods: []string{"P OST"}}}, 0, "invalid method"},
	} {
		err := CheckRoutes(tt.routes, nil)
		var re *RouteError
		switch {
		case tt.want == "" && err != nil:
			t.Errorf("%+v: %v", tt.routes, err)
		case tt.want != "" && (!errors.As(err, &re) || re.Index != tt.index || !strings.Contains(err.Error(), tt.want)):
			t.Errorf("%+v: got %v, want route %d: %q", tt.routes, err, tt.index+1, tt.want)
		}
	}
	p := &Proxy{Routes: []Route{{PathPrefix: "x"}}}
	var fe *FieldError
	if err := p.Check(); !errors.As(err, &fe) || fe.Field != "Routes" {
		t.Errorf("Check: got %v, want a FieldError of Routes", err)
	}
}

// TestRoutes: one proxy in front of an API (Idempotency-Key) and two
// webhook senders: each path prefix gets its own key source, verifier and
// methods, and a request outside every route the Proxy's fields.
func TestRoutes(t *testing.T) {
	u := newUpstream(t)
	ghSecret := []byte("gh")
	gh, _ := webhook.New(webhook.GitHub, [][]byte{ghSecret})
	ghSrc, _ := webhook.KeySource(webhook.GitHub)
	stripeSrc, _ := keysource.Parse("json:/id")
	p := &Proxy{Target: u.target(t), Executor: newExecutor(t), Routes: []Route{
		{PathPrefix: "/hooks/github", Methods: []string{"POST"}, KeySource: ghSrc, Verifier: gh, Policy: idemhttp.StoreSuccessOnly},
		{PathPrefix: "/hooks/stripe", Methods: []string{"POST", "PUT"}, KeySource: stripeSrc},
	}}
	base := serve(t, p)
	// The API: Idempotency-Key.
	if res := send(t, "POST", base+"/api/orders", "k1", []byte("x")); res.status != 201 {
		t.Fatalf("api: got %d", res.status)
	}
	if res := send(t, "POST", base+"/api/orders", "k1", []byte("x")); !res.replayed() {
		t.Errorf("api retry: not replayed")
	}
	// GitHub: the signature, then X-GitHub-Delivery.
	body := []byte(`{"zen":"x"}`)
	h, _ := webhook.Sign(webhook.GitHub, ghSecret, "d-1", time.Now(), body)
	forged, _ := webhook.Sign(webhook.GitHub, []byte("forged"), "d-1", time.Now(), body)
	if res := post(t, base+"/hooks/github/app", forged, body); res.status != 401 {
		t.Errorf("forged github: got %d, want 401", res.status)
	}
	first, again := post(t, base+"/hooks/github/app", h, body), post(t, base+"/hooks/github/app", h, body)
	if first.status != 201 || !again.replayed() {
		t.Errorf("github: got %d then replayed=%v", first.status, again.replayed())
	}
	// Stripe: the key in the body, no Idempotency-Key, PUT covered too.
	for _, m := range []string{"POST", "PUT"} {
		r1 := send(t, m, base+"/hooks/stripe", "", []byte(`{"id":"evt_9"}`))
		r2 := send(t, m, base+"/hooks/stripe", "", []byte(`{"id":"evt_9"}`))
		if r1.status != 201 || !r2.replayed() {
			t.Errorf("stripe %s: got %d then replayed=%v", m, r1.status, r2.replayed())
		}
	}
	if res := send(t, "POST", base+"/hooks/stripe", "", []byte(`{}`)); res.status != 400 {
		t.Errorf("stripe without an id: got %d, want 400", res.status)
	}
	// PUT outside the routes is not covered: it passes through.
	if res := send(t, "PUT", base+"/api/orders", "k2", []byte("x")); res.status != 201 || res.header.Get(idemhttp.IgnoredHeader) != "true" {
		t.Errorf("PUT /api: got %d ignored=%q, want a pass-through", res.status, res.header.Get(idemhttp.IgnoredHeader))
	}
}
