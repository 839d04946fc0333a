package redisstore

import (
	"container/list"
	"context"
	"encoding/binary"
	"errors"
	"math"
	"sync"

	"github.com/idemgo/idem/redisstore/internal/backend"
	"github.com/idemgo/idem/storekit"
)

// The local replay cache (see the package documentation). The store keeps
// an LRU index of the keys whose acquire returned a replay; only those are
// read through the cache (with rueidis its client-side cache, DoCache GET;
// with go-redis the store's own, internal/goredis/tracking.go), so a new
// key never costs the extra GET. A cached value that is not COMPLETED or FAILED (the
// record was deleted, or is IN_PROGRESS again) leaves the index, and the
// acquire runs its script as without a cache.
//
// Decision: with WithWait or WithWaitAOF the cache is off by default,
// since those callers asked that each acquire wait for replicas; on a
// go-redis Cluster it is off (each node would need a tracking connection of
// its own).

// replayIndexSize is the default number of keys of the replay index.
const replayIndexSize = backend.IndexSize

// WithReplayCache sets whether Acquire serves replays of COMPLETED and
// FAILED records from the client library's server-assisted cache (see the
// package documentation, "Local replay cache"). The default is on without
// WithWait/WithWaitAOF, and off otherwise; on a go-redis *redis.ClusterClient
// it cannot be turned on.
func WithReplayCache(on bool) Option {
	return func(c *config) { c.replayCache = &on }
}

// DefaultReplayCacheBytes bounds the memory of a go-redis store's replay
// cache (WithReplayCacheBytes).
const DefaultReplayCacheBytes = 32 << 20

// WithReplayCacheBytes bounds the memory of the replay cache of a store on
// go-redis: records (key, value and about 100 bytes of bookkeeping each) in
// least recently used order up to n bytes. With rueidis the cache is
// rueidis's own, bounded by ClientOption.CacheSizeEachConn, and this
// option is ignored.
func WithReplayCacheBytes(n int64) Option {
	return func(c *config) {
		c.replayCacheBytes = n
		if n == 0 {
			c.replayCacheBytes = -1 // 0 is the default's mark; validate refuses both
		}
	}
}

// keepRecord reports whether a record read for the replay cache may be
// kept: only COMPLETED and FAILED records (cachedReplay serves nothing
// else).
func keepRecord(v string) bool {
	var rec packedRecord
	return rec.decode(v) == nil && (rec.state == "c" || rec.state == "f")
}

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
func (s *Store) cachedReplay(ctx context.Context, rkey, fingerprint string) (storekit.Acquisition, bool) {
	v, found, err := s.cached.CachedGet(ctx, rkey)
	if err != nil {
		return storekit.Acquisition{}, false
	}
	var rec packedRecord
	if !found || rec.decode(v) != nil || (rec.state != "c" && rec.state != "f") {
		s.replays.remove(rkey)
		return storekit.Acquisition{}, false
	}
	if rec.fingerprint != fingerprint {
		return storekit.Acquisition{Outcome: storekit.Mismatch}, true
	}
	a := storekit.Acquisition{Outcome: storekit.Replay, State: storekit.StateCompleted, Attempts: int(rec.attempts)}
	if rec.state == "f" {
		a.State = storekit.StateFailed
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
