package main

import (
	"strings"
	"testing"

	"github.com/idemgo/idem/internal/redistest"
)

// TestProxyEvictingRedis checks that the proxy refuses to start on a Redis
// whose maxmemory-policy can evict records, in one line that names the fix
// and the flag, and starts with --allow-eviction; and that on a server that
// refuses INFO and CONFIG GET it starts with one warning.
func TestProxyEvictingRedis(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t, "--maxmemory-policy", "allkeys-lru")
	up := newUpstream(t)
	storeArgs := []string{"--redis", "redis://" + srv.Addr()}
	args := append([]string{"proxy", "--listen", freeAddr(t), "--admin-listen", freeAddr(t), "--upstream", up.url()}, storeArgs...)
	code, _, stderr := runIdem(t, args...)
	if line := strings.TrimSpace(stderr); code != 1 || strings.Contains(line, "\n") ||
		!strings.Contains(line, "maxmemory-policy allkeys-lru") || !strings.Contains(line, "set maxmemory-policy noeviction") || !strings.Contains(line, "--allow-eviction") {
		t.Errorf("proxy on allkeys-lru: got exit %d, stderr:\n%s\nwant 1 and one line naming the policy, the fix and --allow-eviction", code, stderr)
	}

	p := startProxy(t, up.url(), storeArgs, "--allow-eviction")
	if res := post(t, p.url("/payments"), "k", "x"); res.status != 201 {
		t.Errorf("proxy with --allow-eviction: got %d, want 201", res.status)
	}
	p.terminate()
	p.wait()

	// The admin commands only read and delete: they work on it.
	if code, _, stderr := runIdem(t, append([]string{"ls"}, storeArgs...)...); code != 0 {
		t.Errorf("ls on allkeys-lru: got %d %s, want 0", code, stderr)
	}

	srv.Do(t, "ACL", "SETUSER", "managed", "on", ">pw", "~*", "&*", "+@all", "-info", "-config")
	p = startProxy(t, up.url(), []string{"--redis", "redis://managed:pw@" + srv.Addr()})
	p.terminate()
	p.wait()
	if logs := p.stderr.String(); strings.Count(logs, "cannot check the server") != 1 || strings.Contains(logs, "pw@") {
		t.Errorf("proxy as a user without INFO and CONFIG: got log\n%s\nwant one warning that the server could not be checked, without the password", logs)
	}
}
