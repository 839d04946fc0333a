package redisstore_test

import (
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/idemgo/idem/redisstore"
	"github.com/idemgo/idem/storekit"
	"github.com/idemgo/idem/testkit/redistest"
	"github.com/redis/go-redis/v9"
)

// The go-redis replay cache tracks only the keys it reads, on reader
// connections of its own redirected to its tracking connection (see
// internal/goredis/tracking.go). In RESP2 the server forgets, without a
// word, the keys a reader read once that reader's connection ends, and
// drops the invalidations of a reader whose redirect target is gone. The
// tests below end those connections and overwrite a cached key in one
// transaction, so that no invalidation can ever come: the store must drop
// the entry because it saw the connection end, not because the server told
// it of the write.

// clientIDs returns the ids of the server's connections named name.
func clientIDs(t *testing.T, srv *redistest.Server, name string) []string {
	t.Helper()
	list, err := srv.Command("CLIENT", "LIST")
	if err != nil {
		t.Fatal(err)
	}
	var ids []string
	for line := range strings.SplitSeq(list, "\n") {
		var id string
		named := false
		for f := range strings.FieldsSeq(line) {
			if v, ok := strings.CutPrefix(f, "id="); ok {
				id = v
			}
			if f == "name="+name {
				named = true
			}
		}
		if named && id != "" {
			ids = append(ids, id)
		}
	}
	return ids
}

// completedElsewhere completes key with result through a store without a
// cache, whose records the cached store s shares (same prefix).
func completedElsewhere(t *testing.T, srv *redistest.Server, key, result string) {
	t.Helper()
	plain := cachedGoRedisStore(t, srv.Addr(), redisstore.WithReplayCache(false))
	a, err := plain.Acquire(t.Context(), key, acquireReq("fp", time.Hour))
	if err != nil || a.Outcome != storekit.Acquired {
		t.Fatalf("acquire %s: got %v, %v, want Acquired", key, a.Outcome, err)
	}
	if err := plain.Complete(t.Context(), key, a.Lease, []byte(result), time.Hour); err != nil {
		t.Fatal(err)
	}
}

// noOldReplay acquires key until the store's cache noticed the end of a
// connection (its generation moved past gen), is confirmed and has read
// the key again, and fails if it served the old result once it noticed, or
// after staleBound (as noStaleAfterBreak: until the end of a connection
// arrives, a replay of the old record is what a read just before the write
// would have returned).
func noOldReplay(t *testing.T, s *redisstore.Store, gen uint64, key, old, now string, since time.Time) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for back := false; ; {
		g, ready, _ := redisstore.CacheState(s)
		noticed := g != gen
		a, err := s.Acquire(t.Context(), key, acquireReq("fp", time.Hour))
		if err != nil || a.Outcome != storekit.Replay {
			t.Fatalf("acquire: got %v, %v, want a replay", a.Outcome, err)
		}
		switch string(a.Result) {
		case old:
			if noticed {
				t.Fatalf("acquire %v after the overwrite, once the store noticed the connection's end: the old record's replay", time.Since(since))
			}
			if time.Since(since) > staleBound {
				t.Fatalf("the old record still replayed %v after the overwrite: the store missed the connection's end", time.Since(since))
			}
		case now:
		default:
			t.Fatalf("replayed %q, want %q or %q", a.Result, old, now)
		}
		if back {
			return
		}
		back = noticed && ready && string(a.Result) == now
		if time.Now().After(deadline) {
			t.Fatal("the cache did not come back")
		}
	}
}

// killCached reads a key into the cache of a go-redis store, then kills
// the server's connections named name (want of their count must hold)
// and, in the same transaction, replaces the key's record by another
// COMPLETED one: the store must not replay the old record once it noticed
// the kill (noOldReplay). It returns the store and another client.
func killCached(t *testing.T, name string, want func(n int) bool) (*redisstore.Store, *redis.Client) {
	t.Helper()
	srv := redistest.Start(t)
	s := cachedGoRedisStore(t, srv.Addr())
	other := goRedisClient(t, srv.Addr())
	completedElsewhere(t, srv, "new", "result-new")
	completeAndCache(t, s, "k", "fp", time.Hour)
	ids := clientIDs(t, srv, name)
	if !want(len(ids)) {
		t.Fatalf("%d connections named %s", len(ids), name)
	}
	gen, _, _ := redisstore.CacheState(s)
	ctx := t.Context()
	if _, err := other.TxPipelined(ctx, func(p redis.Pipeliner) error {
		for _, id := range ids {
			p.Do(ctx, "CLIENT", "KILL", "ID", id)
		}
		p.Copy(ctx, s.Key("new"), s.Key("k"), 0, true)
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	noOldReplay(t, s, gen, "k", "result-k", "result-new", time.Now())
	return s, other
}

// TestReplayCacheReaderKilled: the cache's reader connections are killed
// while idle, right after one of them read a key into the cache, and the
// key is overwritten: the store sees the readers' end as it happens (not at
// their next use, which a cache hit never makes) and serves the new record.
func TestReplayCacheReaderKilled(t *testing.T) {
	killCached(t, "idem-tracking-reader", func(n int) bool { return n > 0 })
}

// TestReplayCacheTrackingKilled: only the tracking connection is killed,
// and a cached key overwritten: the readers live on, but the server drops
// their invalidations (their redirect target is gone). The store drops
// every entry when the tracking connection ends, and the next tracking
// connection has readers of its own: a key cached then is invalidated by a
// later write, as the server's message arrives.
func TestReplayCacheTrackingKilled(t *testing.T) {
	s, other := killCached(t, "idem-tracking", func(n int) bool { return n == 1 })

	// Back, with a new tracking connection: a key read into the cache now
	// is invalidated by a write.
	completeAndCache(t, s, "k2", "fp", time.Hour)
	if err := other.Copy(t.Context(), s.Key("new"), s.Key("k2"), 0, true).Err(); err != nil {
		t.Fatal(err)
	}
	written := time.Now()
	for {
		a, err := s.Acquire(t.Context(), "k2", acquireReq("fp", time.Hour))
		if err != nil || a.Outcome != storekit.Replay {
			t.Fatalf("acquire: got %v, %v, want a replay", a.Outcome, err)
		}
		if string(a.Result) == "result-new" {
			return
		}
		if time.Since(written) > staleBound {
			t.Fatalf("the old record of k2 still replayed %v after the write: no invalidation reached the store", time.Since(written))
		}
	}
}

// TestReplayCacheTrackingRefused: a user that may not run CLIENT TRACKING
// (which the readers send) gets one warning, and every replay is read from
// the server: the cache is never confirmed, so nothing is served from it.
func TestReplayCacheTrackingRefused(t *testing.T) {
	srv := redistest.Start(t)
	srv.Do(t, "ACL", "SETUSER", "notracking", "on", ">pw", "~*", "&*", "+@all", "-client|tracking")
	c := redis.NewClient(&redis.Options{Addr: srv.Addr(), Username: "notracking", Password: "pw", MaxRetries: -1})
	t.Cleanup(func() { c.Close() })
	log := &lockedBuffer{}
	s, err := redisstore.New(c, redisstore.WithLogger(slog.New(slog.NewTextHandler(log, nil))))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	ctx := t.Context()
	a, err := s.Acquire(ctx, "k", acquireReq("fp", time.Hour))
	if err != nil || a.Outcome != storekit.Acquired {
		t.Fatalf("acquire: got %v, %v, want Acquired", a.Outcome, err)
	}
	if err := s.Complete(ctx, "k", a.Lease, []byte("result-k"), time.Hour); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the warning", func() bool { return strings.Contains(log.String(), "replays are read from the server") })
	if !strings.Contains(log.String(), "NOPERM") {
		t.Errorf("the warning does not name the refusal:\n%s", log.String())
	}
	before := redisstore.ReplayCacheHits()
	for range 20 {
		r, err := s.Acquire(ctx, "k", acquireReq("fp", time.Hour))
		if err != nil || r.Outcome != storekit.Replay || string(r.Result) != "result-k" {
			t.Fatalf("got %v %q, %v, want the replay", r.Outcome, r.Result, err)
		}
	}
	if n := redisstore.ReplayCacheHits() - before; n != 0 {
		t.Fatalf("%d replays served from the cache, want 0", n)
	}
	if _, ready, _ := redisstore.CacheState(s); ready {
		t.Fatal("the cache is confirmed without tracking")
	}
	if n := strings.Count(log.String(), "level=WARN"); n != 1 {
		t.Fatalf("%d warnings, want 1:\n%s", n, log.String())
	}
}
