package redisstore_test

import (
	"context"
	"errors"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/idemgo/idem"
	"github.com/idemgo/idem/redisstore"
	"github.com/idemgo/idem/storekit"
	"github.com/idemgo/idem/testkit/redistest"
	"github.com/redis/go-redis/v9"
)

// checkInterval is the interval of WithServerCheck in the tests.
const checkInterval = 20 * time.Millisecond

// waitTimeout bounds the waits for a check's finding.
const waitTimeout = 30 * time.Second

// lockedBuffer is a log sink safe for concurrent use.
type lockedBuffer struct {
	mu sync.Mutex
	b  strings.Builder
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// checkedStore builds a store with WithServerCheck on a new client of
// kind ("go-redis", "rueidis" or "valkey", on addrs; a Cluster client when cluster
// is set), and returns it with its log.
func checkedStore(t *testing.T, kind string, addrs []string, cluster bool, opts ...redisstore.Option) (*redisstore.Store, *lockedBuffer) {
	t.Helper()
	log := &lockedBuffer{}
	opts = append([]redisstore.Option{redisstore.WithLogger(slog.New(slog.NewTextHandler(log, nil)))}, opts...)
	var st *redisstore.Store
	var err error
	switch {
	case kind != "go-redis":
		rc, ok := ruClientNamed(kind)
		if !ok {
			t.Fatalf("no client %q", kind)
		}
		st, err = rc.store(t, ruOptions{addrs: addrs}, opts...)
	case cluster:
		c := redis.NewClusterClient(&redis.ClusterOptions{Addrs: addrs})
		t.Cleanup(func() { c.Close() })
		st, err = redisstore.New(c, opts...)
	default:
		// No retries: a call fails as soon as the server is gone.
		c := redis.NewClient(&redis.Options{Addr: addrs[0], MaxRetries: -1})
		t.Cleanup(func() { c.Close() })
		st, err = redisstore.New(c, opts...)
	}
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	return st, log
}

// waitHealth waits until cond holds for the store's Health.
func waitHealth(t *testing.T, st *redisstore.Store, what string, cond func(error) bool) {
	t.Helper()
	deadline := time.Now().Add(waitTimeout)
	for !cond(st.Health()) {
		if time.Now().After(deadline) {
			t.Fatalf("%s: Health is %v after %v", what, st.Health(), waitTimeout)
		}
		time.Sleep(checkInterval) // poll the finding of the background check
	}
}

// evicting returns the condition "Health is an *EvictionError for addr
// with policy".
func evicting(addr, policy string) func(error) bool {
	return func(err error) bool {
		var ee *redisstore.EvictionError
		return errors.As(err, &ee) && ee.Addr == addr && ee.Policy == policy
	}
}

func healthy(err error) bool { return err == nil }

// waitChecks waits until n more checks than before reached the server.
func waitChecks(t *testing.T, st *redisstore.Store, n int64) {
	t.Helper()
	want := redisstore.ServerChecks(st) + n
	deadline := time.Now().Add(waitTimeout)
	for redisstore.ServerChecks(st) < want {
		if time.Now().After(deadline) {
			t.Fatalf("%d checks after %v, want %d", redisstore.ServerChecks(st), waitTimeout, want)
		}
		time.Sleep(checkInterval) // poll the count of the background checks
	}
}

// TestServerCheckEviction: CONFIG SET maxmemory-policy allkeys-lru on a
// running server is found by the next check (Health, an error logged that
// names the fix), and setting it back clears it; WithAllowEviction still
// accepts it.
func TestServerCheckEviction(t *testing.T) {
	t.Parallel()
	for _, kind := range []string{"go-redis", "rueidis", "valkey"} {
		t.Run(kind, func(t *testing.T) {
			t.Parallel()
			srv := redistest.Start(t)
			st, log := checkedStore(t, kind, []string{srv.Addr()}, false, redisstore.WithServerCheck(checkInterval))
			allowing, _ := checkedStore(t, kind, []string{srv.Addr()}, false, redisstore.WithServerCheck(checkInterval), redisstore.WithAllowEviction())
			waitChecks(t, st, 1)
			if err := st.Health(); err != nil {
				t.Fatalf("Health on noeviction: got %v, want nil", err)
			}

			srv.Do(t, "CONFIG", "SET", "maxmemory-policy", "allkeys-lru")
			waitHealth(t, st, "after CONFIG SET maxmemory-policy allkeys-lru", evicting(srv.Addr(), "allkeys-lru"))
			if l := log.String(); !strings.Contains(l, "level=ERROR") || !strings.Contains(l, "CONFIG SET maxmemory-policy noeviction") {
				t.Errorf("log:\n%s\nwant an error that names the fix", l)
			}
			// The store keeps serving meanwhile.
			if _, err := st.Get(t.Context(), idem.Key{ID: "k"}.Digest()); !errors.Is(err, storekit.ErrNotFound) {
				t.Errorf("Get while evicting: got %v, want ErrNotFound", err)
			}
			waitChecks(t, allowing, 2)
			if err := allowing.Health(); err != nil {
				t.Errorf("Health with WithAllowEviction: got %v, want nil", err)
			}

			srv.Do(t, "CONFIG", "SET", "maxmemory-policy", "noeviction")
			waitHealth(t, st, "after CONFIG SET maxmemory-policy noeviction", healthy)
			if l := log.String(); !strings.Contains(l, "fit for idempotency records again") {
				t.Errorf("log:\n%s\nwant a line that the server is fit again", l)
			}
		})
	}
}

// TestServerCheckAfterRestart: a server that comes back from a restart
// with an evicting policy (its configuration file says so) is checked as
// soon as it answers again after a call found it gone, long before the
// interval.
func TestServerCheckAfterRestart(t *testing.T) {
	t.Parallel()
	for _, kind := range []string{"go-redis", "rueidis", "valkey"} {
		t.Run(kind, func(t *testing.T) {
			t.Parallel()
			srv := redistest.Start(t, "--maxmemory-policy", "allkeys-lru")
			srv.Do(t, "CONFIG", "SET", "maxmemory-policy", "noeviction")
			st, _ := checkedStore(t, kind, []string{srv.Addr()}, false, redisstore.WithServerCheck(time.Hour))
			srv.Kill(t)
			deadline := time.Now().Add(waitTimeout)
			for {
				ctx, cancel := context.WithTimeout(t.Context(), time.Second)
				_, err := st.Get(ctx, idem.Key{ID: "k"}.Digest())
				cancel()
				if err != nil && !errors.Is(err, storekit.ErrNotFound) {
					break // the call found the server gone
				}
				if time.Now().After(deadline) {
					t.Fatalf("Get still answers %v after the server was killed", err)
				}
			}
			srv.Restart(t) // with --maxmemory-policy allkeys-lru
			waitHealth(t, st, "after the restart", evicting(srv.Addr(), "allkeys-lru"))
		})
	}
}

// TestServerCheckCluster: the checks cover every primary of a Cluster.
func TestServerCheckCluster(t *testing.T) {
	t.Parallel()
	c := redistest.StartCluster(t, 3)
	target := c.Masters()[1]
	for _, kind := range []string{"go-redis", "rueidis", "valkey"} {
		st, _ := checkedStore(t, kind, c.Addrs(), true, redisstore.WithServerCheck(checkInterval))
		waitChecks(t, st, 1)
		if err := st.Health(); err != nil {
			t.Fatalf("%s: Health: got %v, want nil", kind, err)
		}
		target.Do(t, "CONFIG", "SET", "maxmemory-policy", "volatile-lru")
		waitHealth(t, st, kind+": after CONFIG SET on one primary", evicting(target.Addr(), "volatile-lru"))
		target.Do(t, "CONFIG", "SET", "maxmemory-policy", "noeviction")
		waitHealth(t, st, kind+": after setting it back", healthy)
	}
}

// TestServerCheckSentinel: behind Sentinels the checks follow the primary:
// a replica that evicts is no concern until a failover promotes it.
func TestServerCheckSentinel(t *testing.T) {
	t.Parallel()
	s := redistest.StartSentinel(t, 1)
	replica := s.Data()[1]
	replica.Do(t, "CONFIG", "SET", "maxmemory-policy", "allkeys-lru")
	stores := make(map[string]*redisstore.Store)
	for name, newStore := range sentinelClients(s) {
		st := newStore(t, redisstore.WithServerCheck(checkInterval))
		t.Cleanup(func() { st.Close() })
		waitChecks(t, st, 2)
		if err := st.Health(); err != nil {
			t.Fatalf("%s: Health before the failover: got %v, want nil (the replica is not checked)", name, err)
		}
		stores[name] = st
	}
	old := s.Primary()
	old.Kill(t)
	s.WaitFailover(t, old)
	for name, st := range stores {
		waitHealth(t, st, name+": after the failover", func(err error) bool {
			var ee *redisstore.EvictionError
			return errors.As(err, &ee) && ee.Policy == "allkeys-lru"
		})
	}
}
