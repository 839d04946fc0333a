package main

import (
	"strings"
	"testing"
	"time"

	"github.com/idemgo/idem/internal/redistest"
)

// TestProxySentinel runs the proxy, ls and doctor on a Redis behind
// Sentinels (--redis-sentinel, with --redis-password), kills the primary
// and checks that the proxy follows the failover: the completed key is
// replayed and new keys run. The password never appears in a message.
func TestProxySentinel(t *testing.T) {
	t.Parallel()
	s := redistest.StartSentinel(t, 2, "--appendonly", "yes")
	const password = "s3cret-pw"
	s.RequirePass(t, password)
	storeArgs := []string{"--redis-sentinel", s.MasterName + "@" + strings.Join(s.SentinelAddrs(), ","), "--redis-password", password}

	code, out, stderr := runIdem(t, append([]string{"doctor", "--wait-replicas", "2"}, storeArgs...)...)
	if code != 0 || !strings.Contains(out, "OK    replicas: 2 connected (WAIT 2)") || !strings.Contains(out, "OK    rights:") {
		t.Errorf("doctor: got %d\n%s%s\nwant 0 with the replicas and rights OK", code, out, stderr)
	}

	up := newUpstream(t)
	p := startProxy(t, up.url(), storeArgs)
	if res := post(t, p.url("/payments"), "before", "x"); res.status != 201 {
		t.Fatalf("POST: got %d, want 201", res.status)
	}
	code, out, _ = runIdem(t, append([]string{"ls"}, storeArgs...)...)
	if code != 0 || strings.Count(out, "COMPLETED") != 1 {
		t.Errorf("ls: got %d\n%s\nwant the one record", code, out)
	}

	old := s.Primary()
	old.Kill(t)
	s.WaitFailover(t, old)
	// The proxy's client finds the new primary through the Sentinels; until
	// it does, requests get 503.
	deadline := time.Now().Add(30 * time.Second)
	for {
		res := post(t, p.url("/payments"), "after", "y")
		if res.status == 201 {
			break
		}
		if res.status != 503 || time.Now().After(deadline) {
			t.Fatalf("POST after the failover: got %d, want 201 (503 while the client reconnects)", res.status)
		}
		time.Sleep(100 * time.Millisecond) // retry as a client would
	}
	if res := post(t, p.url("/payments"), "before", "x"); !res.replayed() || up.executions("before") != 1 {
		t.Errorf("retry of the key completed before the failover: got %d replayed=%v after %d executions, want a replay", res.status, res.replayed(), up.executions("before"))
	}

	// A wrong password is reported without either password.
	bad := []string{"--redis-sentinel", storeArgs[1], "--redis-password", "wrong-pw", "--redis-sentinel-password", "other-pw"}
	code, _, stderr = runIdem(t, append([]string{"ls"}, bad...)...)
	if code == 0 || strings.Contains(stderr, "wrong-pw") || strings.Contains(stderr, "other-pw") || strings.Contains(stderr, password) {
		t.Errorf("ls with a wrong password: got %d %q, want an error without the passwords", code, stderr)
	}
	p.terminate()
	p.wait()
	if logs := p.stderr.String(); strings.Contains(logs, password) {
		t.Errorf("the proxy's log shows the password:\n%s", logs)
	}
}

// TestSentinelFlags checks the validation of --redis-sentinel and its
// password flags, which never echo a password.
func TestSentinelFlags(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"--redis-sentinel", "127.0.0.1:26379"}, "want NAME@HOST:PORT"},
		{[]string{"--redis-sentinel", "m@"}, "--redis-sentinel has no address"},
		{[]string{"--redis-sentinel", "m@host"}, `invalid --redis-sentinel address "host"`},
		{[]string{"--redis-sentinel", "m@127.0.0.1:1", "--redis", "redis://127.0.0.1:1"}, "exclude each other"},
		{[]string{"--redis", "redis://127.0.0.1:1", "--redis-password", "pw-secret"}, "put them in the URL"},
		{[]string{"--redis-sentinel-password", "pw-secret"}, "needs --redis-sentinel"},
	} {
		code, _, stderr := runIdem(t, append([]string{"ls"}, tc.args...)...)
		if code != 2 || !strings.Contains(stderr, tc.want) || strings.Contains(stderr, "pw-secret") {
			t.Errorf("ls %v: got %d %q, want 2 and %q without the password", tc.args, code, stderr, tc.want)
		}
	}
}
