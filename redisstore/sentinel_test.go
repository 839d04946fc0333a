package redisstore_test

import (
	"bytes"
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/idemgo/idem"
	"github.com/idemgo/idem/redisstore"
	"github.com/idemgo/idem/storekit"
	"github.com/idemgo/idem/storetest"
	"github.com/idemgo/idem/testkit/redistest"
	"github.com/redis/go-redis/v9"
)

// sentinelClients returns, per client library, a function that builds a
// store with opts on a new Sentinel client of s (go-redis's failover client,
// rueidis's Sentinel option).
func sentinelClients(s *redistest.Sentinel) map[string]func(t *testing.T, opts ...redisstore.Option) *redisstore.Store {
	out := map[string]func(t *testing.T, opts ...redisstore.Option) *redisstore.Store{
		"go-redis": func(t *testing.T, opts ...redisstore.Option) *redisstore.Store {
			c := redis.NewFailoverClient(&redis.FailoverOptions{MasterName: s.MasterName, SentinelAddrs: s.SentinelAddrs()})
			t.Cleanup(func() { c.Close() })
			st, err := redisstore.New(c, opts...)
			if err != nil {
				t.Fatal(err)
			}
			return st
		},
	}
	for _, rc := range ruClients {
		out[rc.name] = func(t *testing.T, opts ...redisstore.Option) *redisstore.Store {
			return rc.mustStore(t, ruOptions{addrs: s.SentinelAddrs(), master: s.MasterName}, opts...)
		}
	}
	return out
}

// TestSentinelConformance runs the conformance suite through both client
// libraries' Sentinel clients, on a primary with two replicas watched by
// three Sentinels.
func TestSentinelConformance(t *testing.T) {
	t.Parallel()
	s := redistest.StartSentinel(t, 2)
	for name, newStore := range sentinelClients(s) {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			st := newStore(t)
			storetest.Run(t, func(*testing.T) storekit.Store { return st })
		})
	}
}

// TestSentinelFailover kills the primary (SIGKILL) after a completion that
// both replicas acknowledged (WithWait(2, …)), and checks, through each
// client library, that the store follows the Sentinels to the promoted
// replica: the completion is there, and new keys can be acquired. With one
// replica left, WithWait(2, …) reports ErrNotDurable on the new primary.
func TestSentinelFailover(t *testing.T) {
	t.Parallel()
	s := redistest.StartSentinel(t, 2)
	clients := sentinelClients(s)
	type pair struct{ durable, plain *redisstore.Store }
	stores := make(map[string]pair)
	req := storekit.AcquireRequest{Fingerprint: "fp", Owner: "o", Lease: time.Minute, Retention: time.Hour}
	for name, newStore := range clients {
		p := pair{durable: newStore(t, redisstore.WithWait(2, 2*time.Second)), plain: newStore(t)}
		stores[name] = p
		key := idem.Key{Scope: "sentinel", ID: name}.Digest()
		a, err := p.durable.Acquire(t.Context(), key, req)
		if err != nil || a.Outcome != storekit.Acquired {
			t.Fatalf("%s: Acquire: got %v, %v", name, a.Outcome, err)
		}
		if err := p.durable.Complete(t.Context(), key, a.Lease, []byte("done "+name), time.Hour); err != nil {
			t.Fatalf("%s: Complete: %v", name, err)
		}
	}

	old := s.Primary()
	old.Kill(t)
	s.WaitFailover(t, old)

	for name, p := range stores {
		key := idem.Key{Scope: "sentinel", ID: name}.Digest()
		// The clients find the new primary by themselves; until they do,
		// calls fail.
		var rec storekit.Record
		var err error
		deadline := time.Now().Add(30 * time.Second)
		for {
			ctx, cancel := context.WithTimeout(t.Context(), time.Second)
			rec, err = p.plain.Get(ctx, key)
			cancel()
			if err == nil || time.Now().After(deadline) {
				break
			}
			time.Sleep(50 * time.Millisecond) // poll until the client follows the failover
		}
		if err != nil {
			t.Fatalf("%s: Get after the failover: %v", name, err)
		}
		if rec.State != storekit.StateCompleted || !bytes.Equal(rec.Result, []byte("done "+name)) {
			t.Errorf("%s: record after the failover: got %v %q, want COMPLETED with its result", name, rec.State, rec.Result)
		}
		fresh := idem.Key{Scope: "sentinel", ID: name + " after"}.Digest()
		if a, err := p.plain.Acquire(t.Context(), fresh, req); err != nil || a.Outcome != storekit.Acquired {
			t.Errorf("%s: Acquire on the new primary: got %v, %v", name, a.Outcome, err)
		}
		other := idem.Key{Scope: "sentinel", ID: name + " durable"}.Digest()
		if a, err := p.durable.Acquire(t.Context(), other, req); !errors.Is(err, idem.ErrNotDurable) || a.Outcome != storekit.Acquired {
			t.Errorf("%s: Acquire with WithWait(2) and one replica left: got %v, %v, want Acquired and ErrNotDurable", name, a.Outcome, err)
		}
	}
}

// TestSentinelReplayCacheFollowsFailover: a record served from the replay
// cache of a store on a go-redis failover client, then a failover that
// leaves the old primary running (SENTINEL FAILOVER: the Sentinels demote
// it only some seconds later), then the record deleted on the new primary:
// once the client talks to the new primary, no acquire replays the record.
// Before, the tracking connection stayed on the old primary, which never
// saw the delete, and the cache served the record until the Sentinels
// demoted it (about 7 s). A rueidis client with its client-side cache is
// checked the same way.
func TestSentinelReplayCacheFollowsFailover(t *testing.T) {
	t.Parallel()
	for _, name := range []string{"go-redis", "rueidis", "valkey"} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			s := redistest.StartSentinel(t, 1)
			var st *redisstore.Store
			var get func(ctx context.Context, key string) (string, error)
			if name == "go-redis" {
				c := redis.NewFailoverClient(&redis.FailoverOptions{MasterName: s.MasterName, SentinelAddrs: s.SentinelAddrs(), MaxRetries: -1})
				t.Cleanup(func() { c.Close() })
				st = newStore(t, c)
				get = func(ctx context.Context, key string) (string, error) { return c.Get(ctx, key).Result() }
			} else {
				rc, _ := ruClientNamed(name)
				var err error
				if st, get, err = rc.open(t, ruOptions{addrs: s.SentinelAddrs(), master: s.MasterName, cache: true}); err != nil {
					t.Fatal(err)
				}
			}
			key := idem.Key{Scope: "sentinel-cache", ID: name}.Digest()
			completeAndCache(t, st, key, "fp", time.Hour)

			old := s.Primary()
			if _, err := s.Sentinels()[0].Command("SENTINEL", "FAILOVER", s.MasterName); err != nil {
				t.Fatal(err)
			}
			next := s.WaitFailover(t, old)
			// Until the client reads what only the new primary has, it
			// still talks to the old one, where the record is.
			marker := "marker-" + name
			if _, err := next.Command("SET", marker, "new primary"); err != nil {
				t.Fatal(err)
			}
			deadline := time.Now().Add(30 * time.Second)
			for {
				ctx, cancel := context.WithTimeout(t.Context(), time.Second)
				v, _ := get(ctx, marker)
				cancel()
				if v == "new primary" {
					break
				}
				if time.Now().After(deadline) {
					t.Fatal("the client never read from the new primary")
				}
				time.Sleep(20 * time.Millisecond) // poll until the client follows the failover
			}
			if _, err := next.Command("DEL", st.Key(key)); err != nil {
				t.Fatal(err)
			}
			if role, _ := old.Command("ROLE"); !strings.HasPrefix(role, "master") {
				t.Logf("the old primary was already demoted (%q): the check below shows less", role)
			}
			replays := 0
			for range 100 {
				a, err := st.Acquire(t.Context(), key, storekit.AcquireRequest{Fingerprint: "fp", Owner: "o", Lease: time.Minute, Retention: time.Hour})
				if err != nil {
					t.Fatal(err)
				}
				if a.Outcome == storekit.Replay {
					replays++
				}
			}
			if replays > 0 {
				t.Errorf("%d of 100 acquires after the failover replayed a record deleted on the new primary, want 0", replays)
			}
		})
	}
}
