package boltstore

import (
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"io"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/idemgo/idem/internal/fsync"
	"github.com/idemgo/idem/storekit"
	bolt "go.etcd.io/bbolt"
)

var testSecret = []byte("01234567")

// keysOf lists the keys of entries, with "-" before a deletion's.
func keysOf(es []logEntry) []string {
	var out []string
	for _, e := range es {
		if e.val == nil {
			out = append(out, "-"+e.key)
		} else {
			out = append(out, e.key+"="+string(e.val))
		}
	}
	return out
}

func mustAppend(t testing.TB, w *wal, fence int64, es ...logEntry) {
	t.Helper()
	if err := w.appendFrame(es, fence); err != nil {
		t.Fatal(err)
	}
}

// TestLogReadsTwoGenerations: recovery reads the frames of the file's
// generation and of the next one, in that order, and stops in each log file
// at the first frame of another generation, even one whole and at a frame
// boundary, which would bring back a record as it was before a checkpoint.
func TestLogReadsTwoGenerations(t *testing.T) {
	path := filepath.Join(t.TempDir(), "idem.db")
	w, r, created, err := openLog(path, logStart{gen: 5, seq: 1, secret: testSecret}, 1<<20, false, false)
	if err != nil || len(r.entries) != 0 || !created || w.gen != 6 {
		t.Fatalf("new log: %v entries, created %v, generation %d, %v", r.entries, created, w.gen, err)
	}
	mustAppend(t, w, 10, logEntry{key: "a", val: []byte("1")})
	mustAppend(t, w, 11, logEntry{key: "b", val: []byte("1")})
	w.next() // a checkpoint of generation 6 starts: file 1
	mustAppend(t, w, 12, logEntry{key: "a", val: []byte("2")}, logEntry{key: "b"})
	w.next() // it committed generation 7, and the next one starts: file 0
	mustAppend(t, w, 13, logEntry{key: "c", val: []byte("1")})
	at := w.at
	w.close()

	w, r, created, err = openLog(path, logStart{gen: 7, seq: 3, secret: testSecret}, 1<<20, false, false)
	if err != nil || created {
		t.Fatalf("reopen: created %v, %v", created, err)
	}
	defer w.close()
	if got, want := keysOf(r.entries), []string{"a=2", "-b", "c=1"}; !slices.Equal(got, want) || r.lastFence != 13 {
		t.Fatalf("generations 7 and 8: got %v, last fence %d; want %v, 13", got, r.lastFence, want)
	}
	if w.gen != 8 || w.at != at || w.seq != 5 || w.first != 4 {
		t.Fatalf("the log goes on with generation %d at %d, frame %d (first %d); want 8 at %d, frame 5 (first 4)", w.gen, w.at, w.seq, w.first, at)
	}
	// What stopped it: b's frame of generation 6, whole, right after c's.
	var head [frameHeader]byte
	if _, err := w.files[0].f.ReadAt(head[:], at); err != nil || binary.BigEndian.Uint64(head[:]) != 6 {
		t.Fatalf("after c's frame: got generation %d, %v; want b's frame of generation 6", binary.BigEndian.Uint64(head[:]), err)
	}
}

// TestLogTornFrame: a frame torn by a crash (a byte of it not written) ends
// the log; the frames before it are read.
func TestLogTornFrame(t *testing.T) {
	path := filepath.Join(t.TempDir(), "idem.db")
	w, _, _, err := openLog(path, logStart{gen: 1, seq: 1, secret: testSecret}, 1<<20, false, false)
	if err != nil {
		t.Fatal(err)
	}
	defer w.close()
	mustAppend(t, w, 1, logEntry{key: "a", val: []byte("1")}, logEntry{key: "b"})
	mustAppend(t, w, 2, logEntry{key: "c", val: []byte("2")})
	at := w.at
	mustAppend(t, w, 3, logEntry{key: "d", val: []byte("3")})
	l := w.files[w.gen%2]
	reopen := func() (*wal, logRead) {
		t.Helper()
		w, r, _, err := openLog(path, logStart{gen: 1, seq: 1, secret: testSecret}, 1<<20, false, false)
		if err != nil {
			t.Fatal(err)
		}
		w.close()
		return w, r
	}
	// The last frame's last byte never reached the disk.
	if _, err := l.f.WriteAt([]byte{0}, w.at-1); err != nil {
		t.Fatal(err)
	}
	if w, r := reopen(); !slices.Equal(keysOf(r.entries), []string{"a=1", "-b", "c=2"}) || r.lastFence != 2 || w.at != at || w.seq != 3 {
		t.Fatalf("torn last frame: got %v, fence %d, end %d, next frame %d", keysOf(r.entries), r.lastFence, w.at, w.seq)
	}
	// Its header (the length) is torn instead.
	if _, err := l.f.WriteAt([]byte{0xff}, at+17); err != nil {
		t.Fatal(err)
	}
	if _, r := reopen(); len(r.entries) != 3 {
		t.Fatalf("torn header: got %v", keysOf(r.entries))
	}
}

// TestLogForgedFrame: a frame whose checksum holds for anyone who does not
// know the store's secret (bytes a client chose, left in the file by an
// older frame's result, where a newer generation's frames end) is not read.
func TestLogForgedFrame(t *testing.T) {
	path := filepath.Join(t.TempDir(), "idem.db")
	w, _, _, err := openLog(path, logStart{gen: 1, seq: 1, secret: testSecret}, 1<<20, false, false)
	if err != nil {
		t.Fatal(err)
	}
	defer w.close()
	mustAppend(t, w, 1, logEntry{key: "a", val: []byte("1")})
	forger := &wal{files: w.files, gen: w.gen, seq: w.seq, at: w.at, sync: func(*os.File) error { return nil }}
	for range 2 { // the second frame would reveal damage if the first were read
		if err := forger.appendFrame([]logEntry{{key: "b", val: []byte("forged")}}, 2); err != nil {
			t.Fatal(err)
		}
	}
	w2, r, _, err := openLog(path, logStart{gen: 1, seq: 1, secret: testSecret}, 1<<20, false, false)
	if err != nil || !slices.Equal(keysOf(r.entries), []string{"a=1"}) {
		t.Fatalf("got %v, %v; want only a", keysOf(r.entries), err)
	}
	w2.close()
}

// TestLogCorruptFrame: a frame whose checksum holds but whose payload
// cannot be read was not torn by a crash: Open reports ErrCorrupt rather
// than drop what follows.
func TestLogCorruptFrame(t *testing.T) {
	path := filepath.Join(t.TempDir(), "idem.db")
	s, err := Open(path, WithSweepInterval(0))
	if err != nil {
		t.Fatal(err)
	}
	mustAcquire(t, s, "k", newReq("o", time.Minute), storekit.Acquired)
	// A frame of the current generation, with a bad entry kind, written as
	// the writer would after the store's frames.
	bad := &wal{files: s.log.files, gen: s.log.gen, seq: s.log.seq, at: s.log.at, secret: s.log.secret, sync: s.log.sync}
	if err := bad.appendFrame([]logEntry{{key: "x", val: []byte("v")}}, 1); err != nil {
		t.Fatal(err)
	}
	f := s.log.files[s.log.gen%2].f
	b := make([]byte, bad.at-s.log.at)
	if _, err := f.ReadAt(b, s.log.at); err != nil {
		t.Fatal(err)
	}
	b[frameHeader+8+2] = 7 // the entry kind, after the fence and "x"
	binary.BigEndian.PutUint32(b[20:], crc32.Checksum(b[frameHeader:], crcTable))
	binary.BigEndian.PutUint32(b[24:], s.log.headerSum(b))
	if _, err := f.WriteAt(b, s.log.at); err != nil {
		t.Fatal(err)
	}
	crashCopy(t, s, filepath.Join(t.TempDir(), "copy.db"), func(copy string) {
		_, err := Open(copy)
		var ce *CorruptLogError
		if !errors.As(err, &ce) || !errors.Is(err, ErrCorrupt) || ce.Path != logPaths(copy)[s.log.gen%2] || ce.Offset != s.log.at {
			t.Fatalf("Open with a corrupt frame: got %v, want a *CorruptLogError at byte %d of %s", err, s.log.at, logPaths(copy)[s.log.gen%2])
		}
	})
	s.Close()
}

// crashCopy copies the store's file and log, as a crash would leave them
// (the store must be idle), to path and calls fn with it.
func crashCopy(t *testing.T, s *Store, path string, fn func(path string)) {
	t.Helper()
	for _, suffix := range []string{"", ".log.0", ".log.1"} {
		src, err := os.Open(s.Path() + suffix)
		if err != nil {
			t.Fatal(err)
		}
		dst, err := os.Create(path + suffix)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := io.Copy(dst, src); err != nil {
			t.Fatal(err)
		}
		src.Close()
		if err := dst.Close(); err != nil {
			t.Fatal(err)
		}
	}
	fn(path)
}

// TestRecoverFromLog: what a crash left only in the log (acknowledged
// writes since the last checkpoint) is in the store after Open, with the
// last fence; a write after the crash continues both.
func TestRecoverFromLog(t *testing.T) {
	clock := newFakeClock()
	s := openTest(t, filepath.Join(t.TempDir(), "idem.db"), WithClock(clock.Now), WithSweepInterval(0))
	ctx := t.Context()
	a := mustAcquire(t, s, "in-file", newReq("o", time.Minute), storekit.Acquired)
	if err := s.Complete(ctx, "in-file", a.Lease, []byte("r1"), time.Hour); err != nil {
		t.Fatal(err)
	}
	mustAcquire(t, s, "deleted", newReq("o", time.Minute), storekit.Acquired)
	if _, err := s.requestCheckpoint(ctx); err != nil {
		t.Fatal(err)
	}
	b := mustAcquire(t, s, "in-log", newReq("o", time.Minute), storekit.Acquired)
	if err := s.Complete(ctx, "in-log", b.Lease, []byte("r2"), time.Hour); err != nil {
		t.Fatal(err)
	}
	if err := s.Delete(ctx, "deleted"); err != nil {
		t.Fatal(err)
	}
	if recs, _ := onDisk(t, s); recs != 2 || inOverlay(s) != 2 {
		t.Fatalf("before the crash: %d records in the file, %d in the log; want 2 and 2", recs, inOverlay(s))
	}
	crashCopy(t, s, filepath.Join(t.TempDir(), "copy.db"), func(copy string) {
		c := openTest(t, copy, WithClock(clock.Now), WithSweepInterval(0))
		for key, want := range map[string]string{"in-file": "r1", "in-log": "r2"} {
			if rec, err := c.Get(ctx, key); err != nil || string(rec.Result) != want {
				t.Fatalf("%s after the crash: got %+v, %v; want result %q", key, rec, err, want)
			}
		}
		if _, err := c.Get(ctx, "deleted"); !errors.Is(err, storekit.ErrNotFound) {
			t.Fatalf("deleted key after the crash: got %v, want ErrNotFound", err)
		}
		if recs, _ := onDisk(t, c); recs != 2 || inOverlay(c) != 0 {
			t.Fatalf("after recovery: %d records in the file, %d in the log; want 2 and 0", recs, inOverlay(c))
		}
		// The fence of the record only the log held is the last issued.
		clock.Add(-time.Hour)
		n := mustAcquire(t, c, "new", newReq("o", time.Minute), storekit.Acquired)
		if n.Lease.Fence <= b.Lease.Fence {
			t.Fatalf("fence after recovery: got %d, want > %d", n.Lease.Fence, b.Lease.Fence)
		}
	})
}

// TestLogWriteFails: a group whose frame cannot be written (a full disk,
// a file size limit) is not acknowledged, and once the log can be written
// again, writes go on; a crash after that loses nothing acknowledged and
// brings back nothing that was not.
func TestLogWriteFails(t *testing.T) {
	s := openTest(t, filepath.Join(t.TempDir(), "idem.db"), WithSweepInterval(0))
	ctx := t.Context()
	mustAcquire(t, s, "k", newReq("o", time.Minute), storekit.Acquired)
	l := &s.log.files[s.log.gen%2]
	bad, err := os.Open(l.f.Name()) // read-only: writes fail
	if err != nil {
		t.Fatal(err)
	}
	defer bad.Close()
	var f *os.File
	swap := func(*txn) error { f, l.f = l.f, f; return nil } // on the writer
	f = bad
	if err := s.write(ctx, swap); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Acquire(ctx, "a-longer-key-that-fails", newReq("o", time.Minute)); err == nil {
		t.Fatal("Acquire with a log that cannot be written: no error")
	}
	if err := s.write(ctx, swap); err != nil {
		t.Fatal(err)
	}
	mustAcquire(t, s, "k2", newReq("o", time.Minute), storekit.Acquired)
	mustAcquire(t, s, "k", newReq("o2", time.Minute), storekit.InProgress)
	crashCopy(t, s, filepath.Join(t.TempDir(), "copy.db"), func(copy string) {
		c := openTest(t, copy, WithSweepInterval(0))
		for key, want := range map[string]error{"k": nil, "k2": nil, "a-longer-key-that-fails": storekit.ErrNotFound} {
			if _, err := c.Get(ctx, key); !errors.Is(err, want) {
				t.Fatalf("%s after the crash: got %v, want %v", key, err, want)
			}
		}
	})
}

// TestLogSyncFails: once a sync of the log failed, no write is
// acknowledged (what the disk holds is unknown), even when syncs work
// again, and reads go on.
func TestLogSyncFails(t *testing.T) {
	s := openTest(t, filepath.Join(t.TempDir(), "idem.db"), WithSweepInterval(0))
	ctx := t.Context()
	mustAcquire(t, s, "k", newReq("o", time.Minute), storekit.Acquired)
	failing := errors.New("EIO")
	set := func(sync func(*os.File) error) {
		if err := s.write(ctx, func(t *txn) error { t.s.log.sync = sync; return nil }); err != nil {
			t.Fatal(err)
		}
	}
	set(func(*os.File) error { return failing })
	if _, err := s.Acquire(ctx, "k2", newReq("o", time.Minute)); !errors.Is(err, failing) {
		t.Fatalf("Acquire with a sync that fails: got %v, want %v", err, failing)
	}
	set(fsync.Data)
	if _, err := s.Acquire(ctx, "k3", newReq("o", time.Minute)); !errors.Is(err, failing) {
		t.Fatalf("Acquire after a failed sync: got %v, want the failed sync's error", err)
	}
	mustAcquire(t, s, "k", newReq("o2", time.Minute), storekit.InProgress)
	if _, err := s.Get(ctx, "k2"); !errors.Is(err, storekit.ErrNotFound) {
		t.Fatalf("Get of the write whose sync failed: got %v, want ErrNotFound", err)
	}
}

// TestCheckpointUnderLoad: with a log small enough for a checkpoint every
// few groups, every acknowledged record reads back, from the overlay or the
// file, while checkpoints move records from one to the other.
func TestCheckpointUnderLoad(t *testing.T) {
	s := openTest(t, filepath.Join(t.TempDir(), "idem.db"), withLogLimit(8<<10), WithSweepInterval(0))
	ctx := t.Context()
	frames := s.log.frames.Load()
	var wg sync.WaitGroup
	done := make(chan string, 64)
	for g := range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range 300 {
				key := fmt.Sprint(g, "-", i)
				a, err := s.Acquire(ctx, key, newReq("o", time.Minute))
				if err == nil {
					err = s.Complete(ctx, key, a.Lease, []byte(key), time.Hour)
				}
				if err != nil {
					t.Error(err)
					return
				}
				done <- key
			}
		}()
	}
	go func() { wg.Wait(); close(done) }()
	var keys []string
	for key := range done {
		keys = append(keys, key)
		// The key just completed and one completed earlier, at random.
		for _, k := range []string{key, keys[rand.IntN(len(keys))]} {
			if rec, err := s.Get(ctx, k); err != nil || rec.State != storekit.StateCompleted || string(rec.Result) != k {
				t.Fatalf("%s, acknowledged: got %v %q, %v", k, rec.State, rec.Result, err)
			}
		}
	}
	// The log first, then the file: a checkpoint may end in between,
	// and records only move from the log to the file, so none is missed
	// (some may be counted twice).
	logged := inOverlay(s)
	recs, _ := onDisk(t, s)
	t.Logf("%d frames; %d records in the file, %d in the log", s.log.frames.Load()-frames, recs, logged)
	if recs == 0 || recs+logged < len(keys) {
		t.Fatalf("%d records in the file and %d in the log for %d keys: the checkpoints did not run", recs, logged, len(keys))
	}
	if entries, err := s.List(ctx, 10000); err != nil || len(entries) != len(keys) {
		t.Fatalf("List: got %d entries, %v; want %d", len(entries), err, len(keys))
	}
}

// TestOpenFormat1: a file from before the log (format 1: no generation, no
// secret) opens with its records, and becomes format 3, which versions from
// before the log refuse; a format this version does not know is refused.
func TestOpenFormat1(t *testing.T) {
	path := filepath.Join(t.TempDir(), "idem.db")
	s, err := Open(path, WithSweepInterval(0))
	if err != nil {
		t.Fatal(err)
	}
	mustAcquire(t, s, "k", newReq("o", time.Minute), storekit.Acquired)
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	setMeta := func(format byte) {
		t.Helper()
		db, err := bolt.Open(path, 0o600, nil)
		if err != nil {
			t.Fatal(err)
		}
		defer db.Close()
		err = db.Update(func(tx *bolt.Tx) error {
			meta := tx.Bucket(bucketMeta)
			for _, k := range [][]byte{metaLog, metaLogSecret, metaLogSeq} {
				if err := meta.Delete(k); err != nil {
					return err
				}
			}
			return meta.Put(metaFormat, []byte{format})
		})
		if err != nil {
			t.Fatal(err)
		}
	}
	setMeta(1)
	for _, suffix := range []string{".log.0", ".log.1"} {
		if err := os.Remove(path + suffix); err != nil {
			t.Fatal(err)
		}
	}
	s = openTest(t, path, WithSweepInterval(0))
	mustAcquire(t, s, "k", newReq("o2", time.Minute), storekit.InProgress)
	mustAcquire(t, s, "k2", newReq("o", time.Minute), storekit.Acquired)
	if len(s.logStart.secret) != 8 {
		t.Fatalf("log secret of %d bytes", len(s.logStart.secret))
	}
	err = s.db.View(func(tx *bolt.Tx) error {
		if v := tx.Bucket(bucketMeta).Get(metaFormat); !slices.Equal(v, []byte{3}) {
			t.Errorf("format after Open: got %v, want [3]", v)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	s.Close()
	setMeta(4)
	if _, err := Open(path); !errors.Is(err, ErrCorrupt) {
		t.Fatalf("Open of format 4: got %v, want ErrCorrupt", err)
	}
}

// TestCheckpointBesideLongRead: a long read (List or Stats of a large
// store, which hold one read transaction) holds up neither the checkpoints
// nor the writes, while checkpoints grow the file many times over. bbolt
// waits for every read transaction to end before it maps a grown file
// again, and every read transaction begun meanwhile, the writer's among
// them, waits for that.
func TestCheckpointBesideLongRead(t *testing.T) {
	s := openTest(t, filepath.Join(t.TempDir(), "idem.db"), withLogLimit(64<<10), WithSweepInterval(0))
	ctx := t.Context()
	reading, release := make(chan struct{}), make(chan struct{})
	go s.snapshot(func(*bolt.Tx, map[string][]byte) error {
		close(reading)
		<-release
		return nil
	})
	<-reading
	t.Cleanup(func() { close(release) }) // before the store closes
	before := dataSize(t, s.db)
	const n = 1000
	wrote := make(chan error, 1)
	go func() {
		result := make([]byte, 1<<10)
		for i := range n {
			key := fmt.Sprint(i)
			a, err := s.Acquire(ctx, key, newReq("o", time.Minute))
			if err == nil {
				err = s.Complete(ctx, key, a.Lease, result, time.Hour)
			}
			if err != nil {
				wrote <- err
				return
			}
		}
		_, err := s.requestCheckpoint(ctx)
		wrote <- err
	}()
	select {
	case err := <-wrote:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(time.Minute):
		t.Fatal("writes or checkpoints stalled while a read transaction was open")
	}
	after := dataSize(t, s.db)
	if recs, _ := onDisk(t, s); recs != n || after < 16*before {
		t.Fatalf("%d records in the file, whose data grew from %d to %d bytes; want %d records and data grown 16 times", recs, before, after, n)
	}
}
