package redisstore

import (
	"container/list"
	"context"
	"encoding/binary"
	"errors"
	"log/slog"
	"math"
	"sync"
	"sync/atomic"
	"time"

	"github.com/idemgo/idem"
	"github.com/redis/rueidis"
)

// The local replay cache (see the package documentation). The store keeps
// an LRU index of the keys whose acquire returned a replay; only those are
// read through the cache (with rueidis its client-side cache, DoCache GET;
// with go-redis the store's own, tracking.go), so a new key never costs the
// extra GET. A cached value that is not COMPLETED or FAILED (the
// record was deleted, or is IN_PROGRESS again) leaves the index, and the
// acquire runs its script as without a cache.
//
// Decision: with WithWait or WithWaitAOF the cache is off by default,
// since those callers asked that each acquire wait for replicas; on a
// go-redis Cluster it is off (each node would need a tracking connection of
// its own).

// replayCacheTTL bounds how long rueidis keeps a cached record, whatever
// its retention.
const replayCacheTTL = time.Minute

// replayExpiryMargin: a cached record with less time to live left is not
// used (the store runs the acquire script instead). Its end is dated from
// before the read that cached it was sent, so it ends before the record
// does; the margin covers the rounding of times to milliseconds.
const replayExpiryMargin = 10 * time.Millisecond

var errNearExpiry = errors.New("redisstore: cached record near its end, or of unknown date")

// replayIndexSize is the default number of keys of the replay index.
const replayIndexSize = 1 << 16

// WithReplayCache sets whether Acquire serves replays of COMPLETED and
// FAILED records from the client library's server-assisted cache (see the
// package documentation, "Local replay cache"). The default is on without
// WithWait/WithWaitAOF, and off otherwise; on a go-redis *redis.ClusterClient
// it cannot be turned on.
func WithReplayCache(on bool) Option {
	return func(c *config) { c.replayCache = &on }
}

// cachedGetter reads a key through a client-side cache that the server
// keeps consistent (client tracking).
type cachedGetter interface {
	cachedGet(ctx context.Context, key string) (value string, found bool, err error)
	// forget drops key's entry at once, before the server's invalidation
	// arrives (the store deleted the record).
	forget(key string)
	// close ends what the cache runs in the background.
	close()
}

// replayCacheBackend is a backend that can serve replays from a local
// cache: rueidis's client-side cache, or the store's own on a go-redis
// *redis.Client (tracking.go). prefix is the store's key prefix; maxBytes
// and log are the go-redis cache's bound and logger.
type replayCacheBackend interface {
	replayCache(prefix string, maxBytes int64, log *slog.Logger) cachedGetter
}

// replayCache implements replayCacheBackend: rueidis keeps the cache.
func (b *rueidisBackend) replayCache(string, int64, *slog.Logger) cachedGetter { return b }

// forget drops the key's date: rueidis drops the entry when the server's
// invalidation arrives; until then the store's replay index, which no
// longer holds the key, keeps the cache from being read for it, and
// without a date the entry is not served.
func (b *rueidisBackend) forget(key string) { b.ends.forget(key) }

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
	if len(c.m) >= replayIndexSize {
		// As many as the replay index holds: drop the ended ones, or,
		// if none has, all (their entries are then read from the server
		// once more).
		now := time.Now()
		for k, d := range c.m {
			if !now.Before(d.end) {
				delete(c.m, k)
			}
		}
		if len(c.m) >= replayIndexSize {
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

// close does nothing: the cache is the client's, which the store does not
// own.
func (b *rueidisBackend) close() {}

// How a rueidis store reads replays (rueidisBackend.read). DoCache is
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

func (b *rueidisBackend) cachedGet(ctx context.Context, key string) (string, bool, error) {
	var m rueidis.RedisMessage
	var err error
	sent := time.Now()
	switch b.read.Load() {
	case readDoCache:
		m, err = b.c.DoCache(ctx, b.c.B().Get().Key(key).Cache(), replayCacheTTL).ToMessage()
	case readDo:
		m, err = b.c.Do(ctx, b.c.B().Get().Key(key).Build()).ToMessage()
	default:
		var ms map[string]rueidis.RedisMessage
		if ms, err = rueidis.MGetCache(b.c, ctx, replayCacheTTL, []string{key}); err != nil {
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
		if end, ok := b.ends.end(key); !ok || time.Until(end) < replayExpiryMargin {
			return "", false, errNearExpiry
		}
		replayCacheHits.Add(1)
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

// replayCacheHits counts the acquires served from a local cache (tests).
var replayCacheHits atomic.Int64

// replayIndex is an LRU set of record keys whose acquire returned a
// replay. It is safe for concurrent use.
type replayIndex struct {
	mu   sync.Mutex
	max  int
	ll   list.List // of string, most recent first
	keys map[string]*list.Element
}

func newReplayIndex(max int) *replayIndex {
	return &replayIndex{max: max, keys: make(map[string]*list.Element)}
}

func (x *replayIndex) has(key string) bool {
	x.mu.Lock()
	defer x.mu.Unlock()
	e, ok := x.keys[key]
	if ok {
		x.ll.MoveToFront(e)
	}
	return ok
}

func (x *replayIndex) add(key string) {
	x.mu.Lock()
	defer x.mu.Unlock()
	if e, ok := x.keys[key]; ok {
		x.ll.MoveToFront(e)
		return
	}
	x.keys[key] = x.ll.PushFront(key)
	for x.ll.Len() > x.max {
		delete(x.keys, x.ll.Remove(x.ll.Back()).(string))
	}
}

func (x *replayIndex) remove(key string) {
	x.mu.Lock()
	defer x.mu.Unlock()
	if e, ok := x.keys[key]; ok {
		x.ll.Remove(e)
		delete(x.keys, key)
	}
}

// cachedReplay answers an acquire of the record rkey from the local cache:
// ok is false when it cannot (not cached, not COMPLETED or FAILED, or any
// error), and the caller runs the acquire script.
func (s *Store) cachedReplay(ctx context.Context, rkey, fingerprint string) (idem.Acquisition, bool) {
	v, found, err := s.cached.cachedGet(ctx, rkey)
	if err != nil {
		return idem.Acquisition{}, false
	}
	var rec packedRecord
	if !found || rec.decode(v) != nil || (rec.state != "c" && rec.state != "f") {
		s.replays.remove(rkey)
		return idem.Acquisition{}, false
	}
	if rec.fingerprint != fingerprint {
		return idem.Acquisition{Outcome: idem.Mismatch}, true
	}
	a := idem.Acquisition{Outcome: idem.Replay, State: idem.StateCompleted, Attempts: int(rec.attempts)}
	if rec.state == "f" {
		a.State = idem.StateFailed
	}
	if rec.result != "" {
		a.Result = []byte(rec.result)
	}
	return a, true
}

// packedRecord is the part of a record (see acquire.lua for its format)
// that a replay needs.
type packedRecord struct {
	state, fingerprint, result string
	attempts                   int64
}

var errRecordFormat = errors.New("redisstore: not a record of format 1")

// decode reads a record as the scripts write it: nine MessagePack values
// (format version, state, fingerprint, owner, fence, lease end, attempts,
// created, result), as Redis's cmsgpack.pack encodes them.
func (r *packedRecord) decode(v string) error {
	d := msgpackReader{b: v}
	if ver, ok := d.num(); !ok || ver != 1 {
		return errRecordFormat
	}
	var ok1, ok2, ok3, ok4, ok5, ok6, ok7 bool
	r.state, ok1 = d.str()
	r.fingerprint, ok2 = d.str()
	_, ok3 = d.str() // owner
	_, ok4 = d.num() // fence
	_, ok5 = d.num() // lease end
	r.attempts, ok6 = d.num()
	_, ok7 = d.num() // created
	var ok8 bool
	r.result, ok8 = d.str()
	if !ok1 || !ok2 || !ok3 || !ok4 || !ok5 || !ok6 || !ok7 || !ok8 || d.b != "" {
		return errRecordFormat
	}
	return nil
}

// msgpackReader reads the MessagePack values cmsgpack writes for Lua
// strings and numbers.
type msgpackReader struct{ b string }

func (d *msgpackReader) take(n int) (string, bool) {
	if n < 0 || len(d.b) < n {
		return "", false
	}
	s := d.b[:n]
	d.b = d.b[n:]
	return s, true
}

func (d *msgpackReader) str() (string, bool) {
	if d.b == "" {
		return "", false
	}
	c := d.b[0]
	d.b = d.b[1:]
	var n int
	switch {
	case c&0xe0 == 0xa0:
		n = int(c & 0x1f)
	case c == 0xd9 || c == 0xc4:
		h, ok := d.take(1)
		if !ok {
			return "", false
		}
		n = int(h[0])
	case c == 0xda || c == 0xc5:
		h, ok := d.take(2)
		if !ok {
			return "", false
		}
		n = int(binary.BigEndian.Uint16([]byte(h)))
	case c == 0xdb || c == 0xc6:
		h, ok := d.take(4)
		if !ok {
			return "", false
		}
		n = int(binary.BigEndian.Uint32([]byte(h)))
	default:
		return "", false
	}
	return d.take(n)
}

func (d *msgpackReader) num() (int64, bool) {
	if d.b == "" {
		return 0, false
	}
	c := d.b[0]
	d.b = d.b[1:]
	switch {
	case c < 0x80:
		return int64(c), true
	case c >= 0xe0:
		return int64(int8(c)), true
	}
	var n int
	switch c {
	case 0xcc, 0xd0:
		n = 1
	case 0xcd, 0xd1:
		n = 2
	case 0xce, 0xd2, 0xca:
		n = 4
	case 0xcf, 0xd3, 0xcb:
		n = 8
	default:
		return 0, false
	}
	h, ok := d.take(n)
	if !ok {
		return 0, false
	}
	var u uint64
	for i := range n {
		u = u<<8 | uint64(h[i])
	}
	switch c {
	case 0xcc, 0xcd, 0xce, 0xcf:
		if u > math.MaxInt64 {
			return 0, false
		}
		return int64(u), true
	case 0xd0:
		return int64(int8(u)), true
	case 0xd1:
		return int64(int16(u)), true
	case 0xd2:
		return int64(int32(u)), true
	case 0xd3:
		return int64(u), true
	case 0xca:
		return int64(math.Float32frombits(uint32(u))), true
	}
	return int64(math.Float64frombits(u)), true
}
