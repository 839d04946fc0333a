package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/idemgo/idem/webhook"
)

// TestProxyRoutes runs `idem proxy --routes` with a GitHub route (its
// secret in a variable the file names) and a route whose key is in the
// body, beside the default route of the flags (Idempotency-Key); and
// checks that unknown fields, overlapping routes and paths that match no
// request stop the proxy at start with the line.
func TestProxyRoutes(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	write := func(name, text string) string {
		path := filepath.Join(dir, name)
		if err := os.WriteFile(path, []byte(text), 0o600); err != nil {
			t.Fatal(err)
		}
		return path
	}
	secret := []byte("route-secret")
	rc := newWebhookReceiver(t, webhook.GitHub, secret)
	routes := write("routes.yaml", `routes:
  - path: /hooks/github
    webhook: github
    webhook_secret_env: TEST_GITHUB_SECRET
  - path: /events
    methods: [POST, PUT]
    key_from: json:/event/id
    fingerprint: json:/event
    lease: 1m
  - path: /optional
    key_from: json:/id
    require_key: false
`)
	addr, admin := freeAddr(t), freeAddr(t)
	p := launchProxyEnv(t, []string{"TEST_GITHUB_SECRET=" + string(secret)},
		[]string{"proxy", "--listen", addr, "--admin-listen", admin, "--upstream", rc.srv.URL, "--data", t.TempDir(), "--routes", routes}, addr, admin)
	if res := sendSigned(t, p.url("/hooks/github"), webhook.GitHub, []byte("forged"), "d-1"); res.status != 401 {
		t.Errorf("forged delivery: got %d, want 401 from the proxy", res.status)
	}
	first, again := sendSigned(t, p.url("/hooks/github"), webhook.GitHub, secret, "d-1"), sendSigned(t, p.url("/hooks/github"), webhook.GitHub, secret, "d-1")
	if first.status != 200 || !again.replayed() || rc.executions("d-1") != 1 {
		t.Errorf("github route: got %d, replayed=%v, %d executions", first.status, again.replayed(), rc.executions("d-1"))
	}
	// The /events route: the key in the body, PUT covered. The receiver
	// answers 401 (no signature) and the default policy stores it: a
	// replay shows the key was taken from the body.
	for _, m := range []string{"POST", "PUT"} {
		send(t, m, p.url("/events"), "", `{"event":{"id":"e1"}}`)
		if res := send(t, m, p.url("/events"), "", `{"event":{"id":"e1"}}`); !res.replayed() {
			t.Errorf("%s /events: not replayed (%d %q)", m, res.status, res.body)
		}
	}
	if res := send(t, "POST", p.url("/events"), "", `{"other":1}`); res.status != 400 {
		t.Errorf("/events without the key: got %d, want 400", res.status)
	}
	// require_key: false passes a body without the key through.
	for i := range 2 {
		if res := send(t, "POST", p.url("/optional"), "", `{"x":1}`); res.status != 401 || res.replayed() {
			t.Errorf("/optional without the key, %d: got %d replayed=%v, want the receiver's answer", i, res.status, res.replayed())
		}
	}
	// The default route: Idempotency-Key.
	if res := send(t, "POST", p.url("/api"), "", `{}`); res.status != 400 || !strings.Contains(res.body, "key-missing") {
		t.Errorf("default route without Idempotency-Key: got %d %q", res.status, res.body)
	}

	for _, tt := range []struct{ name, text, want string }{
		{"unknown.yaml", "routes:\n  - path: /a\n    key: x\n", "line 3: field key not found"},
		{"top.yaml", "route:\n  - path: /a\n", "line 1: field route not found"},
		{"overlap.yaml", "routes:\n  - path: /hooks\n  - path: /b\n  - path: /hooks/github\n", "line 4: path /hooks/github overlaps /hooks for the same method (the route at line 2)"},
		{"nomatch.yaml", "routes:\n  - path: /a\n  - path: hooks/x\n", "line 3: path \"hooks/x\" does not start with /"},
		{"dots.json", "{\"routes\": [\n {\"path\": \"/a\"},\n {\"path\": \"/a/../b\"}\n]}\n", "line 3: path \"/a/../b\" has a .. segment"},
		{"badkey.yaml", "routes:\n  - path: /a\n    key_from: json:id\n", "line 2: invalid key source"},
		{"nopath.yaml", "routes:\n  - methods: [POST]\n", "line 2: a route needs a path"},
		{"empty.yaml", "routes: []\n", "no routes"},
	} {
		code, _, stderr := runIdem(t, "proxy", "--upstream", rc.srv.URL, "--data", t.TempDir(), "--routes", write(tt.name, tt.text))
		if code != 2 || !strings.Contains(stderr, tt.want) {
			t.Errorf("%s: got exit %d %q, want 2 and %q", tt.name, code, stderr, tt.want)
		}
	}
}
