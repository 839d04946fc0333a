package main

import (
	"strings"
	"testing"
)

// TestProxyKeyFrom checks --key-from json:POINTER and --fingerprint
// json:POINTER: the key is the body's member, a redelivery that differs
// outside the fingerprint is replayed, a body without the member gets 400
// and never reaches the upstream, and a bad spec stops the proxy at start.
func TestProxyKeyFrom(t *testing.T) {
	t.Parallel()
	up := newUpstream(t)
	p := startProxy(t, up.url(), []string{"--data", t.TempDir()}, "--key-from", "json:/id", "--fingerprint", "json:/amount")
	first := post(t, p.url("/hooks"), "", `{"id":"evt_1","amount":5,"attempt":1}`)
	if first.status != 201 || first.replayed() {
		t.Fatalf("first: got %d %q replayed=%v", first.status, first.body, first.replayed())
	}
	again := post(t, p.url("/hooks"), "", `{"attempt":2,"amount":5,"id":"evt_1"}`)
	if again.status != 201 || again.body != first.body || !again.replayed() {
		t.Errorf("redelivery: got %d %q replayed=%v, want the replay", again.status, again.body, again.replayed())
	}
	if res := post(t, p.url("/hooks"), "", `{"id":"evt_1","amount":6}`); res.status != 422 {
		t.Errorf("another amount: got %d, want 422", res.status)
	}
	if res := post(t, p.url("/hooks"), "", `{"amount":5}`); res.status != 400 || !strings.Contains(res.body, "key-missing") {
		t.Errorf("no id: got %d %q, want 400 key-missing", res.status, res.body)
	}
	if n := up.executions(""); n != 1 {
		t.Errorf("upstream executions: got %d, want 1", n)
	}

	for _, tt := range []struct{ flag, value, want string }{
		{"--key-from", "json:id", `invalid --key-from "json:id"`},
		{"--key-from", "cookie:x", "want header:NAME"},
		{"--fingerprint", "json:/a,/a", "/a is listed twice"},
	} {
		code, _, stderr := runIdem(t, "proxy", "--upstream", up.url(), "--data", t.TempDir(), tt.flag, tt.value)
		if code != 2 || !strings.Contains(stderr, tt.want) {
			t.Errorf("%s %s: got exit %d %q, want 2 and %q", tt.flag, tt.value, code, stderr, tt.want)
		}
	}
}
