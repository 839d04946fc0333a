package boltstore

import (
	"bytes"
	"context"
	"encoding/binary"
	"fmt"
	"maps"
	"slices"
	"sync/atomic"
	"time"

	bolt "go.etcd.io/bbolt"
)

// Group commit. One sync per call would cap the store at one fsync per
// call. Instead every write goes to one writer goroutine, which applies all
// the writes that queued up while the previous group was syncing as one
// group: one log frame and one fdatasync for the whole group (log.go). A
// lone caller waits for exactly one sync, with no added delay (unlike
// bbolt.DB.Batch, which waits up to 10ms for company); under load, groups
// grow by themselves.

// maxBatch bounds the writes applied in one group, and maxBatchBytes the
// results they carry (a group is closed once it reaches it).
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

	checkpoint bool // no apply: the writer makes a checkpoint after the group
	swept      int  // of a checkpoint op: the expired records it deleted
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
	return s.submit(ctx, &op{apply: fn, size: size, done: make(chan error, 1)})
}

// submit queues o for the writer and waits for its outcome.
func (s *Store) submit(ctx context.Context, o *op) error {
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

// requestCheckpoint makes the writer make a checkpoint and returns how many
// expired records it deleted.
func (s *Store) requestCheckpoint(ctx context.Context) (int, error) {
	o := &op{checkpoint: true, done: make(chan error, 1)}
	err := s.submit(ctx, o)
	return o.swept, err
}

// writer is the goroutine that commits writes, until the queue is closed.
// It also starts checkpoints and takes their outcomes; while one runs and
// the log is full again, it waits for it before it takes more writes.
func (s *Store) writer() {
	defer close(s.writerDone)
	batch := make([]*op, 0, maxBatch)
	live := make([]*op, 0, maxBatch)
	for {
		var o *op
		if !s.ckpt.running && (s.log.full() && !s.ckpt.failed || len(s.ckpt.asked) > 0) {
			s.startCheckpoint()
		}
		if s.ckpt.running && s.log.full() {
			s.checkpointDone(<-s.ckpt.done)
			continue
		}
		select {
		case r := <-s.ckpt.done:
			s.checkpointDone(r)
			continue
		case next, ok := <-s.queue:
			if !ok {
				s.finalCheckpoint()
				return
			}
			o = next
		}
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

// commit applies ops as one group: their changes are appended to the log
// as one frame and synced, then published to the overlay, and the outcome is
// reported to each. An op whose apply fails gets its error and the others
// are applied again without it. Checkpoint ops wait for the next
// checkpoint.
func (s *Store) commit(ops []*op) {
	for len(ops) > 0 {
		failed := -1
		var err error
		t := s.newTxn()
		for i, o := range ops {
			if o.checkpoint {
				continue
			}
			t.now = s.micros()
			if err = t.apply(o); err != nil {
				failed = i
				break
			}
		}
		t.end()
		if failed >= 0 {
			ops[failed].done <- err
			ops = append(ops[:failed], ops[failed+1:]...)
			continue
		}
		if t.dirty {
			if err = s.log.appendFrame(t.entries(), t.lastFence); err == nil {
				s.publish(t)
				s.ckpt.failed = false
			}
		}
		for _, o := range ops {
			if o.checkpoint && err == nil {
				s.ckpt.asked = append(s.ckpt.asked, o)
			} else {
				o.done <- err
			}
		}
		return
	}
}

// checkpointer is the writer's state of checkpoints.
type checkpointer struct {
	running bool
	failed  bool // the last one failed: the next waits for a write or an op
	done    chan checkpointResult
	asked   []*op // checkpoint ops for the next checkpoint
	waiting []*op // checkpoint ops for the running one
}

type checkpointResult struct {
	swept int
	err   error
}

// startCheckpoint starts a checkpoint in the background. The overlay is
// frozen and a new one takes the writes, which go to the log's next
// generation, unless a checkpoint failed: then its frozen overlay (and
// generation) is committed again first. Either way the checkpoint commits
// the log's current generation: the log moves on only with a new frozen
// overlay.
func (s *Store) startCheckpoint() {
	if s.frozen == nil {
		s.ovMu.Lock()
		s.frozen, s.overlay = s.overlay, make(map[string][]byte, len(s.overlay))
		s.ovMu.Unlock()
		s.log.next()
	}
	s.ckpt.running = true
	s.ckpt.waiting, s.ckpt.asked = append(s.ckpt.waiting, s.ckpt.asked...), nil
	frozen, fence, gen, seq := s.frozen, s.lastFence, s.log.gen, s.log.first
	go func() {
		n, err := s.checkpoint(frozen, fence, gen, seq)
		s.ckpt.done <- checkpointResult{n, err}
	}()
}

// checkpointDone takes a checkpoint's outcome: on success the frozen
// overlay goes (the file holds its records); on error it stays, for the
// next checkpoint to commit again. The checkpoint ops that waited for it
// get the outcome.
func (s *Store) checkpointDone(r checkpointResult) {
	s.ckpt.running, s.ckpt.failed = false, r.err != nil
	if r.err == nil {
		s.ovMu.Lock()
		s.frozen = nil
		s.ovMu.Unlock()
	}
	for _, o := range s.ckpt.waiting {
		o.swept = r.swept
		o.done <- r.err
	}
	clear(s.ckpt.waiting)
	s.ckpt.waiting = s.ckpt.waiting[:0]
}

// finalCheckpoint, on Close, waits for the running checkpoint and leaves
// the file complete (the log would do as well).
func (s *Store) finalCheckpoint() {
	if s.ckpt.running {
		s.checkpointDone(<-s.ckpt.done)
	}
	for range 2 { // a frozen overlay that failed before, then the last one
		if s.log.broken != nil || s.frozen == nil && len(s.overlay) == 0 && len(s.ckpt.asked) == 0 {
			break
		}
		s.startCheckpoint()
		s.checkpointDone(<-s.ckpt.done)
	}
	for _, o := range s.ckpt.asked {
		o.done <- ErrClosed
	}
}

// txn is the state of one group of writes, owned by the writer: the
// records it changed (pending) over the overlay over the bbolt file.
type txn struct {
	s         *Store
	rtx       *bolt.Tx // a read transaction on the file, opened on first use
	err       error    // opening rtx failed
	pending   map[string][]byte
	dirty     bool  // something was put or deleted
	now       int64 // store clock, µs, read before each op
	lastFence int64
	notified  []string // keys whose watchers are woken after the commit
}

func (s *Store) newTxn() *txn {
	return &txn{s: s, pending: map[string][]byte{}, lastFence: s.lastFence}
}

// end closes the group's read transaction.
func (t *txn) end() {
	if t.rtx != nil {
		t.rtx.Rollback()
		t.rtx = nil
	}
}

// entries returns the group's changes as log entries.
func (t *txn) entries() []logEntry {
	es := make([]logEntry, 0, len(t.pending))
	for k, v := range t.pending {
		es = append(es, logEntry{key: k, val: v})
	}
	return es
}

// apply runs o.apply, turning a panic into an error so that one bad op
// cannot stop the writer and hang every caller. The changes of an op that
// fails are dropped with the group's (the group is applied again without
// it).
func (t *txn) apply(o *op) (err error) {
	defer func() {
		if p := recover(); p != nil {
			err = fmt.Errorf("boltstore: internal error: %v", p)
		}
	}()
	return o.apply(t)
}

func (t *txn) notify(key string) { t.notified = append(t.notified, key) }

// slot is a key's place in the store as loaded by a write.
type slot struct {
	key  string
	live *record
}

// stored returns key's encoded record as the group sees it: changed by the
// group, in the overlay, in the frozen overlay, or in the file; nil if none. A deletion is a
// non-nil empty slice in pending and the overlay.
func (t *txn) stored(key string) ([]byte, error) {
	if v, ok := t.pending[key]; ok {
		return v, nil
	}
	if v, ok := t.s.overlay[key]; ok { // the writer is the overlays' only writer
		return v, nil
	}
	if v, ok := t.s.frozen[key]; ok {
		return v, nil
	}
	if t.rtx == nil {
		if t.err != nil {
			return nil, t.err
		}
		if t.rtx, t.err = t.s.db.Begin(false); t.err != nil {
			return nil, t.err
		}
	}
	return t.rtx.Bucket(bucketRecords).Get([]byte(key)), nil
}

// load reads key's record. An expired record is treated as absent.
func (t *txn) load(key string) (*slot, error) {
	sl := &slot{key: key}
	v, err := t.stored(key)
	if err != nil || len(v) == 0 {
		return sl, err
	}
	r, err := decodeStored(key, v)
	if err != nil {
		return nil, err
	}
	if r.ExpiresAt > t.now {
		sl.live = r
	}
	return sl, nil
}

// save stores r as sl's record.
func (t *txn) save(sl *slot, r *record) error {
	t.dirty = true
	t.lastFence = max(t.lastFence, r.Fence)
	t.pending[sl.key] = encode(r)
	return nil
}

// remove deletes key's record, even one that cannot be decoded.
func (t *txn) remove(key string) error {
	v, err := t.stored(key)
	if err != nil || len(v) == 0 {
		return err
	}
	t.dirty = true
	t.pending[key] = deleted
	return nil
}

// deleted marks a deletion in pending and the overlay.
var deleted = []byte{}

// publish makes a synced group's changes visible to readers.
func (s *Store) publish(t *txn) {
	s.ovMu.Lock()
	for k, v := range t.pending {
		s.overlay[k] = v
	}
	s.ovMu.Unlock()
	s.lastFence = t.lastFence
	s.wake(t.notified)
}

// checkpoint applies the records of a frozen overlay to the bbolt file in
// one transaction, with the last fence issued when it was frozen and the
// log's generation that came after it (and the sequence number of that
// generation's first frame), and deletes expired records: as many as twice
// the records it applies, and sweepBatch more. It returns how many index
// entries of expired records it deleted. On error nothing changed. It runs
// beside the writer, which does not change frozen.
func (s *Store) checkpoint(frozen map[string][]byte, fence int64, gen, seq uint64) (int, error) {
	swept := 0
	err := s.db.Update(func(tx *bolt.Tx) error {
		c := checkpointTx{records: tx.Bucket(bucketRecords), expiry: tx.Bucket(bucketExpiry)}
		if err := c.apply(frozen); err != nil {
			return err
		}
		var err error
		if swept, err = c.sweep(s.micros(), 2*len(frozen)+sweepBatch); err != nil {
			return err
		}
		meta := tx.Bucket(bucketMeta)
		if err := meta.Put(metaFence, binary.BigEndian.AppendUint64(nil, uint64(fence))); err != nil {
			return err
		}
		if err := meta.Put(metaLogSeq, binary.BigEndian.AppendUint64(nil, seq)); err != nil {
			return err
		}
		// The log goes on with frames of formatVersion (a file of format
		// 2 moves to it with its first checkpoint).
		if err := meta.Put(metaFormat, []byte{formatVersion}); err != nil {
			return err
		}
		return meta.Put(metaLog, binary.BigEndian.AppendUint64(nil, gen))
	})
	if err != nil {
		return 0, fmt.Errorf("boltstore: checkpoint: %w", err)
	}
	return swept, nil
}

// checkpointTx writes records into the file, keeping the expiry index in
// step. Keys go into bbolt's nodes in order: a node takes keys at its end
// without moving the others, where keys in random order into one node
// (most of a checkpoint's index entries go into the last) cost a copy of
// the node each.
type checkpointTx struct {
	records, expiry *bolt.Bucket
}

// apply stores the records of ov (encoded records, or deleted).
func (c checkpointTx) apply(ov map[string][]byte) error {
	var gone, added [][]byte // index entries
	for _, key := range slices.Sorted(maps.Keys(ov)) {
		k, v := []byte(key), ov[key]
		if old := c.records.Get(k); old != nil {
			// An old record that cannot be decoded has an index entry
			// that cannot be named: a later sweep drops it.
			if r, err := decode(old, false); err == nil {
				gone = append(gone, expiryKey(r.ExpiresAt, key))
			}
		}
		if len(v) == 0 {
			if err := c.records.Delete(k); err != nil {
				return err
			}
			continue
		}
		r, err := decodeStored(key, v)
		if err != nil {
			return err
		}
		if err := c.records.Put(k, v); err != nil {
			return err
		}
		added = append(added, expiryKey(r.ExpiresAt, key))
	}
	slices.SortFunc(gone, bytes.Compare)
	for _, k := range gone {
		if err := c.expiry.Delete(k); err != nil {
			return err
		}
	}
	slices.SortFunc(added, bytes.Compare)
	for _, k := range added {
		if err := c.expiry.Put(k, nil); err != nil {
			return err
		}
	}
	return nil
}

// sweep deletes up to limit records whose expiry is not after now, oldest
// first, and returns how many index entries it removed.
func (c checkpointTx) sweep(now int64, limit int) (int, error) {
	var dead [][]byte
	cur := c.expiry.Cursor()
	for k, _ := cur.First(); k != nil && len(dead) < limit; k, _ = cur.Next() {
		if exp, _, err := parseExpiryKey(k); err == nil && exp > now {
			break
		}
		dead = append(dead, append([]byte(nil), k...))
	}
	for _, k := range dead {
		if exp, key, err := parseExpiryKey(k); err == nil {
			// The index entry of a record names its current expiry; check
			// it anyway rather than delete a live record. A record that
			// cannot be decoded and whose entry expired goes too.
			if v := c.records.Get(key); v != nil {
				if r, err := decode(v, false); err != nil || r.ExpiresAt == exp {
					if err := c.records.Delete(key); err != nil {
						return 0, err
					}
				}
			}
		}
		if err := c.expiry.Delete(k); err != nil {
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

// sweepExpired makes checkpoints, which apply the log to the file and
// delete expired records, until no expired record is left (or the store
// closes). It does not write when the log is empty and nothing expired.
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
		s.ovMu.RLock()
		logged := len(s.overlay) > 0 || len(s.frozen) > 0
		s.ovMu.RUnlock()
		if err != nil || !expired && !logged {
			return
		}
		n, err := s.requestCheckpoint(context.Background())
		if err != nil || n < sweepBatch {
			return
		}
	}
}
