package redisstore_test

import (
	"bytes"
	"context"
	"errors"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/idemgo/idem/redisstore"
	"github.com/idemgo/idem/testkit/redistest"
	"github.com/redis/go-redis/v9"
)

// evictingPolicies are every maxmemory-policy but noeviction: all of them
// can evict idem's records, which carry a time to live.
var evictingPolicies = []string{"allkeys-lru", "allkeys-lfu", "allkeys-random", "volatile-lru", "volatile-lfu", "volatile-random", "volatile-ttl"}

// newStoreFunc builds a store on a fresh client of one kind and returns
// New's error.
type newStoreFunc func(t *testing.T, opts ...redisstore.Option) error

// startCheckClients returns a constructor per client kind for the servers
// at addrs (a Cluster when cluster is set), with auth as the user and
// password (none when empty).
func startCheckClients(addrs []string, cluster bool, user, password string) map[string]newStoreFunc {
	out := map[string]newStoreFunc{}
	for _, rc := range ruClients {
		name := rc.name
		if cluster {
			name = "cluster/" + name
		}
		out[name] = func(t *testing.T, opts ...redisstore.Option) error {
			_, err := rc.store(t, ruOptions{addrs: addrs, user: user, password: password}, opts...)
			return err
		}
	}
	if cluster {
		out["cluster/go-redis"] = func(t *testing.T, opts ...redisstore.Option) error {
			c := redis.NewClusterClient(&redis.ClusterOptions{Addrs: addrs, Username: user, Password: password})
			t.Cleanup(func() { c.Close() })
			_, err := redisstore.New(c, opts...)
			return err
		}
		return out
	}
	out["go-redis"] = func(t *testing.T, opts ...redisstore.Option) error {
		c := redis.NewClient(&redis.Options{Addr: addrs[0], Username: user, Password: password, MaxRetries: -1})
		t.Cleanup(func() { c.Close() })
		_, err := redisstore.New(c, opts...)
		return err
	}
	return out
}

// TestStartCheckEviction checks that New and NewRueidis refuse a server
// with any maxmemory-policy but noeviction with an *EvictionError that
// names the policy and the fix, and accept it with WithAllowEviction.
func TestStartCheckEviction(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t)
	for name, newStore := range startCheckClients([]string{srv.Addr()}, false, "", "") {
		t.Run(name, func(t *testing.T) {
			srv.Do(t, "CONFIG", "SET", "maxmemory-policy", "noeviction")
			if err := newStore(t); err != nil {
				t.Fatalf("noeviction: got %v, want the store", err)
			}
			for _, policy := range evictingPolicies {
				srv.Do(t, "CONFIG", "SET", "maxmemory-policy", policy)
				err := newStore(t)
				var ee *redisstore.EvictionError
				if !errors.As(err, &ee) || ee.Policy != policy || ee.Addr != srv.Addr() {
					t.Errorf("%s: got %v, want an *EvictionError for %s on %s", policy, err, policy, srv.Addr())
					continue
				}
				if msg := err.Error(); strings.Contains(msg, "\n") || !strings.Contains(msg, "set maxmemory-policy noeviction") || !strings.Contains(msg, "WithAllowEviction") {
					t.Errorf("%s: got message %q, want one line naming the fix and the override", policy, msg)
				}
				if err := newStore(t, redisstore.WithAllowEviction()); err != nil {
					t.Errorf("%s with WithAllowEviction: got %v, want the store", policy, err)
				}
			}
		})
	}
}

// TestStartCheckEvictionCluster checks that the policy of every node of a
// Cluster is checked: one evicting primary is enough to refuse it.
func TestStartCheckEvictionCluster(t *testing.T) {
	t.Parallel()
	c := redistest.StartCluster(t, 3)
	for name, newStore := range startCheckClients(c.Addrs(), true, "", "") {
		if err := newStore(t); err != nil {
			t.Fatalf("%s, noeviction: got %v, want the store", name, err)
		}
	}
	evicting := c.Nodes()[1]
	evicting.Do(t, "CONFIG", "SET", "maxmemory-policy", "volatile-lru")
	for name, newStore := range startCheckClients(c.Addrs(), true, "", "") {
		err := newStore(t)
		var ee *redisstore.EvictionError
		if !errors.As(err, &ee) || ee.Policy != "volatile-lru" || ee.Addr != evicting.Addr() {
			t.Errorf("%s: got %v, want an *EvictionError for volatile-lru on %s", name, err, evicting.Addr())
		}
		if err := newStore(t, redisstore.WithAllowEviction()); err != nil {
			t.Errorf("%s with WithAllowEviction: got %v, want the store", name, err)
		}
	}
}

// TestStartCheckDenied checks that a user who may not run INFO nor CONFIG
// (as on managed services) gets the store, with one warning logged; and
// that where only INFO is refused, the policy is read with CONFIG GET.
func TestStartCheckDenied(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t, "--maxmemory-policy", "allkeys-lru")
	srv.Do(t, "ACL", "SETUSER", "noinfo", "on", ">pw", "~*", "&*", "+@all", "-info", "-config")
	srv.Do(t, "ACL", "SETUSER", "noinfo-config", "on", ">pw", "~*", "&*", "+@all", "-info")
	for name, newStore := range startCheckClients([]string{srv.Addr()}, false, "noinfo", "pw") {
		var logs bytes.Buffer
		if err := newStore(t, redisstore.WithLogger(slog.New(slog.NewTextHandler(&logs, nil)))); err != nil {
			t.Fatalf("%s, INFO and CONFIG refused: got %v, want the store", name, err)
		}
		if got := strings.Count(logs.String(), "level=WARN"); got != 1 || !strings.Contains(logs.String(), "maxmemory-policy") {
			t.Errorf("%s: got log\n%s\nwant one warning that the policy could not be checked", name, logs.String())
		}
	}
	for name, newStore := range startCheckClients([]string{srv.Addr()}, false, "noinfo-config", "pw") {
		var ee *redisstore.EvictionError
		if err := newStore(t); !errors.As(err, &ee) || ee.Policy != "allkeys-lru" {
			t.Errorf("%s, INFO refused, CONFIG GET allowed: got %v, want an *EvictionError for allkeys-lru", name, err)
		}
	}
}

// TestStartCheckUnreachable checks that New reports a server it cannot
// reach, instead of building a store that fails every call.
func TestStartCheckUnreachable(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t)
	srv.Kill(t)
	c := redis.NewClient(&redis.Options{Addr: srv.Addr(), MaxRetries: -1})
	t.Cleanup(func() { c.Close() })
	if _, err := redisstore.New(c); err == nil || !strings.Contains(err.Error(), "cannot check "+srv.Addr()) {
		t.Errorf("unreachable server: got %v, want an error naming it", err)
	}
}

// TestStartCheckVersion checks the version rule on servers that report
// the versions given (the tests' own redis-server is 7.0, accepted by every
// other test): older than 7.0 is refused, Valkey and Redis 8 accepted, and
// WithWaitAOF needs 7.2.
func TestStartCheckVersion(t *testing.T) {
	ctx, cancel := context.WithTimeout(t.Context(), time.Second)
	defer cancel()
	info := func(v string) string {
		return "# Server\r\nredis_version:" + v + "\r\n\r\n# Memory\r\nmaxmemory_policy:noeviction\r\n"
	}
	for _, tc := range []struct {
		info string
		aof  bool
		need string // "" when accepted
	}{
		{info("6.2.14"), false, "7.0"},
		{info("6.0.20"), false, "7.0"},
		{info("7.0.15"), false, ""},
		{info("7.0.15"), true, "7.2"},
		{info("7.2.4") + "valkey_version:8.0.1\r\n", true, ""},
		{info("8.0.0"), true, ""},
		{info("255.255.255"), false, ""},
	} {
		var opts []redisstore.Option
		if tc.aof {
			opts = append(opts, redisstore.WithWaitAOF(1, 0, time.Second))
		}
		err := redisstore.CheckServer(ctx, []redisstore.FakeNode{{Addr: "a:1", Info: tc.info}}, opts...)
		var ve *redisstore.VersionError
		switch {
		case tc.need == "" && err != nil:
			t.Errorf("%q aof=%v: got %v, want it accepted", tc.info, tc.aof, err)
		case tc.need != "" && (!errors.As(err, &ve) || ve.Need != tc.need):
			t.Errorf("%q aof=%v: got %v, want a *VersionError needing %s", tc.info, tc.aof, err, tc.need)
		}
	}
}

// TestStartCheckWaitAOF checks that WithWaitAOF is refused on a server
// whose WAITAOF counts writes as fsynced before they are, when it runs
// appendfsync everysec: with a *WaitAOFError naming the server, from the
// version of a release known to, and from a watched write on any other
// that may (Redis 8.0-M01 reports 7.9.224, unstable builds 255.255.255).
// The same server is accepted under appendfsync always, without
// WithWaitAOF, and where CONFIG GET does not answer (a warning, as for the
// other checks); Redis 7.2 (no write watched), a release whose watched
// write waits and a replica (not watched) are accepted. (On a real server:
// TestWaitAOFUnsupported, with such a server on PATH.)
func TestStartCheckWaitAOF(t *testing.T) {
	ctx, cancel := context.WithTimeout(t.Context(), time.Second)
	defer cancel()
	info := func(v string) string {
		return "# Server\r\nredis_version:" + v + "\r\n\r\n# Memory\r\nmaxmemory_policy:noeviction\r\n"
	}
	everysec := map[string]string{"appendfsync": "everysec"}
	replica := "\r\n# Replication\r\nrole:slave\r\n"
	for _, tc := range []struct {
		info   string
		config map[string]string
		aof    bool
		early  bool   // a watched write is acknowledged at once
		server string // the refused server, "" when accepted
		probed bool   // a write was watched
	}{
		{info("7.4.1"), everysec, true, true, "redis 7.4.1", false},
		{info("7.4.0"), everysec, true, true, "redis 7.4.0", false},
		{info("7.2.4") + "valkey_version:8.0.1\r\n", everysec, true, true, "valkey 8.0.1", false},
		{info("7.2.4") + "valkey_version:8.0.0\r\n", everysec, true, true, "valkey 8.0.0", false},
		{info("7.9.224"), everysec, true, true, "redis 7.9.224", true},
		{info("255.255.255"), everysec, true, true, "redis 255.255.255", true},
		{info("7.9.224"), everysec, true, false, "", true},
		{info("7.9.224") + replica, everysec, true, true, "", false},
		{info("7.4.1"), map[string]string{"appendfsync": "always"}, true, true, "", false},
		{info("7.4.1"), everysec, false, true, "", false},
		{info("7.4.1"), nil, true, true, "", false},
		{info("7.2.6"), everysec, true, true, "", false},
		{info("7.2.4") + "valkey_version:7.2.7\r\n", everysec, true, true, "", false},
	} {
		var opts []redisstore.Option
		if tc.aof {
			opts = append(opts, redisstore.WithWaitAOF(1, 0, time.Second))
		}
		probes := 0
		err := redisstore.CheckServer(ctx, []redisstore.FakeNode{{Addr: "a:1", Info: tc.info, Config: tc.config, EarlyAOF: tc.early, Probes: &probes}}, opts...)
		var we *redisstore.WaitAOFError
		switch {
		case tc.server == "" && err != nil:
			t.Errorf("%q %v aof=%v: got %v, want it accepted", tc.info, tc.config, tc.aof, err)
		case tc.server != "" && (!errors.As(err, &we) || we.Server != tc.server || we.Addr != "a:1"):
			t.Errorf("%q %v aof=%v: got %v, want a *WaitAOFError for %s", tc.info, tc.config, tc.aof, err, tc.server)
		case (probes > 0) != tc.probed:
			t.Errorf("%q %v aof=%v: %d writes watched, want some: %v", tc.info, tc.config, tc.aof, probes, tc.probed)
		}
	}
}
