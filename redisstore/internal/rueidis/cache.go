package rueidis

import (
	"context"
	"sync"
	"time"

	"github.com/idemgo/idem/redisstore/internal/backend"
	"github.com/redis/rueidis"
)

// The replay cache of a rueidis store (see redisstore's package
// documentation, "Local replay cache"): rueidis's client-side cache,
// read with DoCache GET, with the entries dated by the store.

// ReplayCache implements backend.Backend: rueidis keeps the cache.
func (b *Client) ReplayCache(backend.CacheConfig) backend.CachedGetter { return b }

// Forget drops the key's date: rueidis drops the entry when the server's
// invalidation arrives; until then the store's replay index, which no
// longer holds the key, keeps the cache from being read for it, and
// without a date the entry is not served.
func (b *Client) Forget(key string) { b.ends.forget(key) }

// cacheEnds dates the entries that a rueidis store's reads put into the
// client's cache. rueidis dates an entry's end from the arrival of the
// reply (its arrival plus the key's PTTL), so an entry outlives its record
// by the reply's transit time: by 289 ms with 300 ms of one-way delay. The
// store dates it from before its read was sent instead: that time plus
// the entry's time to live as the reply left it, which is at most the
// record's own time to live when the server read it. A hit is served only
// before that end, and only for an entry the store dated. It is safe for
// concurrent use.
type cacheEnds struct {
	mu sync.Mutex
	m  map[string]datedEnd
}

type datedEnd struct{ sent, end time.Time }

// set dates key's entry, read by a command sent at sent, to end, unless a
// later read dated it already.
func (c *cacheEnds) set(key string, sent, end time.Time) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if d, ok := c.m[key]; ok && d.sent.After(sent) {
		return
	}
	if c.m == nil {
		c.m = make(map[string]datedEnd)
	}
	if len(c.m) >= backend.IndexSize {
		// As many as the replay index holds: drop the ended ones, or,
		// if none has, all (their entries are then read from the server
		// once more).
		now := time.Now()
		for k, d := range c.m {
			if !now.Before(d.end) {
				delete(c.m, k)
			}
		}
		if len(c.m) >= backend.IndexSize {
			clear(c.m)
		}
	}
	c.m[key] = datedEnd{sent, end}
}

// end returns the end of key's entry, and whether the store dated it.
func (c *cacheEnds) end(key string) (time.Time, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	d, ok := c.m[key]
	return d.end, ok
}

func (c *cacheEnds) forget(key string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	delete(c.m, key)
}

// Close does nothing: the cache is the client's, which the store does not
// own.
func (b *Client) Close() {}

// How a rueidis store reads replays (Client.read). DoCache is
// unsafe on a Cluster client built with DisableCache: when the server
// answers ASK (the key's slot is being migrated), rueidis v1.0.79 resends
// the command behind the cache's opt-in prefix, and its read loop then
// stores the reply in the cache the client does not have, a nil-pointer
// panic in its own goroutine. rueidis does not say whether a client has a
// cache, so a store on a Cluster client reads replays with
// rueidis.MGetCache, which checks the client's options itself, until a
// reply shows the cache (a hit, or a local time to live), and from then on
// with DoCache; after cacheProbes replies without it, with Do. A reply
// from the cache lacks the time to live only when it came after an ASK, so
// a client with a cache is not taken for one without. On a standalone or
// Sentinel client DoCache is safe: without a cache it is Do.
const (
	readProbe int32 = iota
	readDoCache
	readDo
)

// cacheProbes is the number of replay reads with no sign of a client-side
// cache after which a store on a Cluster client reads replays with Do.
const cacheProbes = 8

// CachedGet implements backend.CachedGetter.
func (b *Client) CachedGet(ctx context.Context, key string) (string, bool, error) {
	var m rueidis.RedisMessage
	var err error
	sent := time.Now()
	switch b.read.Load() {
	case readDoCache:
		m, err = b.c.DoCache(ctx, b.c.B().Get().Key(key).Cache(), backend.CacheTTL).ToMessage()
	case readDo:
		m, err = b.c.Do(ctx, b.c.B().Get().Key(key).Build()).ToMessage()
	default:
		var ms map[string]rueidis.RedisMessage
		if ms, err = rueidis.MGetCache(b.c, ctx, backend.CacheTTL, []string{key}); err != nil {
			return "", false, err
		}
		m = ms[key]
		if m.IsCacheHit() || m.CachePTTL() >= 0 {
			b.read.Store(readDoCache)
		} else if b.noCache.Add(1) >= cacheProbes {
			b.read.Store(readDo)
		}
	}
	if err != nil && !rueidis.IsRedisNil(err) {
		return "", false, err
	}
	if m.IsCacheHit() {
		// Served only before the end the store dated (cacheEnds).
		if end, ok := b.ends.end(key); !ok || time.Until(end) < backend.ExpiryMargin {
			return "", false, backend.ErrNearExpiry
		}
		backend.CacheHits.Add(1)
	} else if pxat := m.CachePXAT(); pxat > 0 {
		// The reply is in the cache until pxat, dated from its arrival:
		// date it from the send.
		b.ends.set(key, sent, sent.Add(time.Until(time.UnixMilli(pxat))))
	}
	v, err := m.ToString()
	if rueidis.IsRedisNil(err) {
		return "", false, nil
	}
	if err != nil {
		return "", false, err
	}
	return v, true, nil
}

// ReadMode returns how the client reads replays: "probe", "DoCache" or
// "Do" (tests).
func (b *Client) ReadMode() string {
	return [...]string{readProbe: "probe", readDoCache: "DoCache", readDo: "Do"}[b.read.Load()]
}
