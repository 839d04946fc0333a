package main

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/idemgo/idem/adapterkit"
	"github.com/idemgo/idem/internal/fsync"
	"github.com/idemgo/idem/storekit"
	"github.com/redis/go-redis/v9"
	"github.com/redis/rueidis"
)

// The floor rows bound what any idempotency middleware on Redis that
// records before success can reach on this machine, with each client: per
// request, the least such a middleware must do, and nothing else. One round
// trip before the handler claims the key (SET key p NX GET PX: no Lua, no
// record to build or decode); the handler's response is held back in a
// buffer; one round trip after it stores the body (SET key body PX), and
// the response goes out. A key that exists is answered with its stored
// body (one round trip), or 409 while it is claimed.
//
// It checks no fingerprint, keeps no owner, fence, lease or status code,
// and loses a claim to a crash until its TTL: it is not a middleware to
// use, only the cost of the two round trips and the held response that
// record before success needs. A target above floor / peer on the same
// cells is out of reach for any design that keeps that guarantee.

// floorStore is the two commands of the floor, on one client.
type floorStore interface {
	// claim sets key to a claim marker if it does not exist and returns
	// the value it had (found false: none, the key is claimed now).
	claim(ctx context.Context, key string) (old string, found bool, err error)
	// store sets key to body.
	store(ctx context.Context, key string, body []byte) error
}

const (
	floorClaim = "p"
	floorTTL   = time.Minute
	floorKeep  = 24 * time.Hour
)

type floorGoRedis struct{ c *redis.Client }

func (f floorGoRedis) claim(ctx context.Context, key string) (string, bool, error) {
	v, err := f.c.SetArgs(ctx, key, floorClaim, redis.SetArgs{Mode: "NX", Get: true, TTL: floorTTL}).Result()
	if errors.Is(err, redis.Nil) {
		return "", false, nil
	}
	return v, err == nil, err
}

func (f floorGoRedis) store(ctx context.Context, key string, body []byte) error {
	return f.c.Set(ctx, key, body, floorKeep).Err()
}

type floorRueidis struct{ c rueidis.Client }

func (f floorRueidis) claim(ctx context.Context, key string) (string, bool, error) {
	v, err := f.c.Do(ctx, f.c.B().Set().Key(key).Value(floorClaim).Nx().Get().Px(floorTTL).Build()).ToString()
	if rueidis.IsRedisNil(err) {
		return "", false, nil
	}
	return v, err == nil, err
}

func (f floorRueidis) store(ctx context.Context, key string, body []byte) error {
	return f.c.Do(ctx, f.c.B().Set().Key(key).Value(rueidis.BinaryString(body)).Px(floorKeep).Build()).Error()
}

// floorMiddleware wraps next in the floor's two round trips on s; keys are
// the Idempotency-Key header under prefix.
func floorMiddleware(s floorStore, prefix string, next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		key := prefix + r.Header.Get("Idempotency-Key")
		old, found, err := s.claim(r.Context(), key)
		switch {
		case err != nil:
			http.Error(w, err.Error(), http.StatusServiceUnavailable)
			return
		case found && old == floorClaim:
			http.Error(w, "in progress", http.StatusConflict)
			return
		case found:
			w.Write([]byte(old))
			return
		}
		serveHeld(w, r, next, func(body []byte) error { return s.store(r.Context(), key, body) })
	})
}

// scriptFloor is the floor of idem's own Redis work: the bare handler
// behind the two scripts that redisstore sends per new key (acquire.lua
// and complete.lua, found by internal/storescripts), on rueidis, the client
// that pipelines best, and nothing else: no Executor, no lease heartbeat,
// no fingerprint (a constant), an owner token from a counter, and the
// handler's body stored as the result, unencoded. complete publishes on
// the key's channel, as the store does by default (WithNotify). Each
// script reads the record, checks it and writes it in one atomic step at
// the server's time, which is what the state machine needs on Redis 7.0
// (docs/design.md#the-state-machine); the floor rows' plain SETs check
// nothing. So a target above script floor / peer on the same cells is out of
// reach for idemhttp on either client: what separates the two is idem's Go
// code and the client's, which this floor leaves out.
type scriptFloor struct {
	c                       rueidis.Client
	acquireSHA, completeSHA string
	// ARGV of acquire after the fingerprint and the owner, and the
	// retention of complete, as strings (see acquire.lua).
	lease, retention, ttl string
	owners                atomic.Uint64 // numbers the owner tokens
}

func newScriptFloor(c rueidis.Client, acquireSHA, completeSHA string) *scriptFloor {
	ms := func(d time.Duration) string { return strconv.FormatInt(d.Milliseconds(), 10) }
	return &scriptFloor{
		c: c, acquireSHA: acquireSHA, completeSHA: completeSHA,
		lease: ms(adapterkit.DefaultLease), retention: ms(floorKeep),
		ttl: ms(2*adapterkit.DefaultLease + storekit.InProgressGrace),
	}
}

// middleware wraps next in the two scripts; keys are the Idempotency-Key
// header under prefix.
func (f *scriptFloor) middleware(prefix string, next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		ctx := r.Context()
		key := prefix + r.Header.Get("Idempotency-Key")
		owner := strconv.FormatUint(f.owners.Add(1), 10)
		res := f.c.Do(ctx, f.c.B().Evalsha().Sha1(f.acquireSHA).Numkeys(1).Key(key).
			Arg("fp", owner, f.lease, f.ttl /* no attempt limit */).Build())
		var kind, fence int64
		reply, err := res.ToArray()
		if n, ierr := res.AsInt64(); ierr == nil {
			// A new record: its fence alone.
			kind, fence, err = 0, n, nil
		} else if err == nil && len(reply) > 0 {
			kind, err = reply[0].AsInt64()
		}
		if err != nil {
			http.Error(w, err.Error(), http.StatusServiceUnavailable)
			return
		}
		switch kind {
		case 0:
		case 1: // acquired: {1, fence, attempts}
			if fence, err = reply[1].AsInt64(); err != nil {
				http.Error(w, err.Error(), http.StatusServiceUnavailable)
				return
			}
		case 4: // replay: {4, state, attempts, result}
			if len(reply) == 4 {
				body, _ := reply[3].ToString()
				w.Write([]byte(body))
				return
			}
			http.Error(w, "bad reply", http.StatusServiceUnavailable)
			return
		default:
			http.Error(w, "in progress", http.StatusConflict)
			return
		}
		serveHeld(w, r, next, func(body []byte) error {
			done, err := f.c.Do(ctx, f.c.B().Evalsha().Sha1(f.completeSHA).Numkeys(1).Key(key).
				Arg(owner, strconv.FormatInt(fence, 10), rueidis.BinaryString(body), f.retention, "PUBLISH", key+":w").Build()).AsInt64()
			if err == nil && done != 1 {
				err = errors.New("lease lost")
			}
			return err
		})
	})
}

// serveHeld runs next with its response held back, stores the body with
// store, and sends the response once it is stored (503 if it is not).
func serveHeld(w http.ResponseWriter, r *http.Request, next http.Handler, store func(body []byte) error) {
	rec := &heldResponse{header: w.Header(), status: http.StatusOK}
	next.ServeHTTP(rec, r)
	if err := store(rec.body.Bytes()); err != nil {
		http.Error(w, err.Error(), http.StatusServiceUnavailable)
		return
	}
	w.WriteHeader(rec.status)
	w.Write(rec.body.Bytes())
}

// heldResponse holds a handler's response back: its header is the real
// writer's, its status and body are kept.
type heldResponse struct {
	header http.Header
	status int
	body   bytes.Buffer
}

func (h *heldResponse) Header() http.Header         { return h.header }
func (h *heldResponse) WriteHeader(code int)        { h.status = code }
func (h *heldResponse) Write(p []byte) (int, error) { return h.body.Write(p) }

// floorFile is the floor of a store on local disk, for the idem proxy on
// its embedded store: the least that a store which makes every transition
// durable before it answers must do. Each of the two writes is appended to
// one log and fdatasynced before it returns, in groups (one pwrite and one
// fdatasync for every write that queued while the previous group synced,
// as a write-ahead log or boltstore's writer does), into a region of the
// file written with zeros when it is opened and used in a circle, so that
// a sync flushes data blocks and no file size; the values are kept in
// memory. No index on disk, no recovery, no expiry, no record: only the
// cost of two synced writes per request.
type floorFile struct {
	f *os.File

	mu      sync.Mutex
	vals    map[string]string
	pending []byte          // appended since the last group was taken
	waiters []chan struct{} // the writers of pending but the one syncing
	syncing bool            // a caller writes and syncs a group
	at      int64           // where the next group is written
	err     error           // the first write or sync error; final
}

// floorLogSize is the size of floorFile's circular log.
const floorLogSize = 64 << 20

// openFloorFile creates the log in dir.
func openFloorFile(dir string) (*floorFile, error) {
	f, err := os.OpenFile(filepath.Join(dir, "floor.log"), os.O_RDWR|os.O_CREATE|os.O_TRUNC, 0o600)
	if err != nil {
		return nil, err
	}
	zeros := make([]byte, 1<<20)
	for off := int64(0); off < floorLogSize; off += int64(len(zeros)) {
		if _, err := f.WriteAt(zeros, off); err != nil {
			f.Close()
			return nil, err
		}
	}
	if err := f.Sync(); err != nil {
		f.Close()
		return nil, err
	}
	return &floorFile{f: f, vals: map[string]string{}}, nil
}

func (s *floorFile) claim(_ context.Context, key string) (string, bool, error) {
	s.mu.Lock()
	if v, ok := s.vals[key]; ok {
		s.mu.Unlock()
		return v, true, nil
	}
	s.vals[key] = floorClaim
	return "", false, s.appendLocked(key, floorClaim)
}

func (s *floorFile) store(_ context.Context, key string, body []byte) error {
	s.mu.Lock()
	s.vals[key] = string(body)
	return s.appendLocked(key, string(body))
}

// appendLocked appends one record (key, value) to the log, with s.mu held,
// which it releases; it returns once the record is synced. The first
// caller to find no group syncing writes and syncs the pending records,
// then the ones that queued meanwhile, until none is left; after an error
// nothing more is written, and every queued write gets the error.
func (s *floorFile) appendLocked(key, val string) error {
	s.pending = appendFloorRecord(s.pending, key, val)
	if s.syncing {
		done := make(chan struct{})
		s.waiters = append(s.waiters, done)
		s.mu.Unlock()
		<-done
		s.mu.Lock()
		defer s.mu.Unlock()
		return s.err
	}
	s.syncing = true
	var buf []byte
	for len(s.pending) > 0 {
		buf, s.pending = s.pending, buf[:0]
		waiters := s.waiters
		s.waiters = nil
		if s.err == nil {
			at := s.at
			if at+int64(len(buf)) > floorLogSize {
				at = 0
			}
			s.at = at + int64(len(buf))
			s.mu.Unlock()
			_, err := s.f.WriteAt(buf, at)
			if err == nil {
				err = fsync.Data(s.f)
			}
			s.mu.Lock()
			if err != nil && s.err == nil {
				s.err = err
			}
		}
		for _, w := range waiters {
			close(w)
		}
	}
	s.syncing = false
	err := s.err
	s.mu.Unlock()
	return err
}

// appendFloorRecord appends the log record of (key, value) to b.
func appendFloorRecord(b []byte, key, val string) []byte {
	b = binary.AppendUvarint(b, uint64(len(key)))
	b = append(b, key...)
	b = binary.AppendUvarint(b, uint64(len(val)))
	return append(b, val...)
}
