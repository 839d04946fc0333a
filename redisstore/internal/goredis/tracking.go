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
// documentation, "Local replay cache"). go-redis's client-side cache needs
// RESP3 on the user's client, so the store keeps its own: an LRU of records
// bounded in bytes, kept consistent by client tracking in its default mode,
// in which the server remembers which connection read which key and tells
// of a write only to those. Two kinds of connections of the store's own,
// opened with the client's options in RESP2:
//   - one tracking connection, subscribed to __redis__:invalidate, which
//     receives the invalidations;
//   - a few reader connections (readerPool), which turn tracking on with
//     that connection as the redirect target (CLIENT TRACKING ON REDIRECT
//     <its id>) and send every GET and PTTL of the cache.
//
// So a key that is never read through the cache (every new key) costs the
// server no tracking work and the store no message. The price is that the
// server forgets what a reader read when that reader's connection ends, and
// what it read for a redirect target that is gone, and says nothing of
// either in RESP2 (Redis 7.0, tracking.c: a reader's id is skipped once it
// is freed; a missing redirect target only gets tracking-redir-broken in
// RESP3). Safety rests on these rules:
//   - nothing is served or stored while the tracking connection is not
//     confirmed (the subscription's reply arrived, and a reader connection
//     turned tracking on towards it), and everything is dropped when it
//     breaks, when it is replaced, when the server flushes its keys, or when
//     a message cannot be read; the reader connections of that tracking
//     connection are then closed (a reader's redirect target lives as long
//     as the tracking connection: it is never used with another);
//   - the end of a reader connection, closed by the store (go-redis drops a
//     connection after an error or a canceled read), by the server (CLIENT
//     KILL, timeout) or by the network, drops every entry and cancels the
//     reads in flight, as soon as it happens: a goroutine reads each
//     reader connection at all times (watchedConn), so an idle one's end
//     is seen when its FIN arrives, as an invalidation would have been;
//   - the tracking connection is on the server the user's client talks to,
//     and so are the readers: when the client (or a reader) connects to
//     another server (a Sentinel failover: the client's dialer now answers
//     the new primary), every entry is dropped at once, before that
//     connection's first command, and the tracking connection moves there;
//     one that reached another server than the client's last connection is
//     not confirmed. A dial hook on the client (AddHook) sees its
//     connections, and a PING through the client every trackPing makes it
//     connect to the new primary when nothing else would (every acquire a
//     local replay), since go-redis learns of a failover from the Sentinels
//     but connects only when it sends;
//   - a read marks its key pending before it is sent, and an invalidation
//     of the key, a flush or the end of a reader connection while it is in
//     flight cancels the insert, so an entry never predates an invalidation
//     it has not seen;
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
	// readerPool is the number of reader connections: only reads of
	// replays the cache does not hold use them.
	readerPool = 4
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
	// trackID is the CLIENT ID of the tracking connection (0 between
	// sessions); readers is the client of the reader connections that
	// redirect to it, set while healthy.
	trackID int64
	readers *redis.Client

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
		tc.trackConnected(id)
		return nil
	}
	rc := redis.NewClient(&opt)
	defer rc.Close()
	rc.AddHook(dialWatch{tc.trackDialed})
	pause := 10 * time.Millisecond
	warned := false
	for {
		confirmed, err := tc.session(rc, prefix)
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

// trackConnected is told the CLIENT ID of each new tracking connection.
// go-redis replaces a pubsub connection that failed on its own (a ping
// that could not be written): a second connection in one session drops
// every entry and ends the session, since the readers redirect to the
// first one's id.
func (tc *trackedCache) trackConnected(id int64) {
	tc.mu.Lock()
	defer tc.mu.Unlock()
	if tc.trackID != 0 {
		tc.flushLocked()
		select {
		case tc.moved <- struct{}{}:
		default:
		}
	}
	tc.trackID = id
}

// newReaders returns the client of the reader connections of the tracking
// connection id: each turns tracking on, redirected to id, and is watched
// (watchedConn) so that its end drops every entry. A reader that reaches
// another server than the tracking connection, or that connects once the
// session of id ended, is refused.
func (tc *trackedCache) newReaders(id int64) *redis.Client {
	opt := *tc.c.Options()
	userOnConnect := opt.OnConnect
	dial := opt.Dialer
	opt.Protocol = 2
	opt.PoolSize = readerPool
	opt.MinIdleConns = 0
	opt.MaxIdleConns = 0
	opt.MaxActiveConns = 0
	opt.ConnMaxIdleTime = -1 // idle readers are kept: each end drops the cache
	opt.ConnMaxLifetime = 0
	opt.MaxRetries = -1 // a failed read falls back to the script
	opt.ClientName = "idem-tracking-reader"
	opt.ClientSideCacheConfig, opt.ClientSideCache = nil, nil // RESP3 only
	opt.Dialer = func(ctx context.Context, network, addr string) (net.Conn, error) {
		cn, err := dial(ctx, network, addr)
		if err != nil {
			return nil, err
		}
		if cn.RemoteAddr() == nil || !tc.readerDialed(id, cn.RemoteAddr().String()) {
			cn.Close()
			return nil, errCacheDown
		}
		return watch(cn, tc.readerLost), nil
	}
	opt.OnConnect = func(ctx context.Context, cn *redis.Conn) error {
		if userOnConnect != nil {
			if err := userOnConnect(ctx, cn); err != nil {
				return err
			}
		}
		return cn.Do(ctx, "CLIENT", "TRACKING", "ON", "REDIRECT", id).Err()
	}
	return redis.NewClient(&opt)
}

// readerDialed reports whether a reader connection to addr may serve the
// session of the tracking connection id. One that reached another server
// is a move: every entry is dropped and the session ends.
func (tc *trackedCache) readerDialed(id int64, addr string) bool {
	tc.mu.Lock()
	defer tc.mu.Unlock()
	if tc.trackID != id {
		return false
	}
	if addr != tc.trackAddr {
		tc.flushLocked()
		select {
		case tc.moved <- struct{}{}:
		default:
		}
		return false
	}
	return true
}

// readerLost is told of the end of a reader connection: the server forgot
// the keys it read, so every entry is dropped and every read in flight
// cancelled. The session goes on: the other readers' keys are still
// tracked, and a new reader turns tracking on anew.
func (tc *trackedCache) readerLost() {
	tc.mu.Lock()
	defer tc.mu.Unlock()
	tc.dropLocked()
}

// session runs one tracking connection until it breaks, the server
// flushes its keys or close; confirmed reports that its subscription was
// confirmed.
func (tc *trackedCache) session(rc *redis.Client, prefix string) (confirmed bool, err error) {
	ctx := context.Background()
	select {
	case <-tc.moved: // a move before this session, which dials anew
	default:
	}
	ps := rc.Subscribe(ctx, "__redis__:invalidate")
	defer ps.Close()
	var readers *redis.Client
	defer func() {
		if readers != nil {
			tc.flush() // before the readers end, so none is used closed
			readers.Close()
		}
	}()
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
				if confirmed {
					// go-redis subscribed again on a new connection.
					return confirmed, errors.New("the tracking connection was replaced")
				}
				tc.mu.Lock()
				track, user, id := tc.trackAddr, tc.userAddr, tc.trackID
				tc.mu.Unlock()
				if track == "" || (user != "" && user != track) {
					return confirmed, fmt.Errorf("the tracking connection reached %q, the client's last connection %q", track, user)
				}
				// One reader turns tracking on before anything is
				// served: a server that refuses it (an ACL) leaves the
				// cache off, with the warning.
				readers = tc.newReaders(id)
				pctx, cancel := context.WithTimeout(ctx, trackTimeout)
				err := readers.Ping(pctx).Err()
				cancel()
				if err != nil {
					return confirmed, fmt.Errorf("turning tracking on, redirected to %d (prefix %s): %w", id, prefix, err)
				}
				tc.mu.Lock()
				ok := tc.trackID == id && tc.trackAddr == track && (tc.userAddr == "" || tc.userAddr == track)
				if ok {
					tc.healthy = true
					tc.readers = readers
				}
				tc.mu.Unlock()
				if !ok {
					return confirmed, errors.New("the tracking connection was replaced")
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
	tc.trackID = 0
}

// flushLocked is flush, with tc.mu held.
func (tc *trackedCache) flushLocked() {
	tc.healthy = false
	tc.readers = nil
	tc.dropLocked()
}

// dropLocked drops every entry and cancels the reads in flight, with tc.mu
// held.
func (tc *trackedCache) dropLocked() {
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
	readers := tc.readers
	tc.mu.Unlock()

	sent := time.Now()
	var get *redis.StringCmd
	var pttl *redis.DurationCmd
	_, err := readers.Pipelined(ctx, func(p redis.Pipeliner) error {
		get = p.Get(ctx, key)
		pttl = p.PTTL(ctx, key)
		return nil
	})
	v, gerr := get.Result()
	left, terr := pttl.Result()

	tc.mu.Lock()
	defer tc.mu.Unlock()
	// mine: neither an invalidation of the key, nor a flush, nor the end of
	// a reader connection came while the read was in flight (each clears
	// the pending read, and only a flush makes the cache unhealthy).
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

// State returns the cache's generation (incremented by every flush and
// every end of a reader connection) and
// whether its tracking connection is confirmed (tests).
func (tc *trackedCache) State() (gen uint64, healthy bool) {
	tc.mu.Lock()
	defer tc.mu.Unlock()
	return tc.gen, tc.healthy
}

// watchedConn is a reader connection whose end is seen when it happens: a
// goroutine reads the socket at all times and hands what it read to
// go-redis through a pipe, so the end of an idle connection (CLIENT KILL,
// the server's timeout, a reset) is read as soon as it arrives, as an
// invalidation would be, not at the connection's next use. lost is called
// once, on Close (before the socket is closed) or on the first error of a
// read or a write.
type watchedConn struct {
	net.Conn          // the socket: writes, addresses, write deadlines
	r, w     net.Conn // the pipe: go-redis reads r
	lost     func()
	once     sync.Once
}

func watch(cn net.Conn, lost func()) *watchedConn {
	r, w := net.Pipe()
	wc := &watchedConn{Conn: cn, r: r, w: w, lost: lost}
	go wc.pump()
	return wc
}

func (wc *watchedConn) pump() {
	buf := make([]byte, 32<<10)
	for {
		n, err := wc.Conn.Read(buf)
		if n > 0 {
			if _, werr := wc.w.Write(buf[:n]); werr != nil && err == nil {
				err = werr
			}
		}
		if err != nil {
			wc.end()
			return
		}
	}
}

func (wc *watchedConn) end() {
	wc.once.Do(func() {
		wc.lost()
		wc.Conn.Close()
		wc.w.Close()
		wc.r.Close()
	})
}

func (wc *watchedConn) Read(p []byte) (int, error) { return wc.r.Read(p) }

func (wc *watchedConn) Write(p []byte) (int, error) {
	n, err := wc.Conn.Write(p)
	if err != nil {
		wc.end()
	}
	return n, err
}

func (wc *watchedConn) Close() error {
	wc.end()
	return nil
}

func (wc *watchedConn) SetDeadline(t time.Time) error {
	if err := wc.r.SetReadDeadline(t); err != nil {
		return err
	}
	return wc.Conn.SetWriteDeadline(t)
}

func (wc *watchedConn) SetReadDeadline(t time.Time) error { return wc.r.SetReadDeadline(t) }
