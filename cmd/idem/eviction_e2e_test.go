package main

import (
	"io"
	"net/http"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/idemgo/idem/testkit/redistest"
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

// TestProxyEvictionRecheck: CONFIG SET maxmemory-policy allkeys-lru on the
// Redis of a running proxy makes /readyz fail, with an error in the log
// that names the fix, until the policy is set back; with --allow-eviction
// /readyz stays ready.
func TestProxyEvictionRecheck(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t)
	up := newUpstream(t)
	storeArgs := []string{"--redis", "redis://" + srv.Addr(), "--redis-check-interval", "50ms"}
	p := startProxy(t, up.url(), storeArgs)
	allowing := startProxy(t, up.url(), storeArgs, "--allow-eviction")
	waitReady(t, p, 200, "ready")

	srv.Do(t, "CONFIG", "SET", "maxmemory-policy", "allkeys-lru")
	waitReady(t, p, 503, "maxmemory-policy allkeys-lru")
	waitLog(t, p, "CONFIG SET maxmemory-policy noeviction")
	if logs := p.stderr.String(); !strings.Contains(logs, "level=ERROR") {
		t.Errorf("log:\n%s\nwant an ERROR line", logs)
	}
	if res := post(t, p.url("/payments"), "while-evicting", "x"); res.status != 201 {
		t.Errorf("POST while the server evicts: got %d, want 201 (the proxy serves on)", res.status)
	}
	// The proxy with --allow-eviction checked the server again (INFO) and
	// stays ready.
	deadline := time.Now().Add(readyTimeout)
	for want := infoCalls(t, srv) + 4; infoCalls(t, srv) < want; {
		if time.Now().After(deadline) {
			t.Fatalf("INFO ran %d times after %v, want the proxies to check again", infoCalls(t, srv), readyTimeout)
		}
		time.Sleep(20 * time.Millisecond) // poll INFO's count until the proxies checked again
	}
	if status, body := readyz(t, allowing); status != 200 {
		t.Errorf("/readyz with --allow-eviction: got %d %q, want 200", status, body)
	}

	srv.Do(t, "CONFIG", "SET", "maxmemory-policy", "noeviction")
	waitReady(t, p, 200, "ready")
}

// infoCalls returns how many INFO commands the server ran.
func infoCalls(t *testing.T, srv *redistest.Server) int {
	t.Helper()
	m := regexp.MustCompile(`cmdstat_info:calls=(\d+)`).FindStringSubmatch(srv.Do(t, "INFO", "commandstats"))
	if m == nil {
		return 0
	}
	n, _ := strconv.Atoi(m[1])
	return n
}

// readyz returns the status and body of the proxy's /readyz.
func readyz(t *testing.T, p *proc) (int, string) {
	t.Helper()
	res, err := http.Get("http://" + p.admin + "/readyz")
	if err != nil {
		t.Fatal(err)
	}
	defer res.Body.Close()
	b, _ := io.ReadAll(res.Body)
	return res.StatusCode, string(b)
}

// waitReady waits until the proxy's /readyz answers status with a body
// that contains want.
func waitReady(t *testing.T, p *proc, status int, want string) {
	t.Helper()
	deadline := time.Now().Add(readyTimeout)
	for {
		got, body := readyz(t, p)
		if got == status && strings.Contains(body, want) {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("/readyz: got %d %q after %v, want %d and %q", got, body, readyTimeout, status, want)
		}
		time.Sleep(20 * time.Millisecond) // poll /readyz until the check's finding shows
	}
}
