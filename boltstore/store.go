package boltstore

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/binary"
	"errors"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"syscall"
	"time"

	"github.com/idemgo/idem"
	"github.com/idemgo/idem/storekit"
	"github.com/idemgo/idem/storekit/statemachine"
	"github.com/idemgo/idem/storekit/watchset"
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
	logLimit      int64
	trustLogEnd   bool
}

// WithClock sets the store's clock, which plays the part of the Redis
// server's clock: lease expiry, retention and fence seeds are computed from
// it. The default is time.Now.
func WithClock(now func() time.Time) Option { return func(c *config) { c.now = now } }

// WithLockTimeout sets how long Open waits for the file's lock when another
// process or Store holds it, before it returns an error wrapping ErrLocked.
// The default is DefaultLockTimeout (1s); it must be positive.
func WithLockTimeout(d time.Duration) Option { return func(c *config) { c.lockTimeout = d } }

// withLogLimit sets the size of the log beyond which the writer makes a
// checkpoint (defaultLogLimit); tests make it small.
func withLogLimit(n int64) Option { return func(c *config) { c.logLimit = n } }

// withTrustedLogEnd makes Open end each log file's frames at the first
// that is not whole, without looking for damage, as before the frames were
// numbered: the negative control of the tests of damage.
func withTrustedLogEnd() Option { return func(c *config) { c.trustLogEnd = true } }

// WithSweepInterval sets how often a background goroutine deletes expired
// records and applies the log to the file while the store is idle (every
// checkpoint also deletes some). Zero disables the goroutine. The default
// is DefaultSweepInterval (1m); it must not be negative.
func WithSweepInterval(d time.Duration) Option { return func(c *config) { c.sweepInterval = d } }

// Bucket and key names in the bolt file.
var (
	bucketRecords = []byte("records") // store key -> encoded record
	bucketExpiry  = []byte("expiry")  // expiryKey(expiresAt, store key) -> empty
	bucketMeta    = []byte("meta")
	metaFormat    = []byte("format") // one byte: formatVersion
	metaFence     = []byte("fence")  // 8 bytes big-endian: the last fence issued
)

// formatVersion is the layout of the file (buckets and meta keys) and of
// the log's frames. Records carry their own version byte. Version 2 has
// the log (meta log and logsecret, and the log files beside the file);
// version 3 numbers the log's frames (meta logseq, and a header of 28
// bytes). Open turns a file of version 1 into one of version 3 at once,
// and one of version 2 with the checkpoint that applies its log (read as
// version 2 wrote it), so that a version of this package that would not
// read the log right refuses the file instead.
const formatVersion = 3

// Store is a durable storekit.Store and storekit.Watcher in one bbolt file. It is
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

	lastFence int64    // the last fence issued; owned by the writer goroutine
	log       *wal     // owned by the writer goroutine
	logStart  logStart // where the log starts, as the file said when opened

	// overlay holds the encoded records (deleted for a deletion) that the
	// log holds and the file does not yet: reads look here first, then in
	// frozen, the overlay that a checkpoint is committing to the file. Only
	// the writer goroutine changes them, with ovMu held; it reads them
	// without.
	ovMu    sync.RWMutex
	overlay map[string][]byte
	frozen  map[string][]byte
	ckpt    checkpointer // owned by the writer goroutine

	writerDone chan struct{}
	stopSweep  chan struct{}
	sweepDone  chan struct{}
	closeOnce  sync.Once
	closeErr   error

	watchers watchset.Set
}

var (
	_ storekit.StatsStore = (*Store)(nil)
	_ storekit.Store      = (*Store)(nil)
	_ storekit.Watcher    = (*Store)(nil)
	_ storekit.Relayer    = (*Store)(nil)
)

// Open opens the store kept in the file at path, creating the file (not its
// directory) if it does not exist. If another process or Store has the
// file open, Open waits for the lock as long as WithLockTimeout says and
// then returns an error wrapping ErrLocked. A file written by another
// program, or by an incompatible version of this package, or damaged
// (truncated, pages overwritten), is rejected with an error wrapping
// ErrCorrupt, never a panic: Open first reads every page of an existing
// file's B+trees read-only, which about doubles the time it takes to open
// one. A log with damage that is not the torn end a crash leaves (see the
// package documentation) is rejected with a *CorruptLogError, which wraps
// ErrCorrupt and names the log file and the offset; Recover repairs it.
// Invalid options yield an error wrapping idem.ErrInvalid. Call Close when
// done.
func Open(path string, opts ...Option) (*Store, error) {
	c, err := newConfig(path, opts)
	if err != nil {
		return nil, err
	}
	s, err := open(path, c, nil)
	if err != nil {
		return nil, err
	}
	go s.writer()
	if s.sweepInterval > 0 {
		go s.sweeper()
	} else {
		close(s.sweepDone)
	}
	return s, nil
}

// newConfig applies opts to the defaults and checks them.
func newConfig(path string, opts []Option) (config, error) {
	c := config{now: time.Now, lockTimeout: DefaultLockTimeout, sweepInterval: DefaultSweepInterval, logLimit: defaultLogLimit}
	for _, o := range opts {
		o(&c)
	}
	switch {
	case path == "":
		return c, fmt.Errorf("%w: empty path", idem.ErrInvalid)
	case c.now == nil:
		return c, fmt.Errorf("%w: nil clock", idem.ErrInvalid)
	case c.lockTimeout <= 0:
		return c, fmt.Errorf("%w: lock timeout %v is not positive", idem.ErrInvalid, c.lockTimeout)
	case c.sweepInterval < 0:
		return c, fmt.Errorf("%w: sweep interval %v is negative", idem.ErrInvalid, c.sweepInterval)
	}
	return c, nil
}

// open opens the files of the store at path and applies what the log
// holds to the bbolt file; the store's goroutines are not started. With
// rec, the log is salvaged (Recover) and rec says what was found.
func open(path string, c config, rec *Recovery) (*Store, error) {
	_, statErr := os.Stat(path)
	created := errors.Is(statErr, os.ErrNotExist)
	if !created {
		if err := verify(path, c.lockTimeout); err != nil {
			return nil, err
		}
	}
	bo := &bolt.Options{
		Timeout: c.lockTimeout,
		// As in etcd: the free list is rebuilt by a scan on open instead of
		// being written by every commit, which makes commits cheaper.
		NoFreelistSync: true,
		FreelistType:   bolt.FreelistMapType,
		// Also as in etcd: map more of the address space than the file
		// needs, so that a checkpoint that grows the file does not map it
		// again. That waits for every read transaction, and every read
		// transaction begun in the meantime (the writer's among them) waits
		// for it.
		InitialMmapSize: initialMmapSize,
	}
	db, err := openRecovering(path, bo)
	if errors.Is(err, syscall.ENOMEM) && bo.InitialMmapSize > 0 {
		// A limit of the address space (ulimit -v) refuses the large
		// map: map what the file needs, as bbolt does by default.
		bo.InitialMmapSize = 0
		db, err = openRecovering(path, bo)
	}
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
		ckpt:          checkpointer{done: make(chan checkpointResult, 1)},
		writerDone:    make(chan struct{}),
		stopSweep:     make(chan struct{}),
		sweepDone:     make(chan struct{}),
	}
	if err := db.Update(s.init); err != nil {
		db.Close()
		return nil, fmt.Errorf("boltstore: %s: %w", path, err)
	}
	logCreated, err := s.openLog(path, c, rec)
	var ce *CorruptLogError
	if errors.As(err, &ce) {
		db.Close()
		return nil, err // it names the log file
	}
	if err != nil {
		db.Close()
		return nil, fmt.Errorf("boltstore: log of %s: %w", path, err)
	}
	if created || logCreated {
		// Make the new files' directory entries durable too, so that a
		// crash right after the first commits cannot lose a whole file.
		if err := syncDir(filepath.Dir(path)); err != nil {
			s.log.close()
			db.Close()
			return nil, fmt.Errorf("boltstore: %w", err)
		}
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
	switch v := meta.Get(metaFormat); {
	case len(v) == 1 && v[0] == 1: // before the log: no frame to read
		if err := meta.Put(metaFormat, []byte{formatVersion}); err != nil {
			return err
		}
	case len(v) == 1 && v[0] == 2:
		s.logStart.legacy = true // openLog moves the file to formatVersion
	case len(v) != 1 || v[0] != formatVersion:
		return fmt.Errorf("%w: file format %v, this version of boltstore reads formats [1], [2] and [%d]", ErrCorrupt, v, formatVersion)
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
	if v := meta.Get(metaLog); v != nil {
		if len(v) != 8 {
			return fmt.Errorf("%w: log generation of %d bytes", ErrCorrupt, len(v))
		}
		s.logStart.gen = binary.BigEndian.Uint64(v)
	}
	switch v := meta.Get(metaLogSeq); {
	case v == nil:
		// A new file, or one of format 1 or 2: the log's frames are
		// numbered from 1 (a file of format 2 gets its number with the
		// checkpoint that moves it to format 3).
		s.logStart.seq = 1
		if err := meta.Put(metaLogSeq, binary.BigEndian.AppendUint64(nil, 1)); err != nil {
			return err
		}
	case len(v) != 8:
		return fmt.Errorf("%w: log sequence number of %d bytes", ErrCorrupt, len(v))
	default:
		s.logStart.seq = binary.BigEndian.Uint64(v)
	}
	s.logStart.secret = bytes.Clone(meta.Get(metaLogSecret))
	switch {
	case s.logStart.secret == nil && meta.Get(metaLog) == nil:
		// A new file, or one written before the log: no frame was
		// written with another secret.
		s.logStart.secret = make([]byte, 8)
		if _, err := rand.Read(s.logStart.secret); err != nil {
			return err
		}
		return meta.Put(metaLogSecret, s.logStart.secret)
	case len(s.logStart.secret) != 8:
		return fmt.Errorf("%w: log secret of %d bytes", ErrCorrupt, len(s.logStart.secret))
	}
	return nil
}

// openLog opens the log and applies the records it holds to the file with
// a checkpoint: what a crash left only in the log. A log of format 2 gets
// that checkpoint even when it holds nothing, which moves the file to
// format 3. With rec, the log is salvaged: its files are copied aside
// first when it holds damage, and rec says what was found. created reports
// whether a log file was created.
func (s *Store) openLog(path string, c config, rec *Recovery) (created bool, err error) {
	w, r, created, err := openLog(path, s.logStart, c.logLimit, rec != nil, c.trustLogEnd)
	if err != nil {
		return false, err
	}
	s.log = w
	s.overlay = map[string][]byte{}
	s.lastFence = max(s.lastFence, r.lastFence)
	if rec != nil {
		rec.Damage, rec.Frames, rec.Records = r.damage, r.frames, len(r.entries)
		for _, d := range r.damage {
			rec.Lost += d.Frames
		}
	}
	if r.frames == 0 && len(r.damage) == 0 && !s.logStart.legacy {
		return created, nil
	}
	if len(r.damage) > 0 {
		if rec.Saved, err = saveLog(path, c.now()); err != nil {
			w.close()
			return false, err
		}
	}
	recovered := make(map[string][]byte, len(r.entries))
	for _, e := range r.entries {
		if e.val == nil {
			e.val = deleted
		}
		recovered[e.key] = e.val
	}
	w.next()
	if _, err := s.checkpoint(recovered, s.lastFence, w.gen, w.first); err != nil {
		w.close()
		return false, err
	}
	return created, nil
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
		s.closeErr = errors.Join(s.log.close(), s.db.Close())
		s.watchers.Close()
	})
	return s.closeErr
}

// Path returns the path of the store's file.
func (s *Store) Path() string { return s.db.Path() }

func (s *Store) micros() int64 { return s.now().UnixMicro() }

// view runs fn in a read-only transaction on the file (without the
// overlay).
func (s *Store) view(fn func(tx *bolt.Tx) error) error {
	s.mu.RLock()
	defer s.mu.RUnlock()
	if s.closed {
		return ErrClosed
	}
	return s.db.View(fn)
}

// lookup calls fn with key's record, expired or not, or nil: the overlay's
// if it has one, else the file's. The record aliases the store: copy what
// outlives fn.
func (s *Store) lookup(key string, fn func(r *record) error) error {
	s.mu.RLock()
	defer s.mu.RUnlock()
	if s.closed {
		return ErrClosed
	}
	// Held while the file is read, so that a checkpoint cannot empty the
	// overlay in between.
	s.ovMu.RLock()
	defer s.ovMu.RUnlock()
	v, ok := s.overlay[key]
	if !ok {
		v, ok = s.frozen[key]
	}
	if ok {
		r, err := decodeStored(key, v)
		if err != nil {
			return err
		}
		return fn(r)
	}
	return s.db.View(func(tx *bolt.Tx) error {
		r, err := decodeStored(key, tx.Bucket(bucketRecords).Get([]byte(key)))
		if err != nil {
			return err
		}
		return fn(r)
	})
}

// decodeStored decodes key's stored record v (nil or deleted: none).
func decodeStored(key string, v []byte) (*record, error) {
	if len(v) == 0 {
		return nil, nil
	}
	r, err := decode(v, false)
	if err != nil {
		return nil, fmt.Errorf("boltstore: key %s: %w", key, err)
	}
	return r, nil
}

// Acquire implements storekit.Store. Outcomes that change nothing (Replay,
// InProgress, Mismatch, and Acquired for a repeated call of the owner) are
// answered from a read transaction; the others are committed to disk before
// Acquire returns.
func (s *Store) Acquire(ctx context.Context, key string, req storekit.AcquireRequest) (storekit.Acquisition, error) {
	if err := statemachine.CheckAcquire(ctx, key, req); err != nil {
		return storekit.Acquisition{}, err
	}
	var out storekit.Acquisition
	answered := false
	err := s.lookup(key, func(r *record) error {
		if r == nil {
			return nil
		}
		now := s.micros()
		if r.ExpiresAt <= now {
			return nil
		}
		out, answered = statemachine.Settled(r, req, now)
		out.Result = clone(out.Result)
		return nil
	})
	if err != nil || answered {
		return out, err
	}
	err = s.write(ctx, func(t *txn) error {
		out = storekit.Acquisition{}
		return t.acquire(key, req, &out)
	})
	return out, err
}

func clone(b []byte) []byte {
	if len(b) == 0 {
		return nil
	}
	return append([]byte(nil), b...)
}

// acquire is Acquire's transition. A Replay's result is copied.
func (t *txn) acquire(key string, req storekit.AcquireRequest, out *storekit.Acquisition) error {
	sl, err := t.load(key)
	if err != nil {
		return err
	}
	next, changed, a := statemachine.Acquire(sl.live, req, t.now, t.lastFence)
	a.Result = clone(a.Result)
	*out = a
	if !changed {
		return nil
	}
	return t.save(sl, &next)
}

// change runs transition on key's live record (nil if none) and saves the
// record it returns if it changed, waking the key's watchers if notify. The
// transition's error is returned and nothing is written.
func (s *Store) change(ctx context.Context, key string, size int, notify bool, transition func(cur *record, now int64) (record, bool, error)) error {
	var terr error
	err := s.writeSized(ctx, size, func(t *txn) error {
		sl, err := t.load(key)
		if err != nil {
			return err
		}
		next, changed, err := transition(sl.live, t.now)
		if terr = err; err != nil || !changed {
			return nil
		}
		if notify {
			t.notify(key)
		}
		return t.save(sl, &next)
	})
	if err != nil {
		return err
	}
	return terr
}

// Complete implements storekit.Store. It returns once the result is on disk.
func (s *Store) Complete(ctx context.Context, key string, lease storekit.Lease, result []byte, retention time.Duration) error {
	if err := statemachine.CheckOwned(ctx, key, lease, "retention", retention); err != nil {
		return err
	}
	return s.change(ctx, key, len(result), true, func(cur *record, now int64) (record, bool, error) {
		return statemachine.Complete(cur, lease, result, retention, now)
	})
}

// RelayCompletion implements storekit.Relayer. It returns once the record is
// on disk.
func (s *Store) RelayCompletion(ctx context.Context, key string, c storekit.Completion) error {
	if err := statemachine.CheckRelay(ctx, key, c); err != nil {
		return err
	}
	return s.change(ctx, key, len(c.Result), true, func(cur *record, now int64) (record, bool, error) {
		next, changed := statemachine.Relay(cur, c, now)
		return next, changed, nil
	})
}

// Fail implements storekit.Store.
func (s *Store) Fail(ctx context.Context, key string, lease storekit.Lease, f storekit.Failure) (storekit.State, error) {
	if err := statemachine.CheckOwned(ctx, key, lease, "", 0); err != nil {
		return 0, err
	}
	if err := f.Validate(); err != nil {
		return 0, err
	}
	var state storekit.State
	err := s.change(ctx, key, len(f.Result), true, func(cur *record, now int64) (next record, changed bool, err error) {
		next, changed, state, err = statemachine.Fail(cur, lease, f, now)
		return next, changed, err
	})
	if err != nil {
		return 0, err
	}
	return state, nil
}

// Extend implements storekit.Store.
func (s *Store) Extend(ctx context.Context, key string, lease storekit.Lease, d time.Duration) error {
	if err := statemachine.CheckOwned(ctx, key, lease, "lease", d); err != nil {
		return err
	}
	return s.change(ctx, key, 0, false, func(cur *record, now int64) (record, bool, error) {
		next, err := statemachine.Extend(cur, lease, d, now)
		return next, err == nil, err
	})
}

// Release implements storekit.Store.
func (s *Store) Release(ctx context.Context, key string, lease storekit.Lease, retention time.Duration) error {
	if err := statemachine.CheckOwned(ctx, key, lease, "retention", retention); err != nil {
		return err
	}
	return s.change(ctx, key, 0, true, func(cur *record, now int64) (record, bool, error) {
		return statemachine.Release(cur, lease, retention, now)
	})
}

// Get implements storekit.Store. The returned Result is a copy.
func (s *Store) Get(ctx context.Context, key string) (storekit.Record, error) {
	if err := storekit.ValidateStoreKey(key); err != nil {
		return storekit.Record{}, err
	}
	if err := ctx.Err(); err != nil {
		return storekit.Record{}, err
	}
	var rec storekit.Record
	found := false
	err := s.lookup(key, func(r *record) error {
		if r == nil {
			return nil
		}
		now := s.micros()
		if r.ExpiresAt <= now {
			return nil
		}
		rec, found = r.Public(now), true
		return nil
	})
	if err != nil {
		return storekit.Record{}, err
	}
	if !found {
		return storekit.Record{}, storekit.ErrNotFound
	}
	return rec, nil
}

// Delete implements storekit.Store. It returns once the deletion is on disk. It
// also removes a record that cannot be decoded (see ErrCorrupt).
func (s *Store) Delete(ctx context.Context, key string) error {
	if err := storekit.ValidateStoreKey(key); err != nil {
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
	Record storekit.Record
}

// Stats implements storekit.StatsStore: it counts every live record of one
// snapshot (it decodes each; about a microsecond per record). MemoryUsed is
// the size of the file and the log; there is no limit.
func (s *Store) Stats(ctx context.Context) (storekit.Stats, error) {
	var st storekit.Stats
	err := s.snapshot(func(tx *bolt.Tx, ov map[string][]byte) error {
		st.MemoryUsed = tx.Size() + s.log.size()
		return s.live(ctx, tx, ov, func(_ []byte, r *record, now int64) bool {
			st.Count(r.State, time.UnixMicro(r.Created), time.UnixMicro(now))
			return true
		})
	})
	return st, err
}

// snapshot calls fn with a read transaction on the file and a copy of the
// overlays taken at the same moment.
func (s *Store) snapshot(fn func(tx *bolt.Tx, ov map[string][]byte) error) error {
	s.mu.RLock()
	defer s.mu.RUnlock()
	if s.closed {
		return ErrClosed
	}
	s.ovMu.RLock()
	ov := maps.Clone(s.frozen)
	if ov == nil {
		ov = map[string][]byte{}
	}
	maps.Copy(ov, s.overlay)
	tx, err := s.db.Begin(false)
	s.ovMu.RUnlock()
	if err != nil {
		return err
	}
	defer tx.Rollback()
	return fn(tx, ov)
}

// live calls fn with every live (unexpired) record of the snapshot (tx and
// the overlay ov over it), in the order of their keys, until fn returns
// false. The key and record alias the store.
func (s *Store) live(ctx context.Context, tx *bolt.Tx, ov map[string][]byte, fn func(k []byte, r *record, now int64) bool) error {
	now := s.micros()
	keys := slices.Sorted(maps.Keys(ov))
	c := tx.Bucket(bucketRecords).Cursor()
	n := 0
	k, v := c.First()
	for k != nil || len(keys) > 0 {
		if n++; n%1024 == 0 {
			if err := ctx.Err(); err != nil {
				return err
			}
		}
		var key, val []byte
		if len(keys) > 0 && (k == nil || keys[0] <= string(k)) {
			if k != nil && keys[0] == string(k) {
				k, v = c.Next() // the overlay's record replaces the file's
			}
			key, val = []byte(keys[0]), ov[keys[0]]
			keys = keys[1:]
		} else {
			key, val = k, v
			k, v = c.Next()
		}
		r, err := decodeStored(string(key), val)
		if err != nil {
			return err
		}
		if r != nil && r.ExpiresAt > now && !fn(key, r, now) {
			return nil
		}
	}
	return nil
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
	err := s.snapshot(func(tx *bolt.Tx, ov map[string][]byte) error {
		return s.live(ctx, tx, ov, func(k []byte, r *record, now int64) bool {
			out = append(out, Entry{Key: string(k), Record: r.Public(now)})
			return len(out) < limit
		})
	})
	if err != nil {
		return nil, err
	}
	return out, nil
}
