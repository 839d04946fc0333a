package redisstore_test

import (
	"bytes"
	"context"
	"errors"
	"testing"
	"time"

	"github.com/idemgo/idem"
	"github.com/idemgo/idem/internal/redistest"
	"github.com/idemgo/idem/redisstore"
	"github.com/idemgo/idem/storetest"
	"github.com/redis/go-redis/v9"
	"github.com/redis/rueidis"
)

// sentinelClients returns, per client library, a function that builds a
// store with opts on a new Sentinel client of s (go-redis's failover client,
// rueidis's Sentinel option).
func sentinelClients(s *redistest.Sentinel) map[string]func(t *testing.T, opts ...redisstore.Option) *redisstore.Store {
	return map[string]func(t *testing.T, opts ...redisstore.Option) *redisstore.Store{
		"go-redis": func(t *testing.T, opts ...redisstore.Option) *redisstore.Store {
			c := redis.NewFailoverClient(&redis.FailoverOptions{MasterName: s.MasterName, SentinelAddrs: s.SentinelAddrs()})
			t.Cleanup(func() { c.Close() })
			st, err := redisstore.New(c, opts...)
			if err != nil {
				t.Fatal(err)
			}
			return st
		},
		"rueidis": func(t *testing.T, opts ...redisstore.Option) *redisstore.Store {
			c, err := rueidis.NewClient(rueidis.ClientOption{
				InitAddress: s.SentinelAddrs(), Sentinel: rueidis.SentinelOption{MasterSet: s.MasterName}, DisableCache: true,
			})
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(c.Close)
			st, err := redisstore.NewRueidis(c, opts...)
			if err != nil {
				t.Fatal(err)
			}
			return st
		},
	}
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
			storetest.Run(t, func(*testing.T) idem.Store { return st })
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
	req := idem.AcquireRequest{Fingerprint: "fp", Owner: "o", Lease: time.Minute, Retention: time.Hour}
	for name, newStore := range clients {
		p := pair{durable: newStore(t, redisstore.WithWait(2, 2*time.Second)), plain: newStore(t)}
		stores[name] = p
		key := idem.Key{Scope: "sentinel", ID: name}.Digest()
		a, err := p.durable.Acquire(t.Context(), key, req)
		if err != nil || a.Outcome != idem.Acquired {
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
		var rec idem.Record
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
		if rec.State != idem.StateCompleted || !bytes.Equal(rec.Result, []byte("done "+name)) {
			t.Errorf("%s: record after the failover: got %v %q, want COMPLETED with its result", name, rec.State, rec.Result)
		}
		fresh := idem.Key{Scope: "sentinel", ID: name + " after"}.Digest()
		if a, err := p.plain.Acquire(t.Context(), fresh, req); err != nil || a.Outcome != idem.Acquired {
			t.Errorf("%s: Acquire on the new primary: got %v, %v", name, a.Outcome, err)
		}
		other := idem.Key{Scope: "sentinel", ID: name + " durable"}.Digest()
		if a, err := p.durable.Acquire(t.Context(), other, req); !errors.Is(err, idem.ErrNotDurable) || a.Outcome != idem.Acquired {
			t.Errorf("%s: Acquire with WithWait(2) and one replica left: got %v, %v, want Acquired and ErrNotDurable", name, a.Outcome, err)
		}
	}
}
