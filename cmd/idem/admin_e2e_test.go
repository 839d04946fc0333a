package main

import (
	"errors"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/idemgo/idem"
	"github.com/idemgo/idem/redisstore"
	"github.com/idemgo/idem/storekit"
	"github.com/idemgo/idem/testkit/redistest"
	"github.com/redis/go-redis/v9"
)

// TestAdmin runs get, ls and rm against both stores, for a proxy that
// scopes keys by a header. The embedded store is inspected while no proxy
// runs (it is locked while one does); Redis while the proxy runs.
func TestAdmin(t *testing.T) {
	forEachStore(t, func(t *testing.T, sk storeKind) {
		storeArgs := sk.args(t)
		up := newUpstream(t)
		p := startProxy(t, up.url(), storeArgs, "--scope-header", "X-Tenant")
		if res := post(t, p.url("/payments"), "adm", "pay 1", "X-Tenant", "acme"); res.status != 201 {
			t.Fatalf("POST: got %d", res.status)
		}
		post(t, p.url("/payments"), "other", "pay 2", "X-Tenant", "acme")
		if sk.name == "embedded" {
			code, _, stderr := runIdem(t, append([]string{"get", "adm", "--path", "/payments", "--principal", "acme"}, storeArgs...)...)
			if code != 1 || !strings.Contains(stderr, "in use by another process") {
				t.Errorf("get while the proxy runs: got %d %q, want 1 and a message that the store is in use", code, stderr)
			}
			p.terminate()
			p.wait()
		}
		admin := func(args ...string) (int, string, string) {
			t.Helper()
			return runIdem(t, append(args, storeArgs...)...)
		}
		scope := []string{"--path", "/payments", "--principal", "acme"}

		code, out, stderr := admin(append([]string{"get", "adm"}, scope...)...)
		if code != 0 {
			t.Fatalf("get: exit %d: %s", code, stderr)
		}
		for _, want := range []string{"state       COMPLETED", "attempts    1", "status      201", "response body 25 bytes"} {
			if !strings.Contains(out, want) {
				t.Errorf("get: got\n%s\nwant it to contain %q", out, want)
			}
		}
		// Both stores know when the record was created.
		if !regexp.MustCompile(`created     \d{4}-\d\d-\d\dT\S+Z \(\S+ ago\)`).MatchString(out) {
			t.Errorf("get: got\n%s\nwant the created time and age", out)
		}
		if !regexp.MustCompile(`expires in  (23h59m|24h0m0s)`).MatchString(out) {
			t.Errorf("get: got\n%s\nwant it to expire in about 24h", out)
		}
		if strings.Contains(out, "pay 1") {
			t.Errorf("get: got\n%s\nwant no body without --show-body", out)
		}
		digest := regexp.MustCompile(`digest\s+(\S+)`).FindStringSubmatch(out)
		if digest == nil {
			t.Fatalf("get: no digest in\n%s", out)
		}
		if sk.name == "redis" && !strings.Contains(out, "redis key   idem:{"+digest[1]+"}") {
			t.Errorf("get: got\n%s\nwant the Redis key", out)
		}

		_, out, _ = admin(append([]string{"get", "adm", "--show-body"}, scope...)...)
		if !strings.Contains(out, "HTTP 201 Created") || !strings.Contains(out, "X-Upstream: yes") || !strings.Contains(out, "execution 1 of adm: pay 1") {
			t.Errorf("get --show-body: got\n%s\nwant the status line, fields and body", out)
		}
		// The same key in another scope has no record.
		for _, args := range [][]string{
			{"get", "adm", "--path", "/payments"},
			{"get", "adm", "--path", "/payments", "--principal", "other"},
			{"get", "adm", "--path", "/orders", "--principal", "acme"},
			{"get", "adm", "--path", "/payments", "--principal", "acme", "--method", "PATCH"},
		} {
			if code, _, stderr := admin(args...); code != 1 || !strings.Contains(stderr, "no record") {
				t.Errorf("%q: got %d %q, want 1 and no record", args, code, stderr)
			}
		}

		code, out, _ = admin("ls")
		if code != 0 || !strings.Contains(out, digest[1]) || strings.Count(out, "COMPLETED") != 2 || !strings.HasPrefix(out, "DIGEST") {
			t.Errorf("ls: got %d\n%s\nwant a header and the 2 records", code, out)
		}
		if ages := regexp.MustCompile(`COMPLETED\s+\d+\s+\d+\s+\d[\dhms.]*s\s`).FindAllString(out, -1); len(ages) != 2 {
			t.Errorf("ls: got\n%s\nwant the age of both records", out)
		}
		if code, out, _ := admin("ls", "--limit", "1"); code != 0 || strings.Count(out, "COMPLETED") != 1 {
			t.Errorf("ls --limit 1: got %d\n%s\nwant 1 record", code, out)
		}
		if code, out, _ := admin("get", "--digest", digest[1]); code != 0 || !strings.Contains(out, "COMPLETED") {
			t.Errorf("get --digest: got %d\n%s", code, out)
		}

		code, out, stderr = admin(append([]string{"rm", "adm", "--scope-header", "X-Tenant"}, scope...)...)
		if code != 0 || !strings.Contains(out, "deleted "+digest[1]+" (was COMPLETED") {
			t.Errorf("rm: got %d %q %q, want the record deleted", code, out, stderr)
		}
		if code, _, _ := admin(append([]string{"get", "adm"}, scope...)...); code != 1 {
			t.Errorf("get after rm: got %d, want 1", code)
		}
		// A miss exits 1 and says where it looked and how to look elsewhere.
		if code, out, stderr := admin(append([]string{"rm", "adm"}, scope...)...); code != 1 || out != "" ||
			!strings.Contains(stderr, "no record for this key in scope POST /payments with that --principal") || !strings.Contains(stderr, "nothing deleted") {
			t.Errorf("rm again: got %d %q %q, want 1 and where it looked", code, out, stderr)
		}
		if code, _, stderr := admin("get", "adm"); code != 1 || !strings.Contains(stderr, "in scope POST / (digest") ||
			!strings.Contains(stderr, "pass them with --method and --path") || strings.Count(stderr, "\n") != 1 {
			t.Errorf("get without --path: got %d %q, want 1 and one line naming the scope searched and the flags", code, stderr)
		}

		if sk.name == "embedded" {
			p = p.restart()
		}
		res := post(t, p.url("/payments"), "adm", "pay 1", "X-Tenant", "acme")
		if res.status != 201 || res.replayed() || up.executions("adm") != 2 {
			t.Errorf("after rm: got %d replayed=%v after %d executions, want a second execution", res.status, res.replayed(), up.executions("adm"))
		}
	})
}

// TestDoctor runs doctor against a correctly and a wrongly configured
// redis-server, a Cluster and the embedded store.
func TestDoctor(t *testing.T) {
	t.Parallel()
	t.Run("good", func(t *testing.T) {
		t.Parallel()
		srv := redistest.Start(t, "--appendonly", "yes", "--maxmemory-policy", "noeviction", "--maxmemory", "100mb")
		code, out, stderr := runIdem(t, "doctor", "--redis", "redis://"+srv.Addr())
		if code != 0 || strings.Contains(out, "FAIL ") || strings.Contains(out, "WARN ") {
			t.Errorf("exit %d, stdout:\n%s\nstderr: %s\nwant 0 and no FAIL or WARN", code, out, stderr)
		}
		// Any supported server: Redis 7.0 and later, Valkey.
		if !regexp.MustCompile(`OK    version: (redis (7|[89]|[1-9][0-9]+)|valkey [0-9]+)\.`).MatchString(out) {
			t.Errorf("stdout:\n%s\nwant the version OK", out)
		}
		for _, want := range []string{"OK    maxmemory-policy: noeviction", "OK    maxmemory: 100", "OK    persistence: appendonly yes", "OK    lua: EVAL works", "OK    round trip: median PING",
			`OK    rights: acquire, extend, complete, get, release, fail and delete ran on a scratch key of prefix "idem:"`} {
			if !strings.Contains(out, want) {
				t.Errorf("stdout:\n%s\nwant %q", out, want)
			}
		}
		if keys := srv.Do(t, "DBSIZE"); keys != "0" {
			t.Errorf("DBSIZE after doctor: got %s, want 0 (the scratch keys deleted)", keys)
		}
	})
	t.Run("functions", func(t *testing.T) {
		t.Parallel()
		srv := redistest.Start(t, "--appendonly", "yes")
		_, out, _ := runIdem(t, "doctor", "--redis", "redis://"+srv.Addr())
		if want := "OK    functions: no idem library loaded (script mode; Functions mode loads " + redisstore.LibraryName(); !strings.Contains(out, want) {
			t.Errorf("stdout:\n%s\nwant %q", out, want)
		}
		rdb := redis.NewClient(&redis.Options{Addr: srv.Addr()})
		defer rdb.Close()
		s, err := redisstore.New(rdb, redisstore.WithFunctions())
		if err != nil {
			t.Fatal(err)
		}
		if _, err := s.Get(t.Context(), idem.Key{ID: "k"}.Digest()); err != storekit.ErrNotFound {
			t.Fatalf("Get in Functions mode: got %v, want ErrNotFound", err)
		}
		_, out, _ = runIdem(t, "doctor", "--redis", "redis://"+srv.Addr())
		loaded := "OK    functions: library " + redisstore.LibraryName() + " of this version loaded"
		if !strings.Contains(out, loaded) {
			t.Errorf("stdout:\n%s\nwant %q", out, loaded)
		}
		// A library of idem's name with other code: every call would fail
		// until the store replaces it.
		name := redisstore.LibraryName()
		srv.Do(t, "FUNCTION", "LOAD", "REPLACE", "#!lua name="+name+"\nredis.register_function('"+name+"_other', function() return 1 end)")
		_, out, _ = runIdem(t, "doctor", "--redis", "redis://"+srv.Addr())
		if want := "WARN  functions: library " + name + " holds other code than this version's"; !strings.Contains(out, want) {
			t.Errorf("stdout:\n%s\nwant %q", out, want)
		}
		if _, err := s.Get(t.Context(), idem.Key{ID: "k"}.Digest()); err != storekit.ErrNotFound {
			t.Fatalf("Get in Functions mode with the other library: got %v, want ErrNotFound", err)
		}
		if _, out, _ = runIdem(t, "doctor", "--redis", "redis://"+srv.Addr()); !strings.Contains(out, loaded) {
			t.Errorf("after the store's call: stdout:\n%s\nwant %q", out, loaded)
		}
	})
	t.Run("bad", func(t *testing.T) {
		t.Parallel()
		srv := redistest.Start(t, "--maxmemory-policy", "allkeys-lru")
		code, out, _ := runIdem(t, "doctor", "--redis", "redis://"+srv.Addr())
		if code != 1 {
			t.Errorf("exit code: got %d, want 1", code)
		}
		for _, want := range []string{"FAIL  maxmemory-policy: allkeys-lru", "WARN  maxmemory: 0 (no limit)", "FAIL  persistence: off", "2 FAIL"} {
			if !strings.Contains(out, want) {
				t.Errorf("stdout:\n%s\nwant %q", out, want)
			}
		}
	})
	t.Run("acl", func(t *testing.T) {
		t.Parallel()
		srv := redistest.Start(t, "--appendonly", "yes", "--maxmemory", "100mb")
		srv.Do(t, "ACL", "SETUSER", "notime", "on", ">pw", "~*", "&*", "+@all", "-time")
		srv.Do(t, "ACL", "SETUSER", "nopublish", "on", ">pw", "~*", "&*", "+@all", "-publish")
		srv.Do(t, "ACL", "SETUSER", "nosubscribe", "on", ">pw", "~*", "&*", "+@all", "-subscribe")
		// The replay cache's tracking connection: CLIENT SETNAME, ID and
		// TRACKING, and the channel of the invalidations.
		srv.Do(t, "ACL", "SETUSER", "idemchannels", "on", ">pw", "~idem:*", "resetchannels", "&idem:*", "+@all")
		srv.Do(t, "ACL", "SETUSER", "notracking", "on", ">pw", "~*", "&*", "+@all", "-client|tracking")
		srv.Do(t, "ACL", "SETUSER", "noclient", "on", ">pw", "~*", "&*", "+@all", "-client")
		// INFO refused: the proxy starts with one warning; doctor warns.
		srv.Do(t, "ACL", "SETUSER", "noinfo", "on", ">pw", "~*", "&*", "+@all", "-info")
		srv.Do(t, "ACL", "SETUSER", "managed", "on", ">pw", "~*", "&*", "+@all", "-info", "-config")
		for _, tc := range []struct {
			user string
			code int
			want string
		}{
			{"notime", 1, "FAIL  rights: the user may not run TIME, which every transition (the server's clock) needs; grant it (ACL SETUSER <user> +time)"},
			{"nopublish", 1, "FAIL  rights: the user may not run PUBLISH, which complete, fail and release (wake-ups) needs"},
			{"nosubscribe", 0, "WARN  rights: the user may not run SUBSCRIBE"},
			{"idemchannels", 0, "WARN  replay cache: the user may not subscribe to __redis__:invalidate, where the server sends the replay cache's invalidations: the proxy reads every replay from Redis; grant it (ACL SETUSER <user> &__redis__:invalidate)"},
			{"notracking", 0, "WARN  replay cache: the user may not run CLIENT TRACKING, which the replay cache's tracking connection needs: the proxy reads every replay from Redis; grant it (ACL SETUSER <user> +client|tracking)"},
			{"noclient", 0, "WARN  replay cache: the user may not run CLIENT SETNAME, CLIENT ID, CLIENT TRACKING, which the replay cache's tracking connection needs: the proxy reads every replay from Redis; grant it (ACL SETUSER <user> +client|setname +client|id +client|tracking)"},
			{"noinfo", 0, "WARN  info: the user may not run INFO"},
			{"noinfo", 0, "OK    maxmemory-policy: noeviction"},
			{"managed", 0, "WARN  maxmemory-policy: cannot read it (INFO and CONFIG GET refused); it must be noeviction"},
		} {
			code, out, _ := runIdem(t, "doctor", "--redis", "redis://"+tc.user+":pw@"+srv.Addr())
			if code != tc.code || !strings.Contains(out, tc.want) || strings.Contains(out, "connect:") {
				t.Errorf("user %s: got %d\n%s\nwant %d and %q", tc.user, code, out, tc.code, tc.want)
			}
		}
		// A replay cache that the proxy would not run is not checked.
		if code, out, _ := runIdem(t, "doctor", "--redis", "redis://idemchannels:pw@"+srv.Addr(), "--wait-replicas", "1"); !strings.Contains(out, "OK    rights:") || strings.Contains(out, "replay cache") {
			t.Errorf("--wait-replicas (no replay cache): got %d\n%s\nwant the rights checked and no replay cache check", code, out)
		}
	})
	t.Run("durability options", func(t *testing.T) {
		t.Parallel()
		srv := redistest.Start(t, "--appendonly", "yes", "--maxmemory", "100mb")
		code, out, _ := runIdem(t, "doctor", "--redis", "redis://"+srv.Addr(), "--wait-replicas", "1")
		if code != 1 || !strings.Contains(out, "FAIL  replicas: 0 connected, fewer than the 1 that WAIT needs") {
			t.Errorf("--wait-replicas 1 without a replica: got %d\n%s\nwant 1 and a FAIL for the replicas", code, out)
		}
		info := srv.Do(t, "INFO", "server")
		code, out, _ = runIdem(t, "doctor", "--redis", "redis://"+srv.Addr(), "--wait-aof")
		if strings.Contains(info, "redis_version:7.0.") {
			if code != 1 || !strings.Contains(out, "has no WAITAOF (Redis 7.2 or later)") {
				t.Errorf("--wait-aof on Redis 7.0: got %d\n%s\nwant 1 and a FAIL for the version", code, out)
			}
		} else {
			// The probe's verdict on the servers it was checked against;
			// on another version either is accepted, and logged.
			waits := "WARN  waitaof: appendfsync everysec: WAITAOF waits for the next fsync"
			early := "acknowledges writes as fsynced before their fsync"
			switch {
			case strings.Contains(info, "redis_version:7.2.") && !strings.Contains(info, "valkey_version:"):
				if code != 0 || !strings.Contains(out, waits) {
					t.Errorf("--wait-aof on Redis 7.2: got %d\n%s\nwant 0 and %q", code, out, waits)
				}
				// Even with appendfsync always, WAITAOF waits for a cron
				// tick.
				tick := "WARN  waitaof: appendfsync always; WAITAOF on redis 7.2"
				srv.Do(t, "CONFIG", "SET", "appendfsync", "always")
				if code, out, _ := runIdem(t, "doctor", "--redis", "redis://"+srv.Addr(), "--wait-aof"); code != 0 || !strings.Contains(out, tick) {
					t.Errorf("--wait-aof on Redis 7.2 with appendfsync always: got %d\n%s\nwant 0 and %q", code, out, tick)
				}
				srv.Do(t, "CONFIG", "SET", "appendfsync", "everysec")
			case strings.Contains(info, "redis_version:7.4.0") || strings.Contains(info, "redis_version:7.4.1") || strings.Contains(info, "valkey_version:8.0."):
				if code != 1 || !strings.Contains(out, early) {
					t.Errorf("--wait-aof on a server whose WAITAOF does not wait for the fsync: got %d\n%s\nwant 1 and %q", code, out, early)
				}
			case !strings.Contains(out, waits) && !strings.Contains(out, early):
				t.Errorf("--wait-aof with appendfsync everysec: got %d\n%s\nwant a verdict on WAITAOF", code, out)
			default:
				t.Logf("--wait-aof on this server:\n%s", out)
			}
			// The store makes the same check: it refuses the server
			// exactly when doctor fails it.
			rdb := redis.NewClient(&redis.Options{Addr: srv.Addr()})
			defer rdb.Close()
			_, err := redisstore.New(rdb, redisstore.WithWaitAOF(1, 0, time.Second))
			var we *redisstore.WaitAOFError
			if refused, failed := errors.As(err, &we), strings.Contains(out, early); refused != failed {
				t.Errorf("--wait-aof: doctor says\n%s\nwhile WithWaitAOF got %v: want both to refuse the server, or neither", out, err)
			}
		}
	})
	t.Run("rdb only", func(t *testing.T) {
		t.Parallel()
		srv := redistest.Start(t, "--save", "900 1")
		code, out, _ := runIdem(t, "doctor", "--redis", "redis://"+srv.Addr())
		if code != 0 || !strings.Contains(out, "WARN  persistence: RDB snapshots only") {
			t.Errorf("got %d\n%s\nwant 0 and a WARN for RDB only", code, out)
		}
	})
	t.Run("unreachable", func(t *testing.T) {
		t.Parallel()
		code, out, _ := runIdem(t, "doctor", "--redis", "redis://"+freeAddr(t))
		if code != 1 || !strings.Contains(out, "FAIL  connect") {
			t.Errorf("got %d\n%s\nwant 1 and FAIL connect", code, out)
		}
	})
	t.Run("embedded", func(t *testing.T) {
		t.Parallel()
		dir := t.TempDir()
		code, out, _ := runIdem(t, "doctor", "--data", dir)
		if code != 0 || !strings.Contains(out, "WARN  embedded store") {
			t.Errorf("no file yet: got %d\n%s", code, out)
		}
		up := newUpstream(t)
		p := startProxy(t, up.url(), []string{"--data", dir})
		code, out, _ = runIdem(t, "doctor", "--data", dir)
		if code != 0 || !strings.Contains(out, "in use by a running proxy") {
			t.Errorf("proxy running: got %d\n%s", code, out)
		}
		p.terminate()
		p.wait()
		code, out, _ = runIdem(t, "doctor", "--data", dir)
		if code != 0 || !strings.Contains(out, "OK    embedded store") || !strings.Contains(out, "opens") {
			t.Errorf("proxy stopped: got %d\n%s", code, out)
		}
	})
}

// TestCluster runs doctor, the proxy and ls on a Redis Cluster.
func TestCluster(t *testing.T) {
	t.Parallel()
	c := redistest.StartCluster(t, 3, "--appendonly", "yes")
	storeArgs := []string{"--redis-cluster", strings.Join(c.Addrs(), ",")}
	code, out, stderr := runIdem(t, append([]string{"doctor"}, storeArgs...)...)
	if code != 0 || !strings.Contains(out, "OK    cluster: state ok, all 16384 slots assigned") || strings.Count(out, "maxmemory-policy: noeviction") != 3 {
		t.Errorf("doctor: got %d\n%s%s\nwant 0, the slots OK and every primary checked", code, out, stderr)
	}
	up := newUpstream(t)
	p := startProxy(t, up.url(), storeArgs)
	for i := range 10 {
		key := string(rune('a' + i))
		post(t, p.url("/payments"), key, "x")
		if res := post(t, p.url("/payments"), key, "x"); !res.replayed() || up.executions(key) != 1 {
			t.Errorf("key %s: got %d replayed=%v after %d executions, want a replay after 1", key, res.status, res.replayed(), up.executions(key))
		}
	}
	code, out, _ = runIdem(t, append([]string{"ls"}, storeArgs...)...)
	if code != 0 || strings.Count(out, "COMPLETED") != 10 {
		t.Errorf("ls: got %d\n%s\nwant the 10 records of the 3 primaries", code, out)
	}
}

// TestReplayCacheRightsAgree: doctor and the proxy agree on the replay
// cache's rights. A user whose channels are idem's alone gets doctor's
// WARN, and the proxy logs that the cache falls back; once the ACL fix that
// doctor names is applied, doctor has no WARN and the proxy's tracking
// connection subscribes.
func TestReplayCacheRightsAgree(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t, "--appendonly", "yes", "--maxmemory", "100mb")
	srv.Do(t, "ACL", "SETUSER", "app", "on", ">pw", "~idem:*", "resetchannels", "&idem:*", "+@all")
	storeArgs := []string{"--redis", "redis://app:pw@" + srv.Addr()}
	up := newUpstream(t)

	code, out, _ := runIdem(t, append([]string{"doctor"}, storeArgs...)...)
	if code != 0 || strings.Count(out, "WARN ") != 1 || !strings.Contains(out, "WARN  replay cache:") {
		t.Errorf("doctor: got %d\n%s\nwant 0 and one WARN, for the replay cache", code, out)
	}
	p := startProxy(t, up.url(), storeArgs)
	waitLog(t, p, "replay cache: tracking connection failed")
	p.terminate()
	p.wait()

	srv.Do(t, "ACL", "SETUSER", "app", "&__redis__:invalidate")
	code, out, _ = runIdem(t, append([]string{"doctor"}, storeArgs...)...)
	if code != 0 || strings.Contains(out, "WARN ") {
		t.Errorf("doctor after the fix: got %d\n%s\nwant 0 and no WARN", code, out)
	}
	p = startProxy(t, up.url(), storeArgs)
	deadline := time.Now().Add(readyTimeout)
	for !strings.Contains(srv.Do(t, "CLIENT", "LIST"), "name=idem-tracking") || !regexp.MustCompile(`name=idem-tracking .*sub=1`).MatchString(srv.Do(t, "CLIENT", "LIST")) {
		if time.Now().After(deadline) {
			t.Fatalf("no subscribed idem-tracking connection after %v:\n%s", readyTimeout, srv.Do(t, "CLIENT", "LIST"))
		}
		time.Sleep(20 * time.Millisecond) // poll CLIENT LIST until the tracking connection subscribed
	}
	p.terminate()
	p.wait()
	if logs := p.stderr.String(); strings.Contains(logs, "level=WARN") {
		t.Errorf("proxy after the fix: got log\n%s\nwant no warning", logs)
	}
}

// waitLog waits until the process's stderr holds want.
func waitLog(t *testing.T, p *proc, want string) {
	t.Helper()
	deadline := time.Now().Add(readyTimeout)
	for !strings.Contains(p.stderr.String(), want) {
		if time.Now().After(deadline) {
			t.Fatalf("no %q in the log after %v:\n%s", want, readyTimeout, p.stderr.String())
		}
		time.Sleep(20 * time.Millisecond) // poll the log until the line is there
	}
}
