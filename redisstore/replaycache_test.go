package redisstore_test

import (
	"context"
	"errors"
	"fmt"
	"runtime"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/idemgo/idem"
	"github.com/idemgo/idem/redisstore"
	"github.com/idemgo/idem/storekit"
	"github.com/idemgo/idem/testkit/redistest"
	"github.com/redis/go-redis/v9"
	"github.com/redis/rueidis"
)

// cachedRueidisStore returns a store on a rueidis client with its
// client-side cache on (the library's default), so that the replay cache
// serves replays locally.
func cachedRueidisStore(t *testing.T, addr string, opts ...redisstore.Option) *redisstore.Store {
	t.Helper()
	c, err := rueidis.NewClient(rueidis.ClientOption{InitAddress: []string{addr}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Close)
	s, err := redisstore.NewRueidis(c, opts...)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// cachedGoRedisStore returns a store on a go-redis client, whose replay
// cache is on by default, once its tracking connection is confirmed.
func cachedGoRedisStore(t *testing.T, addr string, opts ...redisstore.Option) *redisstore.Store {
	t.Helper()
	s, err := redisstore.New(goRedisClient(t, addr), opts...)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// cachedStores are the stores whose replay cache the tests check.
var cachedStores = []struct {
	name string
	new  func(t *testing.T, addr string, opts ...redisstore.Option) *redisstore.Store
}{{"rueidis", cachedRueidisStore}, {"valkey", cachedValkeyStore}, {"go-redis", cachedGoRedisStore}}

// cachedValkeyStore is cachedRueidisStore on a valkey-go client.
func cachedValkeyStore(t *testing.T, addr string, opts ...redisstore.Option) *redisstore.Store {
	t.Helper()
	rc, _ := ruClientNamed("valkey")
	return rc.mustStore(t, ruOptions{addrs: []string{addr}, cache: true}, opts...)
}

// eachCachedStore runs f with a store of each client on a server of its
// own.
func eachCachedStore(t *testing.T, f func(t *testing.T, srv *redistest.Server, s *redisstore.Store, newStore func(opts ...redisstore.Option) *redisstore.Store)) {
	for _, cs := range cachedStores {
		t.Run(cs.name, func(t *testing.T) {
			srv := redistest.Start(t)
			f(t, srv, cs.new(t, srv.Addr()), func(opts ...redisstore.Option) *redisstore.Store { return cs.new(t, srv.Addr(), opts...) })
		})
	}
}

func acquireReq(fp string, retention time.Duration) storekit.AcquireRequest {
	return storekit.AcquireRequest{Fingerprint: fp, Owner: "owner-" + fp, Lease: min(10*time.Second, retention), Retention: retention, MaxAttempts: 3}
}

// completeAndCache completes key with result and acquires it until an
// acquire is answered from the local cache.
func completeAndCache(t *testing.T, s *redisstore.Store, key, fp string, retention time.Duration) {
	t.Helper()
	ctx := t.Context()
	a, err := s.Acquire(ctx, key, acquireReq(fp, retention))
	if err != nil || a.Outcome != storekit.Acquired {
		t.Fatalf("acquire: got %v, %v, want Acquired", a.Outcome, err)
	}
	if err := s.Complete(ctx, key, a.Lease, []byte("result-"+key), retention); err != nil {
		t.Fatal(err)
	}
	before := redisstore.ReplayCacheHits()
	deadline := time.Now().Add(5 * time.Second) // the tracking connection of go-redis may not be confirmed yet
	for i := 0; redisstore.ReplayCacheHits() == before; i++ {
		if i >= 10 && time.Now().After(deadline) {
			t.Fatal("no acquire was answered from the local cache")
		}
		r, err := s.Acquire(ctx, key, acquireReq(fp, retention))
		if err != nil || r.Outcome != storekit.Replay || string(r.Result) != "result-"+key || r.State != storekit.StateCompleted {
			t.Fatalf("acquire %d: got %v %q %v, %v, want the replay", i, r.Outcome, r.Result, r.State, err)
		}
	}
}

// TestReplayCacheDeleteInvalidates: a delete by another process (another
// client) is seen by the cached store once the server's invalidation
// arrives (within staleBound), not at the end of the entry's local time to
// live.
func TestReplayCacheDeleteInvalidates(t *testing.T) {
	eachCachedStore(t, testDeleteInvalidates)
}

func testDeleteInvalidates(t *testing.T, srv *redistest.Server, s *redisstore.Store, _ func(...redisstore.Option) *redisstore.Store) {
	other := goRedisClient(t, srv.Addr())
	completeAndCache(t, s, "k1", "fp", time.Hour)
	if err := other.Del(t.Context(), s.Key("k1")).Err(); err != nil {
		t.Fatal(err)
	}
	deleted := time.Now()
	for {
		a, err := s.Acquire(t.Context(), "k1", acquireReq("fp", time.Hour))
		if err != nil {
			t.Fatal(err)
		}
		if a.Outcome == storekit.Acquired {
			break
		}
		if time.Since(deleted) > staleBound {
			t.Fatalf("still replayed %v after the delete", time.Since(deleted))
		}
	}
	// An overwrite by another process is seen too.
	completeAndCache(t, s, "k2", "fp", time.Hour)
	other2, err := redisstore.New(other, redisstore.WithReplayCache(false))
	if err != nil {
		t.Fatal(err)
	}
	if err := other2.Delete(t.Context(), "k2"); err != nil {
		t.Fatal(err)
	}
	a, err := other2.Acquire(t.Context(), "k2", acquireReq("fp2", time.Hour))
	if err != nil || a.Outcome != storekit.Acquired {
		t.Fatalf("acquire by the other process: got %v, %v", a.Outcome, err)
	}
	overwritten := time.Now()
	for {
		a, err := s.Acquire(t.Context(), "k2", acquireReq("fp", time.Hour))
		if err != nil {
			t.Fatal(err)
		}
		if a.Outcome == storekit.Mismatch {
			break
		}
		if time.Since(overwritten) > staleBound {
			t.Fatalf("got %v %v after the overwrite, want Mismatch", a.Outcome, time.Since(overwritten))
		}
	}
}

// TestReplayCacheNeverOutlivesRetention: a cached replay is never served
// after the record's retention ended.
func TestReplayCacheNeverOutlivesRetention(t *testing.T) {
	eachCachedStore(t, testNeverOutlivesRetention)
}

func testNeverOutlivesRetention(t *testing.T, _ *redistest.Server, s *redisstore.Store, _ func(...redisstore.Option) *redisstore.Store) {
	const retention = 400 * time.Millisecond
	completeAndCache(t, s, "k", "fp", retention)
	// The completion happened before this on the server's clock, so its
	// retention ends before start+retention.
	start := time.Now()
	for {
		called := time.Since(start) // the acquire answers after this
		a, err := s.Acquire(t.Context(), "k", acquireReq("fp", retention))
		if err != nil {
			t.Fatal(err)
		}
		if a.Outcome != storekit.Replay {
			break
		}
		// Redis itself keeps expiries in whole milliseconds.
		if called > retention+time.Millisecond {
			t.Fatalf("replayed %v after the completion, over its retention of %v", called, retention)
		}
	}
}

// TestReplayCacheBrokenConnection: when the cache's connections break, no
// cached replay is served for a record deleted meanwhile.
func TestReplayCacheBrokenConnection(t *testing.T) {
	eachCachedStore(t, testBrokenConnection)
}

func testBrokenConnection(t *testing.T, srv *redistest.Server, s *redisstore.Store, _ func(...redisstore.Option) *redisstore.Store) {
	other := goRedisClient(t, srv.Addr())
	completeAndCache(t, s, "k", "fp", time.Hour)
	gen, _, _ := redisstore.CacheState(s)
	ctx := t.Context()
	// Stop the server's invalidations: tracking stays off while the
	// connections are down, then the key is deleted with no client
	// tracking it.
	// In one transaction, so that no tracking connection is back before
	// the delete (go-redis's tracking connection is a pubsub one).
	if _, err := other.TxPipelined(ctx, func(p redis.Pipeliner) error {
		p.Do(ctx, "CLIENT", "KILL", "TYPE", "normal", "SKIPME", "yes")
		p.Do(ctx, "CLIENT", "KILL", "TYPE", "pubsub")
		p.Del(ctx, s.Key("k"))
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	killed := time.Now()
	// The client learns of the break as it learns of an invalidation, as
	// soon as the server's message (here: the end of the stream) arrives:
	// the same bound holds. Without the flush the entry would be served
	// until its local time to live, a minute.
	noStaleAfterBreak(t, s, gen, "k", killed)
}

// noStaleAfterBreak acquires key until the store's cache is back (its
// generation moved past gen and its tracking connection is confirmed
// again) and once more. The store learns of the break when the end of the
// connection arrives, as it learns of an invalidation: until then an
// acquire may replay the deleted record, as a read before the delete
// would have; once it noticed, none may. With rueidis and valkey-go, whose
// cache state is not visible, it acquires until the first acquire that is
// not a replay. staleBound bounds that window: far above the time the end
// of a connection takes to arrive on a loaded machine, far below the
// entries' local time to live (a minute), which a store that missed the
// break would serve them for.
const staleBound = 5 * time.Second

func noStaleAfterBreak(t *testing.T, s *redisstore.Store, gen uint64, key string, since time.Time) {
	t.Helper()
	if _, _, tracked := redisstore.CacheState(s); !tracked {
		for {
			a, err := s.Acquire(t.Context(), key, acquireReq("fp", time.Hour))
			if err == nil && a.Outcome == storekit.Acquired {
				return
			}
			if time.Since(since) > staleBound {
				t.Fatalf("acquire %v after the break: got %v, %v, want Acquired", time.Since(since), a.Outcome, err)
			}
		}
	}
	deadline := time.Now().Add(10 * time.Second)
	for back := false; ; {
		g, ready, _ := redisstore.CacheState(s)
		noticed := g != gen
		a, err := s.Acquire(t.Context(), key, acquireReq("fp", time.Hour))
		if err == nil && a.Outcome == storekit.Replay {
			if noticed {
				t.Fatalf("acquire %v after the break, which the store had noticed: a replay of the record deleted meanwhile", time.Since(since))
			}
			if time.Since(since) > staleBound {
				t.Fatalf("still replayed %v after the break", time.Since(since))
			}
		}
		if back {
			return
		}
		back = noticed && ready
		if time.Now().After(deadline) {
			t.Fatal("the cache did not come back")
		}
	}
}

// TestReplayCacheChecks: the fingerprint and the scope are checked on a
// cached replay as on the server.
func TestReplayCacheChecks(t *testing.T) {
	eachCachedStore(t, testChecks)
}

func testChecks(t *testing.T, _ *redistest.Server, s *redisstore.Store, newStore func(...redisstore.Option) *redisstore.Store) {
	ctx := t.Context()
	completeAndCache(t, s, "scope-a.k", "fp", time.Hour)
	a, err := s.Acquire(ctx, "scope-a.k", acquireReq("other", time.Hour))
	if err != nil || a.Outcome != storekit.Mismatch {
		t.Fatalf("other fingerprint: got %v, %v, want Mismatch", a.Outcome, err)
	}
	a, err = s.Acquire(ctx, "scope-b.k", acquireReq("fp", time.Hour))
	if err != nil || a.Outcome != storekit.Acquired {
		t.Fatalf("other scope: got %v, %v, want Acquired", a.Outcome, err)
	}
	// IN_PROGRESS is never served from the cache: the key above is.
	req := acquireReq("fp", time.Hour)
	req.Owner = "another owner"
	b, err := s.Acquire(ctx, "scope-b.k", req)
	if err != nil || b.Outcome != storekit.InProgress {
		t.Fatalf("in progress: got %v, %v, want InProgress", b.Outcome, err)
	}
	// Off by option: no acquire is served locally.
	off := newStore(redisstore.WithReplayCache(false))
	before := redisstore.ReplayCacheHits()
	for range 3 {
		if r, err := off.Acquire(ctx, "scope-a.k", acquireReq("fp", time.Hour)); err != nil || r.Outcome != storekit.Replay {
			t.Fatalf("got %v, %v, want Replay", r.Outcome, err)
		}
	}
	if n := redisstore.ReplayCacheHits() - before; n != 0 {
		t.Fatalf("got %d cached replays with the cache off, want 0", n)
	}
}

// TestDecodeRecord: the cache reads every record the scripts can write,
// in every MessagePack width, and refuses anything else.
func TestDecodeRecord(t *testing.T) {
	for _, r := range []fuzzRecord{
		{state: "c", fp: "fp", owner: "o", fence: 1, leaseEnd: 2, attempts: 3, created: 4, result: "r"},
		{state: "f", fp: strings.Repeat("f", 64), fence: 1 << 40, leaseEnd: 1 << 52, attempts: 300, created: 1 << 20, result: strings.Repeat("x", 70000)},
		{state: "p", fp: strings.Repeat("g", 200), attempts: 70000, result: strings.Repeat("y", 40)},
	} {
		st, fp, res, att, err := redisstore.DecodeRecord(string(r.encode()))
		if err != nil || st != r.state || fp != r.fp || res != r.result || uint64(att) != r.attempts {
			t.Errorf("got %q %q %d %d, %v, want %q %q %d %d", st, fp, len(res), att, err, r.state, r.fp, len(r.result), r.attempts)
		}
		enc := string(r.encode())
		for _, bad := range []string{enc[:len(enc)-1], enc + "x", "\x02" + enc[1:], ""} {
			if _, _, _, _, err := redisstore.DecodeRecord(bad); err == nil {
				t.Errorf("decoded a malformed record of %d bytes", len(bad))
			}
		}
	}
}

// TestReplayCacheFlushAll: a FLUSHALL (as in a failover that lost the
// records) empties the cache at once.
func TestReplayCacheFlushAll(t *testing.T) {
	eachCachedStore(t, func(t *testing.T, srv *redistest.Server, s *redisstore.Store, _ func(...redisstore.Option) *redisstore.Store) {
		other := goRedisClient(t, srv.Addr())
		completeAndCache(t, s, "k", "fp", time.Hour)
		gen, _, _ := redisstore.CacheState(s)
		if err := other.FlushAll(t.Context()).Err(); err != nil {
			t.Fatal(err)
		}
		noStaleAfterBreak(t, s, gen, "k", time.Now())
	})
}

// TestReplayCacheBytes: the go-redis cache keeps at most its bound in
// bytes, dropping the least recently used records.
func TestReplayCacheBytes(t *testing.T) {
	srv := redistest.Start(t)
	const bound = 2000
	s := cachedGoRedisStore(t, srv.Addr(), redisstore.WithReplayCacheBytes(bound))
	for i := range 20 {
		completeAndCache(t, s, "k"+strconv.Itoa(i), "fp", time.Hour)
		entries, bytes := redisstore.CacheSize(s)
		if bytes > bound || entries == 0 {
			t.Fatalf("after %d records: %d entries, %d bytes, want some, at most %d bytes", i+1, entries, bytes, bound)
		}
	}
	if _, err := redisstore.New(goRedisClient(t, srv.Addr()), redisstore.WithReplayCacheBytes(0)); err == nil || !errors.Is(err, idem.ErrInvalid) {
		t.Fatalf("a cache of 0 bytes: got %v, want ErrInvalid", err)
	}
}

// TestReplayCacheClose: a go-redis store has one tracking connection and
// reader connections, which Close ends; the store then reads replays from
// the server.
func TestReplayCacheClose(t *testing.T) {
	srv := redistest.Start(t)
	s := cachedGoRedisStore(t, srv.Addr())
	completeAndCache(t, s, "k", "fp", time.Hour)
	tracking := func() int {
		list, err := srv.Command("CLIENT", "LIST")
		if err != nil {
			t.Fatal(err)
		}
		return strings.Count(list, "name=idem-tracking ")
	}
	if n := tracking(); n != 1 {
		t.Fatalf("%d tracking connections, want 1", n)
	}
	if n := len(clientIDs(t, srv, "idem-tracking-reader")); n == 0 {
		t.Fatal("no reader connection")
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "no tracking connection after Close", func() bool { return tracking() == 0 })
	waitFor(t, "no reader connection after Close", func() bool { return len(clientIDs(t, srv, "idem-tracking-reader")) == 0 })
	before := redisstore.ReplayCacheHits()
	if a, err := s.Acquire(t.Context(), "k", acquireReq("fp", time.Hour)); err != nil || a.Outcome != storekit.Replay {
		t.Fatalf("after Close: got %v, %v, want Replay", a.Outcome, err)
	}
	if redisstore.ReplayCacheHits() != before {
		t.Fatal("a replay was served from the cache after Close")
	}
}

// TestReplayCacheClusterAsk: on a rueidis Cluster client, with and without
// its client-side cache (DisableCache), replays of a key whose slot is
// being migrated, so that its old node answers ASK, are served from the
// new node. rueidis resends an asked DoCache behind its cache's opt-in
// command even when the client has no cache, and its read loop then stores
// the reply in the cache it does not have: a nil-pointer panic in a
// goroutine of rueidis, which ends the process. So the store must not call
// DoCache on a client without a cache.
func TestReplayCacheClusterAsk(t *testing.T) {
	cluster := redistest.StartCluster(t, 3)
	for _, rc := range ruClients {
		for _, disable := range []bool{true, false} {
			t.Run(rc.name+"/DisableCache="+strconv.FormatBool(disable), func(t *testing.T) {
				testReplayCacheClusterAsk(t, cluster, rc, disable)
			})
		}
	}
}

func testReplayCacheClusterAsk(t *testing.T, cluster *redistest.Cluster, rc ruClient, disable bool) {
	s := rc.mustStore(t, ruOptions{addrs: cluster.Addrs(), cache: !disable})
	key := "ask-" + rc.name + "-" + strconv.FormatBool(disable)
	replay := func(what string) {
		t.Helper()
		a, err := s.Acquire(t.Context(), key, acquireReq("fp", time.Hour))
		if err != nil || a.Outcome != storekit.Replay || string(a.Result) != "result-"+key {
			t.Fatalf("%s: got %v %q, %v, want the replay", what, a.Outcome, a.Result, err)
		}
	}
	if disable {
		a, err := s.Acquire(t.Context(), key, acquireReq("fp", time.Hour))
		if err != nil || a.Outcome != storekit.Acquired {
			t.Fatalf("acquire: got %v, %v", a.Outcome, err)
		}
		if err := s.Complete(t.Context(), key, a.Lease, []byte("result-"+key), time.Hour); err != nil {
			t.Fatal(err)
		}
	} else {
		completeAndCache(t, s, key, "fp", time.Hour)
	}
	// Past the reads that learn whether the client has a cache.
	for i := range 10 {
		replay("replay " + strconv.Itoa(i))
	}
	want := map[bool]string{true: "Do", false: "DoCache"}[disable]
	if got := redisstore.RueidisRead(s); got != want {
		t.Fatalf("the store reads replays with %s, want %s", got, want)
	}
	migrateKey(t, cluster, s.Key(key))
	for i := range 3 {
		replay("replay " + strconv.Itoa(i) + " during the migration")
	}
}

// migrateKey starts moving rkey's slot from its node to another master
// (CLUSTER SETSLOT IMPORTING and MIGRATING) and moves rkey, so that its
// old node answers ASK for it until the migration ends, which it does not.
func migrateKey(t *testing.T, cluster *redistest.Cluster, rkey string) {
	t.Helper()
	masters := cluster.Masters()
	var src, dst *redistest.Server
	for _, m := range masters {
		if _, err := m.Command("EXISTS", rkey); err == nil {
			src = m
		} else if dst == nil {
			dst = m
		}
	}
	if src == nil || dst == nil {
		t.Fatalf("no owner of %s, or no other master", rkey)
	}
	slot := src.Do(t, "CLUSTER", "KEYSLOT", rkey)
	dst.Do(t, "CLUSTER", "SETSLOT", slot, "IMPORTING", src.Do(t, "CLUSTER", "MYID"))
	src.Do(t, "CLUSTER", "SETSLOT", slot, "MIGRATING", dst.Do(t, "CLUSTER", "MYID"))
	host, port, _ := strings.Cut(dst.Addr(), ":")
	src.Do(t, "MIGRATE", host, port, "", "0", "5000", "KEYS", rkey)
	if _, err := src.Command("GET", rkey); err == nil || !strings.HasPrefix(err.Error(), "ASK") {
		t.Fatalf("GET %s on its old node: got %v, want ASK", rkey, err)
	}
}

// TestReplayCacheDeleteRacingRead: a read of the go-redis store's cache
// that the server answers before a Delete's DEL, and whose reply arrives
// after the Delete began, must not leave the deleted record in the cache:
// once Delete returned, the next acquire of the same store runs (before the
// fix, it was answered with the deleted record's replay until the server's
// invalidation reached the tracking connection). CLIENT PAUSE WRITE holds
// the DEL at the server while reads go through, which makes the order
// certain.
func TestReplayCacheDeleteRacingRead(t *testing.T) {
	srv := redistest.Start(t)
	s := cachedGoRedisStore(t, srv.Addr())
	admin := goRedisClient(t, srv.Addr())
	// The server's invalidation may still reach the tracking connection
	// before the acquire that follows Delete: the order is certain only
	// up to that, so the scenario runs on several keys.
	for i := range 20 {
		deleteRacingRead(t, s, admin, fmt.Sprintf("k%d", i))
	}
}

func deleteRacingRead(t *testing.T, s *redisstore.Store, admin *redis.Client, key string) {
	completeAndCache(t, s, key, "fp", time.Hour)
	if err := admin.Do(t.Context(), "CLIENT", "PAUSE", "10000", "WRITE").Err(); err != nil {
		t.Fatal(err)
	}
	unpaused := false
	unpause := func() {
		if !unpaused {
			unpaused = true
			if err := admin.Do(context.Background(), "CLIENT", "UNPAUSE").Err(); err != nil {
				t.Error(err)
			}
		}
	}
	defer unpause()
	deleted := make(chan error, 1)
	go func() { deleted <- s.Delete(context.Background(), key) }()
	// Delete drops the cached record before it sends the DEL, which the
	// pause then holds.
	for entries, _ := redisstore.CacheSize(s); entries != 0; entries, _ = redisstore.CacheSize(s) {
		runtime.Gosched()
	}
	// A concurrent acquire whose script replayed before the DEL puts the
	// key in the replay index again, and another one reads the cache:
	// the GET runs now, before the DEL.
	redisstore.MarkReplayed(s, key)
	if a, ok := redisstore.CachedReplay(t.Context(), s, key, "fp"); !ok || a.Outcome != storekit.Replay {
		t.Fatalf("%s: the read before the DEL: got %v %v, want the replay", key, a.Outcome, ok)
	}
	select {
	case err := <-deleted:
		t.Fatalf("%s: Delete returned during the pause: %v", key, err)
	default:
	}
	unpause()
	if err := <-deleted; err != nil {
		t.Fatal(err)
	}
	a, err := s.Acquire(t.Context(), key, acquireReq("fp", time.Hour))
	if err != nil || a.Outcome != storekit.Acquired {
		t.Fatalf("%s: acquire after Delete returned: got %v, %v, want Acquired (not the deleted record's replay)", key, a.Outcome, err)
	}
}
