package boltstore

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"time"

	"github.com/idemgo/idem"
	bolt "go.etcd.io/bbolt"
	bolterrors "go.etcd.io/bbolt/errors"
)

// Defaults of the options.
const (
	// DefaultLockTimeout is how long Open waits for the file lock.
	DefaultLockTimeout = time.Second
	// DefaultSweepInterval is how often expired records are looked for
	// while the store is idle.
	DefaultSweepInterval = time.Minute
)

// Option configures a Store.
type Option func(*config)

type config struct {
	now           func() time.Time
	lockTimeout   time.Duration
	sweepInterval time.Duration
}

// WithClock sets the store's clock, which plays the part of the Redis
// server's clock: lease expiry, retention and fence seeds are computed from
// it. The default is time.Now.
func WithClock(now func() time.Time) Option { return func(c *config) { c.now = now } }

// WithLockTimeout sets how long Open waits for the file's lock when another
// process or Store holds it, before it returns an error wrapping ErrLocked.
// The default is DefaultLockTimeout (1s); it must be positive.
func WithLockTimeout(d time.Duration) Option { return func(c *config) { c.lockTimeout = d } }

// WithSweepInterval sets how often a background goroutine deletes expired
// records while the store is idle (every write also deletes a few). Zero
// disables the goroutine. The default is DefaultSweepInterval (1m); it must
// not be negative.
func WithSweepInterval(d time.Duration) Option { return func(c *config) { c.sweepInterval = d } }

// Bucket and key names in the bolt file.
var (
	bucketRecords = []byte("records") // store key -> encoded record
	bucketExpiry  = []byte("expiry")  // expiryKey(expiresAt, store key) -> empty
	bucketMeta    = []byte("meta")
	metaFormat    = []byte("format") // one byte: formatVersion
	metaFence     = []byte("fence")  // 8 bytes big-endian: the last fence issued
)

// formatVersion is the layout of the file (buckets and meta keys). Records
// carry their own version byte.
const formatVersion = 1

// Store is a durable idem.Store and idem.Watcher in one bbolt file. It is
// safe for concurrent use by multiple goroutines of one process; the file is
// locked so that no other process (or Store) can open it at the same time.
// Every method that changes a record returns only after the change is
// fsynced. The zero value is not usable; call Open.
type Store struct {
	db            *bolt.DB
	now           func() time.Time
	sweepInterval time.Duration

	mu     sync.RWMutex // held for reading while a method uses db or queue
	closed bool
	queue  chan *op // to the writer goroutine

	lastFence int64 // the last fence issued; owned by the writer goroutine

	writerDone chan struct{}
	stopSweep  chan struct{}
	sweepDone  chan struct{}
	closeOnce  sync.Once
	closeErr   error

	wmu      sync.Mutex
	watchers map[string]*watch
}

var (
	_ idem.Store   = (*Store)(nil)
	_ idem.Watcher = (*Store)(nil)
	_ idem.Relayer = (*Store)(nil)
)

// Open opens the store kept in the file at path, creating the file (not its
// directory) if it does not exist. If another process or Store has the
// file open, Open waits for the lock as long as WithLockTimeout says and
// then returns an error wrapping ErrLocked. A file written by another
// program, or by an incompatible version of this package, or damaged
// (truncated, pages overwritten), is rejected with an error wrapping
// ErrCorrupt, never a panic: Open first reads every page of an existing
// file's B+trees read-only, which about doubles the time it takes to open
// one. Invalid options yield an error wrapping
// idem.ErrInvalid. Call Close when done.
func Open(path string, opts ...Option) (*Store, error) {
	c := config{now: time.Now, lockTimeout: DefaultLockTimeout, sweepInterval: DefaultSweepInterval}
	for _, o := range opts {
		o(&c)
	}
	switch {
	case path == "":
		return nil, fmt.Errorf("%w: empty path", idem.ErrInvalid)
	case c.now == nil:
		return nil, fmt.Errorf("%w: nil clock", idem.ErrInvalid)
	case c.lockTimeout <= 0:
		return nil, fmt.Errorf("%w: lock timeout %v is not positive", idem.ErrInvalid, c.lockTimeout)
	case c.sweepInterval < 0:
		return nil, fmt.Errorf("%w: sweep interval %v is negative", idem.ErrInvalid, c.sweepInterval)
	}
	_, statErr := os.Stat(path)
	created := errors.Is(statErr, os.ErrNotExist)
	if !created {
		if err := verify(path, c.lockTimeout); err != nil {
			return nil, err
		}
	}
	db, err := openRecovering(path, &bolt.Options{
		Timeout: c.lockTimeout,
		// As in etcd: the free list is rebuilt by a scan on open instead of
		// being written by every commit, which makes commits cheaper.
		NoFreelistSync: true,
		FreelistType:   bolt.FreelistMapType,
	})
	if errors.Is(err, bolterrors.ErrTimeout) {
		return nil, fmt.Errorf("%w: %s is open in another process or Store (waited %v for its lock)", ErrLocked, path, c.lockTimeout)
	}
	if err != nil {
		return nil, fmt.Errorf("boltstore: open %s: %w", path, err)
	}
	s := &Store{
		db:            db,
		now:           c.now,
		sweepInterval: c.sweepInterval,
		queue:         make(chan *op, 4*maxBatch),
		writerDone:    make(chan struct{}),
		stopSweep:     make(chan struct{}),
		sweepDone:     make(chan struct{}),
		watchers:      make(map[string]*watch),
	}
	if err := db.Update(s.init); err != nil {
		db.Close()
		return nil, fmt.Errorf("boltstore: %s: %w", path, err)
	}
	if created {
		// Make the new file's directory entry durable too, so that a crash
		// right after the first commits cannot lose the whole file.
		if err := syncDir(filepath.Dir(path)); err != nil {
			db.Close()
			return nil, fmt.Errorf("boltstore: %w", err)
		}
	}
	go s.writer()
	if s.sweepInterval > 0 {
		go s.sweeper()
	} else {
		close(s.sweepDone)
	}
	return s, nil
}

func syncDir(dir string) error {
	d, err := os.Open(dir)
	if err != nil {
		return err
	}
	defer d.Close()
	if err := d.Sync(); err != nil {
		return fmt.Errorf("sync %s: %w", dir, err)
	}
	return nil
}

// init creates the buckets of a new file, or checks those of an existing
// one, and loads the last fence issued.
func (s *Store) init(tx *bolt.Tx) error {
	meta := tx.Bucket(bucketMeta)
	if meta == nil {
		foreign := false
		_ = tx.ForEach(func(name []byte, _ *bolt.Bucket) error {
			foreign = true
			return nil
		})
		if foreign {
			return fmt.Errorf("%w: not a boltstore file (it holds other buckets and no %q bucket)", ErrCorrupt, bucketMeta)
		}
		var err error
		if meta, err = tx.CreateBucket(bucketMeta); err != nil {
			return err
		}
		if err := meta.Put(metaFormat, []byte{formatVersion}); err != nil {
			return err
		}
	}
	if v := meta.Get(metaFormat); len(v) != 1 || v[0] != formatVersion {
		return fmt.Errorf("%w: file format %v, this version of boltstore reads format [%d]", ErrCorrupt, v, formatVersion)
	}
	for _, name := range [][]byte{bucketRecords, bucketExpiry} {
		if _, err := tx.CreateBucketIfNotExists(name); err != nil {
			return err
		}
	}
	if v := meta.Get(metaFence); v != nil {
		if len(v) != 8 {
			return fmt.Errorf("%w: last fence of %d bytes", ErrCorrupt, len(v))
		}
		s.lastFence = int64(binary.BigEndian.Uint64(v))
	}
	return nil
}

// Close stops the store's goroutines, waits for pending writes to be
// committed and closes the file. Watch channels are closed. Methods called
// after Close return ErrClosed; Close itself may be called more than once.
func (s *Store) Close() error {
	s.closeOnce.Do(func() {
		close(s.stopSweep)
		<-s.sweepDone
		s.mu.Lock()
		s.closed = true
		close(s.queue)
		s.mu.Unlock()
		<-s.writerDone
		s.closeErr = s.db.Close()
		s.wmu.Lock()
		for k, w := range s.watchers {
			close(w.ch)
			delete(s.watchers, k)
		}
		s.wmu.Unlock()
	})
	return s.closeErr
}

// Path returns the path of the store's file.
func (s *Store) Path() string { return s.db.Path() }

func (s *Store) micros() int64 { return s.now().UnixMicro() }

// view runs fn in a read-only transaction.
func (s *Store) view(fn func(tx *bolt.Tx) error) error {
	s.mu.RLock()
	defer s.mu.RUnlock()
	if s.closed {
		return ErrClosed
	}
	return s.db.View(fn)
}

// readRecord returns the record of key in a read transaction, expired or
// not, or nil. Its result aliases the file: copy it before the transaction
// ends.
func readRecord(tx *bolt.Tx, key string) (*record, error) {
	v := tx.Bucket(bucketRecords).Get([]byte(key))
	if v == nil {
		return nil, nil
	}
	r, err := decode(v, false)
	if err != nil {
		return nil, fmt.Errorf("boltstore: key %s: %w", key, err)
	}
	return r, nil
}

// Acquire implements idem.Store. Outcomes that change nothing (Replay,
// InProgress, Mismatch, and Acquired for a repeated call of the owner) are
// answered from a read transaction; the others are committed to disk before
// Acquire returns.
func (s *Store) Acquire(ctx context.Context, key string, req idem.AcquireRequest) (idem.Acquisition, error) {
	if err := idem.ValidateStoreKey(key); err != nil {
		return idem.Acquisition{}, err
	}
	if err := req.Validate(); err != nil {
		return idem.Acquisition{}, err
	}
	if err := ctx.Err(); err != nil {
		return idem.Acquisition{}, err
	}
	var out idem.Acquisition
	answered := false
	err := s.view(func(tx *bolt.Tx) error {
		r, err := readRecord(tx, key)
		if err != nil || r == nil {
			return err
		}
		now := s.micros()
		if r.expiresAt <= now {
			return nil
		}
		out, answered = r.settled(req, now)
		return nil
	})
	if err != nil || answered {
		return out, err
	}
	err = s.write(ctx, func(t *txn) error {
		out = idem.Acquisition{}
		return t.acquire(key, req, &out)
	})
	return out, err
}

// settled returns the outcome of an Acquire of the live record r that
// changes nothing, if it is one: Mismatch, Replay, InProgress, or Acquired
// for a repeated call by the owner. The result is copied.
func (r *record) settled(req idem.AcquireRequest, now int64) (idem.Acquisition, bool) {
	if r.fingerprint != req.Fingerprint {
		return idem.Acquisition{Outcome: idem.Mismatch}, true
	}
	switch r.state {
	case idem.StateCompleted, idem.StateFailed:
		return idem.Acquisition{Outcome: idem.Replay, State: r.state, Result: clone(r.result), Attempts: r.attempts}, true
	case idem.StateInProgress:
		if r.owner == req.Owner { // a repeated call whose reply was lost
			return idem.Acquisition{Outcome: idem.Acquired, Lease: idem.Lease{Owner: r.owner, Fence: r.fence}, Attempts: r.attempts}, true
		}
		if r.leaseUntil > now {
			return idem.Acquisition{Outcome: idem.InProgress, RetryAfter: time.Duration(r.leaseUntil-now) * time.Microsecond, Attempts: r.attempts}, true
		}
	}
	return idem.Acquisition{}, false
}

func clone(b []byte) []byte {
	if len(b) == 0 {
		return nil
	}
	return append([]byte(nil), b...)
}

// acquire is Acquire's transition, as memstore makes it.
func (t *txn) acquire(key string, req idem.AcquireRequest, out *idem.Acquisition) error {
	now := t.now
	lease := req.Lease.Microseconds()
	sl, err := t.load(key)
	if err != nil {
		return err
	}
	r := sl.live
	if r == nil {
		r = &record{
			state:       idem.StateInProgress,
			fingerprint: req.Fingerprint,
			owner:       req.Owner,
			fence:       t.nextFence(0),
			attempts:    1,
			created:     now,
			leaseUntil:  now + lease,
			expiresAt:   now + 2*lease + grace,
		}
		*out = idem.Acquisition{Outcome: idem.Acquired, Lease: idem.Lease{Owner: r.owner, Fence: r.fence}, Attempts: 1}
		return t.save(sl, r)
	}
	if a, ok := r.settled(req, now); ok {
		*out = a
		return nil
	}
	// RELEASED, or IN_PROGRESS with an expired lease.
	if req.MaxAttempts > 0 && r.attempts >= req.MaxAttempts {
		r.state, r.owner, r.leaseUntil, r.result = idem.StateFailed, "", 0, nil
		r.expiresAt = now + req.Retention.Microseconds()
		*out = idem.Acquisition{Outcome: idem.Replay, State: idem.StateFailed, Attempts: r.attempts}
		return t.save(sl, r)
	}
	*out = idem.Acquisition{Outcome: idem.Acquired}
	if r.state == idem.StateInProgress {
		out.Outcome, out.PreviousOwner = idem.TakenOver, r.owner
	}
	r.state, r.owner = idem.StateInProgress, req.Owner
	r.fence = t.nextFence(r.fence)
	r.attempts++
	r.leaseUntil = now + lease
	r.expiresAt = now + 2*lease + grace
	r.result = nil
	out.Lease = idem.Lease{Owner: r.owner, Fence: r.fence}
	out.Attempts = r.attempts
	return t.save(sl, r)
}

// grace is idem.InProgressGrace in µs: how long, beyond one more lease, an
// IN_PROGRESS record whose lease ended is kept.
var grace = idem.InProgressGrace.Microseconds()

func checkOwner(ctx context.Context, key string, lease idem.Lease) error {
	if err := idem.ValidateStoreKey(key); err != nil {
		return err
	}
	if err := idem.ValidateLease(lease); err != nil {
		return err
	}
	return ctx.Err()
}

// owned runs change on key's record if lease still owns it. If repeated
// (which may be nil) reports that the live record is what this very call
// left when it ran before (its reply was lost), owned changes nothing and
// returns nil. Otherwise it returns an error wrapping idem.ErrLeaseLost and
// changes nothing.
func (s *Store) owned(ctx context.Context, key string, lease idem.Lease, size int, repeated func(r *record) bool, change func(t *txn, r *record)) error {
	var lost error
	err := s.writeSized(ctx, size, func(t *txn) error {
		lost = nil
		sl, err := t.load(key)
		if err != nil {
			return err
		}
		r := sl.live
		if r != nil && repeated != nil && repeated(r) {
			return nil
		}
		if r == nil {
			lost = fmt.Errorf("%w: no record", idem.ErrLeaseLost)
			return nil
		}
		if r.state != idem.StateInProgress || r.owner != lease.Owner || r.fence != lease.Fence {
			lost = fmt.Errorf("%w: record is %v with fence %d", idem.ErrLeaseLost, r.state, r.fence)
			return nil
		}
		change(t, r)
		return t.save(sl, r)
	})
	if err != nil {
		return err
	}
	return lost
}

// Complete implements idem.Store. It returns once the result is on disk.
func (s *Store) Complete(ctx context.Context, key string, lease idem.Lease, result []byte, retention time.Duration) error {
	if err := checkOwner(ctx, key, lease); err != nil {
		return err
	}
	if err := idem.ValidateDuration("retention", retention); err != nil {
		return err
	}
	repeated := func(r *record) bool {
		return r.state == idem.StateCompleted && r.fence == lease.Fence && bytes.Equal(r.result, result)
	}
	return s.owned(ctx, key, lease, len(result), repeated, func(t *txn, r *record) {
		r.state, r.result, r.leaseUntil = idem.StateCompleted, result, 0
		r.expiresAt = t.now + retention.Microseconds()
		t.notify(key)
	})
}

// RelayCompletion implements idem.Relayer. It returns once the record is
// on disk.
func (s *Store) RelayCompletion(ctx context.Context, key string, c idem.Completion) error {
	if err := idem.ValidateStoreKey(key); err != nil {
		return err
	}
	if err := c.Validate(); err != nil {
		return err
	}
	if err := ctx.Err(); err != nil {
		return err
	}
	return s.writeSized(ctx, len(c.Result), func(t *txn) error {
		sl, err := t.load(key)
		if err != nil {
			return err
		}
		r := sl.live
		if r == nil {
			r = &record{attempts: 1, created: t.now}
		} else if r.state == idem.StateCompleted {
			return nil // the first completion stays
		}
		r.state, r.fingerprint, r.owner, r.result, r.leaseUntil = idem.StateCompleted, c.Fingerprint, "", c.Result, 0
		r.fence = max(r.fence, c.Fence)
		if r.fence > t.lastFence {
			t.lastFence, t.fenceSet = r.fence, true
		}
		r.expiresAt = t.now + c.Retention.Microseconds()
		t.notify(key)
		return t.save(sl, r)
	})
}

// Fail implements idem.Store.
func (s *Store) Fail(ctx context.Context, key string, lease idem.Lease, f idem.Failure) (idem.State, error) {
	if err := checkOwner(ctx, key, lease); err != nil {
		return 0, err
	}
	if err := f.Validate(); err != nil {
		return 0, err
	}
	var state idem.State
	repeated := func(r *record) bool {
		if (r.state == idem.StateReleased || r.state == idem.StateFailed) && r.fence == lease.Fence {
			state = r.state
			return true
		}
		return false
	}
	err := s.owned(ctx, key, lease, len(f.Result), repeated, func(t *txn, r *record) {
		r.leaseUntil = 0
		r.expiresAt = t.now + f.Retention.Microseconds()
		if f.Terminal || (f.MaxAttempts > 0 && r.attempts >= f.MaxAttempts) {
			r.state, r.result = idem.StateFailed, f.Result
		} else {
			r.state, r.result = idem.StateReleased, nil
		}
		state = r.state
		t.notify(key)
	})
	if err != nil {
		return 0, err
	}
	return state, nil
}

// Extend implements idem.Store.
func (s *Store) Extend(ctx context.Context, key string, lease idem.Lease, d time.Duration) error {
	if err := checkOwner(ctx, key, lease); err != nil {
		return err
	}
	if err := idem.ValidateDuration("lease", d); err != nil {
		return err
	}
	return s.owned(ctx, key, lease, 0, nil, func(t *txn, r *record) {
		r.leaseUntil = t.now + d.Microseconds()
		r.expiresAt = r.leaseUntil + d.Microseconds() + grace
	})
}

// Release implements idem.Store.
func (s *Store) Release(ctx context.Context, key string, lease idem.Lease, retention time.Duration) error {
	if err := checkOwner(ctx, key, lease); err != nil {
		return err
	}
	if err := idem.ValidateDuration("retention", retention); err != nil {
		return err
	}
	repeated := func(r *record) bool {
		return r.state == idem.StateReleased && r.fence == lease.Fence
	}
	return s.owned(ctx, key, lease, 0, repeated, func(t *txn, r *record) {
		r.state, r.leaseUntil, r.result = idem.StateReleased, 0, nil
		r.expiresAt = t.now + retention.Microseconds()
		t.notify(key)
	})
}

// Get implements idem.Store. The returned Result is a copy.
func (s *Store) Get(ctx context.Context, key string) (idem.Record, error) {
	if err := idem.ValidateStoreKey(key); err != nil {
		return idem.Record{}, err
	}
	if err := ctx.Err(); err != nil {
		return idem.Record{}, err
	}
	var rec idem.Record
	found := false
	err := s.view(func(tx *bolt.Tx) error {
		r, err := readRecord(tx, key)
		if err != nil || r == nil {
			return err
		}
		now := s.micros()
		if r.expiresAt <= now {
			return nil
		}
		rec, found = r.public(now), true
		return nil
	})
	if err != nil {
		return idem.Record{}, err
	}
	if !found {
		return idem.Record{}, idem.ErrNotFound
	}
	return rec, nil
}

// public returns r as an idem.Record read at now, with a copy of the
// result.
func (r *record) public(now int64) idem.Record {
	rec := idem.Record{
		State:       r.state,
		Fingerprint: r.fingerprint,
		Owner:       r.owner,
		Fence:       r.fence,
		Attempts:    r.attempts,
		Created:     time.UnixMicro(r.created),
		ExpiresAt:   time.UnixMicro(r.expiresAt),
		Now:         time.UnixMicro(now),
		Result:      append([]byte(nil), r.result...),
	}
	if r.state == idem.StateInProgress {
		rec.LeaseUntil = time.UnixMicro(r.leaseUntil)
	}
	return rec
}

// Delete implements idem.Store. It returns once the deletion is on disk. It
// also removes a record that cannot be decoded (see ErrCorrupt).
func (s *Store) Delete(ctx context.Context, key string) error {
	if err := idem.ValidateStoreKey(key); err != nil {
		return err
	}
	if err := ctx.Err(); err != nil {
		return err
	}
	return s.write(ctx, func(t *txn) error {
		t.notify(key)
		return t.remove(key)
	})
}

// Entry is a record listed by List.
type Entry struct {
	// Key is the store key (a digest made by idem.Key.Digest).
	Key    string
	Record idem.Record
}

// List returns up to limit live (unexpired) records in the order of their
// keys, for admin tools. Results are copies. limit must be positive. List
// reads one consistent snapshot; writes go on while it runs.
func (s *Store) List(ctx context.Context, limit int) ([]Entry, error) {
	if limit <= 0 {
		return nil, fmt.Errorf("%w: list limit %d is not positive", idem.ErrInvalid, limit)
	}
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	var out []Entry
	err := s.view(func(tx *bolt.Tx) error {
		now := s.micros()
		c := tx.Bucket(bucketRecords).Cursor()
		n := 0
		for k, v := c.First(); k != nil && len(out) < limit; k, v = c.Next() {
			if n++; n%1024 == 0 {
				if err := ctx.Err(); err != nil {
					return err
				}
			}
			r, err := decode(v, false)
			if err != nil {
				return fmt.Errorf("boltstore: key %s: %w", k, err)
			}
			if r.expiresAt <= now {
				continue
			}
			out = append(out, Entry{Key: string(k), Record: r.public(now)})
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	return out, nil
}
