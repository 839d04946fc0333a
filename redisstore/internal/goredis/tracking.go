package goredis

import (
	"container/list"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"sync"
	"sync/atomic"
	"time"

	"github.com/idemgo/idem/redisstore/internal/backend"
	"github.com/redis/go-redis/v9"
)

// The local replay cache of a go-redis store (see redisstore's package
// documentation, "Local replay cache"). go-redis has no client-side cache,
// so the store keeps its own: an LRU of records bounded in bytes, filled by
// GET and PTTL on the user's client, and kept consistent by a tracking
// connection of its own. That connection, in RESP2, turns on client
// tracking in broadcasting mode for the store's prefix with itself as the
// redirect target (CLIENT TRACKING ON REDIRECT <own id> BCAST PREFIX p)
// and subscribes to __redis__:invalidate: the server then tells it of every
// write or delete of a key under the prefix, by any client, in one message
// per event loop cycle. Reads stay on the user's pooled connections.
//
// Safety rests on five rules:
//   - nothing is served or stored while the tracking connection is not
//     confirmed (the subscription's reply arrived after tracking was
//     turned on on that connection), and everything is dropped when it
//     breaks, when the server flushes its keys, or when a message cannot be
//     read;
//   - the tracking connection is on the server the user's client talks to:
//     when the client connects to another server (a Sentinel failover: the
//     client's dialer now answers the new primary), every entry is dropped
//     at once, before that connection's first command, and the tracking
//     connection moves there; one that reached another server than the
//     client's last connection is not confirmed. A dial hook on the client
//     (AddHook) sees its connections, and a PING through the client every
//     trackPing makes it connect to the new primary when nothing else would
//     (every acquire a local replay), since go-redis learns of a failover
//     from the Sentinels but connects only when it sends;
//   - a read marks its key pending before it is sent, and an invalidation
//     of the key or a flush while it is in flight cancels the insert, so an
//     entry never predates an invalidation it has not seen;
//   - an entry's local end is the time before the read was sent plus the
//     key's PTTL, less backend.ExpiryMargin, and at most backend.CacheTTL, so it
//     ends before the record does;
//   - a ping every trackPing must be answered within trackTimeout, or the
//     connection counts as broken (a silent network failure would otherwise
//     stop invalidations without a sign).

const (
	trackPing    = time.Second
	trackTimeout = 3 * time.Second
	// entryOverhead is the bookkeeping counted per entry.
	entryOverhead = 100
)

// errCacheDown: the tracking connection is not confirmed, the cache is not
// used.
var errCacheDown = errors.New("redisstore: replay cache: no tracking connection")

// trackedCache is the cache of a go-redis store; it implements
// backend.CachedGetter.
type trackedCache struct {
	c    *redis.Client // the user's client
	max  int64
	keep func(value string) bool // backend.CacheConfig.Keep

	mu      sync.Mutex
	healthy bool   // the tracking connection is confirmed
	gen     uint64 // incremented by every flush
	seq     uint64 // read tokens
	size    int64
	lru     list.List // of *cacheEntry, most recent first
	entries map[string]*list.Element
	pending map[string]uint64 // key → token of the read in flight
	// trackAddr is the server of the tracking connection ("" between
	// sessions), userAddr the server of the client's last new connection
	// ("" before the first the hook saw).
	trackAddr, userAddr string

	moved     chan struct{} // the client moved to another server: end the session
	done      chan struct{} // closed by close
	closeOnce sync.Once
	stopped   chan struct{} // closed when track returned
}

type cacheEntry struct {
	key, value string
	end        time.Time
}

func (e *cacheEntry) bytes() int64 { return int64(len(e.key) + len(e.value) + entryOverhead) }

// startTracking returns the cache of a go-redis store on c whose record
// keys start with prefix, and starts its tracking connection, which ends
// with close.
func startTracking(c *redis.Client, prefix string, maxBytes int64, keep func(string) bool, log *slog.Logger) *trackedCache {
	tc := &trackedCache{c: c, max: maxBytes, keep: keep, entries: make(map[string]*list.Element), pending: make(map[string]uint64),
		moved: make(chan struct{}, 1), done: make(chan struct{}), stopped: make(chan struct{})}
	c.AddHook(dialWatch{tc.userDialed})
	go tc.track(prefix, log)
	return tc
}

// dialWatch is a go-redis hook that reports the server of every new
// connection to f.
type dialWatch struct{ f func(addr string) }

func (w dialWatch) DialHook(next redis.DialHook) redis.DialHook {
	return func(ctx context.Context, network, addr string) (net.Conn, error) {
		cn, err := next(ctx, network, addr)
		if err == nil && cn.RemoteAddr() != nil {
			w.f(cn.RemoteAddr().String())
		}
		return cn, err
	}
}

func (w dialWatch) ProcessHook(next redis.ProcessHook) redis.ProcessHook { return next }

func (w dialWatch) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return next
}

// userDialed is told the server of each new connection of the user's
// client: one other than the tracking connection's drops every entry at
// once and ends the tracking session, so that the next one is on the
// client's new server.
func (tc *trackedCache) userDialed(addr string) {
	tc.mu.Lock()
	defer tc.mu.Unlock()
	tc.userAddr = addr
	if tc.trackAddr == "" || addr == tc.trackAddr {
		return
	}
	tc.flushLocked()
	tc.trackAddr = ""
	select {
	case tc.moved <- struct{}{}:
	default:
	}
}

// trackDialed is told the server of each new tracking connection.
func (tc *trackedCache) trackDialed(addr string) {
	tc.mu.Lock()
	tc.trackAddr = addr
	tc.mu.Unlock()
}

// ReplayCache implements backend.Backend: the store's own cache, with its
// tracking connection.
func (b *Client) ReplayCache(c backend.CacheConfig) backend.CachedGetter {
	return startTracking(b.c, c.Prefix, c.MaxBytes, c.Keep, c.Log)
}

// ReplayCache implements backend.Backend: none on a Cluster (each node
// would need a tracking connection of its own).
func (b *ClusterClient) ReplayCache(backend.CacheConfig) backend.CachedGetter { return nil }

// Forget implements backend.CachedGetter.
func (tc *trackedCache) Forget(key string) { tc.invalidate([]string{key}) }

// Close ends the tracking connection and waits for its goroutines.
func (tc *trackedCache) Close() {
	tc.closeOnce.Do(func() { close(tc.done) })
	<-tc.stopped
}

// track keeps a tracking connection open until close.
func (tc *trackedCache) track(prefix string, log *slog.Logger) {
	defer close(tc.stopped)
	opt := *tc.c.Options()
	userOnConnect := opt.OnConnect
	opt.Protocol = 2
	opt.PoolSize = 1
	opt.MinIdleConns = 0
	opt.MaxIdleConns = 0
	opt.ClientName = "idem-tracking"
	opt.OnConnect = func(ctx context.Context, cn *redis.Conn) error {
		if userOnConnect != nil {
			if err := userOnConnect(ctx, cn); err != nil {
				return err
			}
		}
		id, err := cn.ClientID(ctx).Result()
		if err != nil {
			return err
		}
		return cn.Do(ctx, "CLIENT", "TRACKING", "ON", "REDIRECT", id, "BCAST", "PREFIX", prefix).Err()
	}
	rc := redis.NewClient(&opt)
	defer rc.Close()
	rc.AddHook(dialWatch{tc.trackDialed})
	pause := 10 * time.Millisecond
	warned := false
	for {
		confirmed, err := tc.session(rc)
		tc.flush()
		select {
		case <-tc.done:
			return
		default:
		}
		if confirmed {
			pause = 10 * time.Millisecond
		} else if !warned {
			// Once: the cache stays off while this lasts (an ACL that
			// refuses CLIENT TRACKING, a server that is down).
			log.Warn("redisstore: replay cache: tracking connection failed; replays are read from the server until it works", "error", err)
			warned = true
		}
		select {
		case <-tc.done:
			return
		case <-time.After(pause):
		}
		pause = min(2*pause, time.Second)
	}
}

// session runs one tracking connection until it breaks, the server
// flushes its keys or close; confirmed reports that its subscription was
// confirmed.
func (tc *trackedCache) session(rc *redis.Client) (confirmed bool, err error) {
	ctx := context.Background()
	select {
	case <-tc.moved: // a move before this session, which dials anew
	default:
	}
	ps := rc.Subscribe(ctx, "__redis__:invalidate")
	defer ps.Close()
	stop := make(chan struct{})
	defer close(stop)
	var probing atomic.Bool
	go func() {
		t := time.NewTicker(trackPing)
		defer t.Stop()
		for {
			select {
			case <-stop:
				return
			case <-tc.done:
				ps.Close() // ends the session: Receive returns ErrClosed
				return
			case <-tc.moved:
				ps.Close()
				return
			case <-t.C:
				_ = ps.Ping(ctx) // the reply (or its absence) is seen below
				if probing.CompareAndSwap(false, true) {
					go func() {
						defer probing.Store(false)
						pctx, cancel := context.WithTimeout(ctx, trackTimeout)
						defer cancel()
						_ = tc.c.Ping(pctx).Err() // the client dials its new primary, if it has one
					}()
				}
			}
		}
	}()
	for {
		msg, err := ps.ReceiveTimeout(ctx, trackTimeout)
		if err != nil {
			// A flush's invalidation (a nil list of keys) ends up here
			// too: go-redis refuses the message.
			return confirmed, err
		}
		switch m := msg.(type) {
		case *redis.Subscription:
			if m.Kind == "subscribe" && m.Channel == "__redis__:invalidate" {
				tc.mu.Lock()
				track, user := tc.trackAddr, tc.userAddr
				ok := track != "" && (user == "" || user == track)
				tc.healthy = ok
				tc.mu.Unlock()
				if !ok {
					return confirmed, fmt.Errorf("the tracking connection reached %q, the client's last connection %q", track, user)
				}
				confirmed = true
			}
		case *redis.Message:
			if m.Payload != "" || len(m.PayloadSlice) == 0 {
				// Not a list of keys: a flush (FLUSHALL, FLUSHDB) or
				// a message this code does not know. End the session: the
				// next one starts with an empty cache.
				return confirmed, nil
			}
			tc.invalidate(m.PayloadSlice)
		}
	}
}

func (tc *trackedCache) invalidate(keys []string) {
	tc.mu.Lock()
	defer tc.mu.Unlock()
	for _, k := range keys {
		delete(tc.pending, k)
		if e, ok := tc.entries[k]; ok {
			tc.remove(e)
		}
	}
}

// flush drops every entry and cancels the reads in flight; the cache stays
// off until the next session is confirmed.
func (tc *trackedCache) flush() {
	tc.mu.Lock()
	defer tc.mu.Unlock()
	tc.flushLocked()
	tc.trackAddr = ""
}

// flushLocked is flush, with tc.mu held.
func (tc *trackedCache) flushLocked() {
	tc.healthy = false
	tc.gen++
	tc.lru.Init()
	clear(tc.entries)
	clear(tc.pending)
	tc.size = 0
}

func (tc *trackedCache) remove(e *list.Element) {
	ent := tc.lru.Remove(e).(*cacheEntry)
	delete(tc.entries, ent.key)
	tc.size -= ent.bytes()
}

// CachedGet implements backend.CachedGetter: the record from the cache, or
// read from the server (and cached when nothing invalidated it meanwhile).
func (tc *trackedCache) CachedGet(ctx context.Context, key string) (string, bool, error) {
	tc.mu.Lock()
	if !tc.healthy {
		tc.mu.Unlock()
		return "", false, errCacheDown
	}
	if e, ok := tc.entries[key]; ok {
		ent := e.Value.(*cacheEntry)
		if time.Now().Before(ent.end) {
			tc.lru.MoveToFront(e)
			tc.mu.Unlock()
			backend.CacheHits.Add(1)
			return ent.value, true, nil
		}
		tc.remove(e)
	}
	tc.seq++
	token := tc.seq
	tc.pending[key] = token
	tc.mu.Unlock()

	sent := time.Now()
	var get *redis.StringCmd
	var pttl *redis.DurationCmd
	_, err := tc.c.Pipelined(ctx, func(p redis.Pipeliner) error {
		get = p.Get(ctx, key)
		pttl = p.PTTL(ctx, key)
		return nil
	})
	v, gerr := get.Result()
	left, terr := pttl.Result()

	tc.mu.Lock()
	defer tc.mu.Unlock()
	// mine: neither an invalidation of the key nor a flush came while the
	// read was in flight (a flush clears every pending read, and only a
	// flush makes the cache unhealthy).
	mine := tc.pending[key] == token
	if mine {
		delete(tc.pending, key)
	}
	switch {
	case errors.Is(gerr, redis.Nil):
		return "", false, nil
	case gerr != nil:
		return "", false, gerr
	case err != nil && !errors.Is(err, redis.Nil):
		return "", false, err
	case terr != nil:
		return "", false, terr
	}
	// PTTL is -1 for a key without an expiry (records always have one)
	// and -2 for a key deleted between the two commands.
	if left < 0 && left != -1 {
		return "", false, nil
	}
	life := backend.CacheTTL
	if left >= 0 {
		life = min(left, backend.CacheTTL)
	}
	// Only COMPLETED and FAILED records are kept (redisstore's
	// cachedReplay serves nothing else).
	if tc.keep(v) && mine && life > backend.ExpiryMargin {
		ent := &cacheEntry{key: key, value: v, end: sent.Add(life - backend.ExpiryMargin)}
		if ent.bytes() <= tc.max {
			tc.entries[key] = tc.lru.PushFront(ent)
			tc.size += ent.bytes()
			for tc.size > tc.max {
				tc.remove(tc.lru.Back())
			}
		}
	}
	return v, true, nil
}

// Size is the cache's memory by its own count (tests).
func (tc *trackedCache) Size() (entries int, bytes int64) {
	tc.mu.Lock()
	defer tc.mu.Unlock()
	return len(tc.entries), tc.size
}

// State returns the cache's generation (incremented by every flush) and
// whether its tracking connection is confirmed (tests).
func (tc *trackedCache) State() (gen uint64, healthy bool) {
	tc.mu.Lock()
	defer tc.mu.Unlock()
	return tc.gen, tc.healthy
}
