package boltstore

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"sync/atomic"
	"time"

	bolt "go.etcd.io/bbolt"
)

// Group commit. bbolt runs one write transaction at a time and fsyncs each,
// so one transaction per call would cap the store at one fsync per call.
// Instead every write goes to one writer goroutine, which applies all the
// writes that queued up while the previous commit was syncing in a single
// transaction: one commit (two fdatasyncs) for the whole group. A lone
// caller waits for exactly one commit, with no added delay (unlike
// bbolt.DB.Batch, which waits up to 10ms for company); under load, groups
// grow by themselves.

// maxBatch bounds the writes applied in one transaction, and maxBatchBytes
// the results they carry (a group is closed once it reaches it).
const (
	maxBatch      = 1024
	maxBatchBytes = 16 << 20
)

// States of an op.
const (
	opPending   = iota // queued
	opTaken            // the writer applies it; the caller waits for the commit
	opAbandoned        // the caller's context ended first; the writer skips it
)

// op is one write submitted to the writer.
type op struct {
	// apply makes the change in t. It may be called more than once (when
	// another op of its group fails, the group is applied again without
	// it), so it must reset its outputs. An error aborts the op and
	// nothing it did is committed.
	apply func(t *txn) error
	size  int // bytes of result it stores
	state atomic.Int32
	done  chan error // receives the commit's outcome
}

// write applies fn in a write transaction and returns once that transaction
// is committed and fsynced, with fn's error or the commit's. If ctx ends
// before the writer took the op, write returns ctx's error and fn is not
// applied; once taken, the op is waited for whatever ctx does, so that an
// error means nothing was written (short of a disk that fails to sync).
func (s *Store) write(ctx context.Context, fn func(t *txn) error) error {
	return s.writeSized(ctx, 0, fn)
}

// writeSized is write for a change that stores size bytes of result.
func (s *Store) writeSized(ctx context.Context, size int, fn func(t *txn) error) error {
	o := &op{apply: fn, size: size, done: make(chan error, 1)}
	s.mu.RLock()
	if s.closed {
		s.mu.RUnlock()
		return ErrClosed
	}
	select {
	case s.queue <- o:
	case <-ctx.Done():
		s.mu.RUnlock()
		return ctx.Err()
	}
	s.mu.RUnlock()
	select {
	case err := <-o.done:
		return err
	case <-ctx.Done():
		if o.state.CompareAndSwap(opPending, opAbandoned) {
			return ctx.Err()
		}
		return <-o.done
	}
}

// writer is the goroutine that commits writes, until the queue is closed.
func (s *Store) writer() {
	defer close(s.writerDone)
	batch := make([]*op, 0, maxBatch)
	live := make([]*op, 0, maxBatch)
	for o := range s.queue {
		batch = append(batch[:0], o)
		size := o.size
	drain:
		for len(batch) < maxBatch && size < maxBatchBytes {
			select {
			case o, ok := <-s.queue:
				if !ok {
					break drain
				}
				batch = append(batch, o)
				size += o.size
			default:
				break drain
			}
		}
		live = live[:0]
		for _, o := range batch {
			if o.state.CompareAndSwap(opPending, opTaken) {
				live = append(live, o)
			}
		}
		s.commit(live)
		clear(batch)
		clear(live)
	}
}

// commit applies ops in one transaction and reports the outcome to each.
// An op whose apply fails gets its error and the others are applied again
// without it.
func (s *Store) commit(ops []*op) {
	for len(ops) > 0 {
		failed := -1
		var t *txn
		err := s.db.Update(func(tx *bolt.Tx) error {
			t = s.newTxn(tx)
			for i, o := range ops {
				t.now = s.micros()
				if err := t.apply(o); err != nil {
					failed = i
					return err
				}
			}
			t.now = s.micros()
			if _, err := t.sweep(2*len(ops) + 16); err != nil {
				return err
			}
			if err := t.finish(); err != nil {
				return err
			}
			if !t.dirty {
				return errNothingWritten // roll back: no commit, no fsync
			}
			return nil
		})
		if err == errNothingWritten {
			err = nil
		}
		if failed >= 0 {
			ops[failed].done <- err
			ops = append(ops[:failed], ops[failed+1:]...)
			continue
		}
		if err != nil {
			err = fmt.Errorf("boltstore: commit: %w", err)
		} else {
			s.lastFence = t.lastFence
			s.wake(t.notified)
		}
		for _, o := range ops {
			o.done <- err
		}
		return
	}
}

// errNothingWritten ends a transaction in which no op changed anything (a
// stale owner, a repeated call, the deletion of an absent key): there is
// nothing to sync.
var errNothingWritten = errors.New("boltstore: nothing written")

// txn is the state of one write transaction, owned by the writer.
type txn struct {
	dirty     bool // something was put or deleted
	tx        *bolt.Tx
	records   *bolt.Bucket
	expiry    *bolt.Bucket
	now       int64 // store clock, µs, read before each op
	lastFence int64
	fenceSet  bool
	notified  []string // keys whose watchers are woken after the commit
}

func (s *Store) newTxn(tx *bolt.Tx) *txn {
	return &txn{
		tx:        tx,
		records:   tx.Bucket(bucketRecords),
		expiry:    tx.Bucket(bucketExpiry),
		lastFence: s.lastFence,
	}
}

// apply runs o.apply, turning a panic into an error so that one bad op
// cannot stop the writer and hang every caller.
func (t *txn) apply(o *op) (err error) {
	defer func() {
		if p := recover(); p != nil {
			err = fmt.Errorf("boltstore: internal error: %v", p)
		}
	}()
	return o.apply(t)
}

// finish writes the last fence issued, if it changed.
func (t *txn) finish() error {
	if !t.fenceSet {
		return nil
	}
	t.dirty = true
	return t.tx.Bucket(bucketMeta).Put(metaFence, binary.BigEndian.AppendUint64(nil, uint64(t.lastFence)))
}

func (t *txn) notify(key string) { t.notified = append(t.notified, key) }

// slot is a key's place in the file as loaded by a write.
type slot struct {
	key    string
	onDisk bool  // a record is stored, live or expired
	oldExp int64 // its expiry, which names its entry in the expiry index
	live   *record
}

// load reads key's record. An expired record is treated as absent, as if it
// had been swept; save or remove replaces it.
func (t *txn) load(key string) (*slot, error) {
	sl := &slot{key: key}
	v := t.records.Get([]byte(key))
	if v == nil {
		return sl, nil
	}
	r, err := decode(v, false)
	if err != nil {
		return nil, fmt.Errorf("boltstore: key %s: %w", key, err)
	}
	sl.onDisk, sl.oldExp = true, r.ExpiresAt
	if r.ExpiresAt > t.now {
		sl.live = r
	}
	return sl, nil
}

// save stores r in sl and keeps the expiry index in step.
func (t *txn) save(sl *slot, r *record) error {
	t.dirty = true
	if r.Fence > t.lastFence {
		t.lastFence, t.fenceSet = r.Fence, true
	}
	if err := t.records.Put([]byte(sl.key), encode(r)); err != nil {
		return err
	}
	if sl.onDisk && sl.oldExp == r.ExpiresAt {
		return nil
	}
	if sl.onDisk {
		if err := t.expiry.Delete(expiryKey(sl.oldExp, sl.key)); err != nil {
			return err
		}
	}
	return t.expiry.Put(expiryKey(r.ExpiresAt, sl.key), nil)
}

// remove deletes key's record and its index entry. A record that cannot be
// decoded goes too; its index entry, which cannot be named without the
// record, is dropped by a later sweep.
func (t *txn) remove(key string) error {
	v := t.records.Get([]byte(key))
	if v == nil {
		return nil
	}
	t.dirty = true
	if r, err := decode(v, false); err == nil {
		if err := t.expiry.Delete(expiryKey(r.ExpiresAt, key)); err != nil {
			return err
		}
	}
	return t.records.Delete([]byte(key))
}

// sweep deletes up to limit records whose expiry passed, oldest first, and
// returns how many index entries it removed.
func (t *txn) sweep(limit int) (int, error) {
	var dead [][]byte
	c := t.expiry.Cursor()
	for k, _ := c.First(); k != nil && len(dead) < limit; k, _ = c.Next() {
		if exp, _, err := parseExpiryKey(k); err == nil && exp > t.now {
			break
		}
		dead = append(dead, append([]byte(nil), k...))
	}
	if len(dead) > 0 {
		t.dirty = true
	}
	for _, k := range dead {
		if exp, key, err := parseExpiryKey(k); err == nil {
			// The index entry of a record names its current expiry; check
			// it anyway rather than delete a live record. A record that
			// cannot be decoded and whose entry expired goes too.
			if v := t.records.Get(key); v != nil {
				if r, err := decode(v, false); err != nil || r.ExpiresAt == exp {
					if err := t.records.Delete(key); err != nil {
						return 0, err
					}
				}
			}
		}
		if err := t.expiry.Delete(k); err != nil {
			return 0, err
		}
	}
	return len(dead), nil
}

// sweepBatch is the most records the background sweeper deletes per
// transaction.
const sweepBatch = 1024

// sweeper deletes expired records every sweepInterval until Close.
func (s *Store) sweeper() {
	defer close(s.sweepDone)
	tick := time.NewTicker(s.sweepInterval)
	defer tick.Stop()
	for {
		select {
		case <-s.stopSweep:
			return
		case <-tick.C:
			s.sweepExpired()
		}
	}
}

// sweepExpired deletes expired records in transactions of sweepBatch
// until none is left (or the store closes). It does not write when nothing
// expired.
func (s *Store) sweepExpired() {
	for {
		select {
		case <-s.stopSweep:
			return
		default:
		}
		expired := false
		err := s.view(func(tx *bolt.Tx) error {
			k, _ := tx.Bucket(bucketExpiry).Cursor().First()
			if k != nil {
				exp, _, err := parseExpiryKey(k)
				expired = err != nil || exp <= s.micros()
			}
			return nil
		})
		if err != nil || !expired {
			return
		}
		n := 0
		err = s.write(context.Background(), func(t *txn) error {
			var err error
			n, err = t.sweep(sweepBatch)
			return err
		})
		if err != nil || n < sweepBatch {
			return
		}
	}
}
