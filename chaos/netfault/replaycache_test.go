package netfault

import (
	"testing"
	"time"

	"github.com/idemgo/idem"
	"github.com/idemgo/idem/chaos/chaostest"
	"github.com/idemgo/idem/redisstore"
	"github.com/idemgo/idem/storekit"
	"github.com/idemgo/idem/testkit/redistest"
	"github.com/redis/go-redis/v9"
	"github.com/redis/rueidis"
)

// replyDelay delays every reply of the server in TestReplayCacheDelayedReplies.
const replyDelay = 300 * time.Millisecond

// TestReplayCacheDelayedReplies: with every reply of the server delayed by
// 300 ms (toxiproxy), a store's local replay cache never serves a record
// after it expired on the server. A record is completed with a short
// retention and acquired again and again; once a direct client (no proxy)
// sees the record gone, a replay of it is stale. The cache must have
// served replays before (a replay faster than the delay cannot have come
// from the server). rueidis dates its cache entries from the reply's
// arrival, so its entry outlived the record by the transit time until the
// store dated them from the send, as the go-redis store's own cache does.
func TestReplayCacheDelayedReplies(t *testing.T) {
	const retention = 2 * time.Second
	for _, c := range []struct {
		name  string
		store func(t *testing.T, addr string) *redisstore.Store
	}{
		{"rueidis", func(t *testing.T, addr string) *redisstore.Store {
			s, _ := chaostest.RueidisStore(t, rueidis.ClientOption{InitAddress: []string{addr}, ForceSingleClient: true})
			return s
		}},
		{"go-redis", func(t *testing.T, addr string) *redisstore.Store {
			return chaostest.GoRedisStore(t, redis.NewClient(&redis.Options{Addr: addr}))
		}},
	} {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			srv := redistest.Start(t)
			direct := srv.GoRedis(t)
			proxy := chaostest.StartNetProxy(t, srv.Addr())
			proxy.AddToxic(t, "latency", "downstream", map[string]any{"latency": replyDelay.Milliseconds()})
			s := c.store(t, proxy.Addr())
			ctx := t.Context()
			complete := func(key string, retention time.Duration) storekit.AcquireRequest {
				req := storekit.AcquireRequest{Fingerprint: "fp", Owner: "o", Lease: time.Second, Retention: retention}
				a, err := s.Acquire(ctx, key, req)
				if err != nil || a.Outcome != storekit.Acquired {
					t.Fatalf("Acquire: got %v, %v", a.Outcome, err)
				}
				if err := s.Complete(ctx, key, a.Lease, []byte("r"), retention); err != nil {
					t.Fatal(err)
				}
				return req
			}
			// Until a replay comes from the local cache: the go-redis
			// store's tracking connection takes a few delayed round
			// trips to set up.
			warm := idem.Key{Scope: "netfault", ID: "warm-" + c.name}.Digest()
			wreq := complete(warm, time.Hour)
			for deadline := time.Now().Add(30 * time.Second); ; {
				sent := time.Now()
				if r, err := s.Acquire(ctx, warm, wreq); err != nil || r.Outcome != storekit.Replay {
					t.Fatalf("Acquire of the warm-up key: got %v, %v, want a replay", r.Outcome, err)
				}
				if time.Since(sent) < replyDelay {
					break
				}
				if time.Now().After(deadline) {
					t.Fatal("no replay came from the local cache within 30s")
				}
			}
			key := idem.Key{Scope: "netfault", ID: "delayed-" + c.name}.Digest()
			req := complete(key, retention)
			var local, stale int
			var gone time.Time // when the direct client first saw the record gone
			var last time.Duration
			for deadline := time.Now().Add(2 * retention); time.Now().Before(deadline); {
				if gone.IsZero() {
					if n, err := direct.Exists(ctx, s.Key(key)).Result(); err != nil {
						t.Fatal(err)
					} else if n == 0 {
						gone = time.Now()
						deadline = gone.Add(3 * replyDelay)
					}
				}
				sent := time.Now()
				r, err := s.Acquire(ctx, key, req)
				if err != nil {
					t.Fatal(err)
				}
				switch {
				case r.Outcome != storekit.Replay:
				case !gone.IsZero():
					stale++
					last = time.Since(gone)
				case time.Since(sent) < replyDelay:
					local++
				}
			}
			if gone.IsZero() {
				t.Fatalf("the record was never seen gone within %v", 2*retention)
			}
			if local == 0 {
				t.Fatal("no replay was served from the local cache: the test shows nothing")
			}
			if stale > 0 {
				t.Errorf("%d replays of the record after it expired on the server, the last %v after, with replies delayed by %v; want none", stale, last.Round(time.Millisecond), replyDelay)
			}
			t.Logf("%s: %d replays from the local cache before the expiry, %d after", c.name, local, stale)
		})
	}
}
