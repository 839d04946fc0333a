package boltstore

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/idemgo/idem/storekit"
	bolt "go.etcd.io/bbolt"
)

// testLog is a log as a crash leaves it, built at the level of the frames,
// for the tests of damage: four generations written one after the other,
// so that the two the file lacks (gen and gen+1) sit over older frames and
// zeros, and both files hold frames that are not read.
type testLog struct {
	path   string
	start  logStart
	frames []testFrame // the acknowledged frames the file lacks, in order
	images [2][]byte   // the files' bytes
}

// testFrame is an acknowledged frame of a testLog.
type testFrame struct {
	file    int   // index of the log file
	at, end int64 // where the frame lies in it
	entries []logEntry
}

// newTestLog writes the log into dir: generations 1 and 2 of 5 frames each,
// then 3 and 4 (those the file lacks: it says generation 3) of 4 and
// perFile frames, each file then cut to its frames and 64 bytes of zeros.
// With torn, an unacknowledged frame follows, torn: its first half written.
func newTestLog(t testing.TB, dir string, perFile int, torn bool) *testLog {
	t.Helper()
	l := &testLog{path: filepath.Join(dir, "idem.db")}
	w, _, _, err := openLog(l.path, logStart{gen: 0, seq: 1, secret: testSecret}, 1<<20, false, false)
	if err != nil {
		t.Fatal(err)
	}
	defer w.close()
	var written [2]int64
	for gen, count := range []int{5, 5, 4, perFile} {
		if gen > 0 {
			w.next()
		}
		if gen == 2 {
			l.start = logStart{gen: w.gen, seq: w.seq, secret: testSecret}
		}
		for range count {
			var es []logEntry
			for j := range 1 + int(w.seq%3) {
				e := logEntry{key: fmt.Sprintf("k%d-%d", w.seq, j)}
				if (w.seq+uint64(j))%4 != 0 {
					e.val = bytes.Repeat([]byte{byte('a' + w.seq%26)}, 10+int(w.seq*7%50))
				}
				es = append(es, e)
			}
			at := w.at
			mustAppend(t, w, int64(w.seq), es...)
			if gen >= 2 {
				l.frames = append(l.frames, testFrame{file: int(w.gen % 2), at: at, end: w.at, entries: es})
			}
			written[w.gen%2] = max(written[w.gen%2], w.at)
		}
	}
	if torn {
		mustAppend(t, w, 0, logEntry{key: "unacknowledged", val: bytes.Repeat([]byte{'u'}, 80)})
		f := w.files[w.gen%2].f
		half := (w.at - l.frames[len(l.frames)-1].end) / 2
		if _, err := f.WriteAt(make([]byte, w.at-l.frames[len(l.frames)-1].end-half), l.frames[len(l.frames)-1].end+half); err != nil {
			t.Fatal(err)
		}
		written[w.gen%2] = max(written[w.gen%2], w.at)
	}
	for i := range 2 {
		if err := w.files[i].f.Truncate(written[i] + 64); err != nil {
			t.Fatal(err)
		}
		b, err := os.ReadFile(w.files[i].f.Name())
		if err != nil {
			t.Fatal(err)
		}
		l.images[i] = b
	}
	return l
}

// entries are the entries of frames, in order.
func entriesOf(frames []testFrame) []logEntry {
	var es []logEntry
	for _, f := range frames {
		es = append(es, f.entries...)
	}
	return es
}

// read reads the log as Open does, or as Recover does with salvage.
func (l *testLog) read(trustEnd bool) (logRead, error) { return l.readAs(false, trustEnd) }

func (l *testLog) readAs(salvage, trustEnd bool) (logRead, error) {
	w, r, _, err := openLog(l.path, l.start, 1<<20, salvage, trustEnd)
	if err == nil {
		w.close()
	}
	return r, err
}

// checkSalvage checks that the salvage of a log whose damage was detected
// reads every frame that no damage hit, and counts the others as lost.
func (l *testLog) checkSalvage(file int, changed []bool) string {
	r, err := l.readAs(true, false)
	var whole []testFrame
	lost := 0
	for _, f := range l.frames {
		if f.file == file && slices.Contains(changed[f.at:f.end], true) {
			lost++
		} else {
			whole = append(whole, f)
		}
	}
	total := uint64(0)
	for _, d := range r.damage {
		total += d.Frames
	}
	if err != nil || !slices.EqualFunc(r.entries, entriesOf(whole), entryEqual) || total != uint64(lost) {
		return fmt.Sprintf("salvage: got %d entries, %d frames lost (%+v), %v; want %d entries, %d frames lost", len(r.entries), total, r.damage, err, len(entriesOf(whole)), lost)
	}
	return ""
}

// damage writes image, of the file's size, as file's bytes and returns
// which bytes differ from the log's own.
func (l *testLog) damage(t testing.TB, file int, image []byte) []bool {
	t.Helper()
	l.write(t, file, image)
	changed := make([]bool, len(l.images[file]))
	for i := range changed {
		changed[i] = image[i] != l.images[file][i]
	}
	return changed
}

// restore writes the file's own bytes back.
func (l *testLog) restore(t testing.TB, file int) {
	t.Helper()
	l.write(t, file, l.images[file])
}

// write writes the bytes of image that differ from the file's in place
// (the file keeps its size: a test writes thousands of images).
func (l *testLog) write(t testing.TB, file int, image []byte) {
	t.Helper()
	f, err := os.OpenFile(logPaths(l.path)[file], os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if _, err := f.WriteAt(image, 0); err != nil {
		t.Fatal(err)
	}
}

// Outcomes of reading a damaged log.
const (
	outcomeIntact   = "intact"   // every acknowledged entry read: the damage hit no frame of the log
	outcomeDetected = "detected" // a *CorruptLogError naming the damaged frame
	outcomeTail     = "tail"     // the frames from the first damaged one on are missing, and so are the headers of all that follow it: as after a torn write
	outcomeSilent   = "silent"   // acknowledged entries missing without an error
)

// judge classifies the outcome of reading the log after the bytes changed
// of file were damaged, and says what is wrong with it if anything: the
// damage must be reported (as a *CorruptLogError at the start of the first
// damaged frame), or leave every acknowledged entry, or be indistinguishable
// from a torn end (every frame after the first damaged one has a damaged
// header) and lose exactly the frames from the first damaged one on.
func (l *testLog) judge(r logRead, err error, file int, changed []bool) (outcome, problem string) {
	first := -1
	for i, f := range l.frames {
		if f.file == file && slices.Contains(changed[f.at:f.end], true) {
			first = i
			break
		}
	}
	var ce *CorruptLogError
	switch {
	case errors.As(err, &ce):
		if first < 0 {
			return outcomeDetected, fmt.Sprintf("damage reported where no frame of the log was hit: %v", err)
		}
		if f := l.frames[first]; ce.Path != logPaths(l.path)[file] || ce.Offset != f.at || !errors.Is(err, ErrCorrupt) {
			return outcomeDetected, fmt.Sprintf("got %v, want damage reported at byte %d of %s", err, f.at, logPaths(l.path)[file])
		}
		return outcomeDetected, ""
	case err != nil:
		return "", fmt.Sprintf("got %v, want nil or a *CorruptLogError", err)
	case slices.EqualFunc(r.entries, entriesOf(l.frames), entryEqual):
		if first >= 0 {
			return outcomeIntact, "every entry read from a damaged frame"
		}
		return outcomeIntact, ""
	case first >= 0 && slices.EqualFunc(r.entries, entriesOf(l.frames[:first]), entryEqual):
		for _, f := range l.frames[first+1:] {
			if f.file != file || !slices.Contains(changed[f.at:f.at+frameHeader], true) {
				return outcomeSilent, fmt.Sprintf("frames %d to %d dropped without an error while the header at byte %d of log file %d is whole", first, len(l.frames)-1, f.at, f.file)
			}
		}
		return outcomeTail, ""
	}
	return outcomeSilent, fmt.Sprintf("read %d of %d acknowledged entries without an error", len(r.entries), len(entriesOf(l.frames)))
}

func entryEqual(a, b logEntry) bool { return a.key == b.key && bytes.Equal(a.val, b.val) }

// TestLogDamageEveryOffset damages a log with two generations (the file's
// and the next, over older frames and zeros) at every offset of both
// files: one byte inverted, and 300 bytes inverted as in a block that was
// overwritten. Every outcome must be: the damage reported with the file and
// the frame's offset (and then the salvage of Recover reads every frame the
// damage did not hit and counts the others), or every acknowledged record
// read, or (damage that leaves no later frame's header, which a torn write
// cannot be told from) the frames from the damaged one on missing. A
// silent loss fails the test. The negative control reads the same logs as
// before the frames were numbered (withTrustedLogEnd) and must show silent
// losses.
func TestLogDamageEveryOffset(t *testing.T) {
	for _, torn := range []bool{false, true} {
		l := newTestLog(t, t.TempDir(), 4, torn)
		if r, err := l.read(false); err != nil || !slices.EqualFunc(r.entries, entriesOf(l.frames), entryEqual) {
			t.Fatalf("undamaged log: got %d entries, %v; want %d", len(r.entries), err, len(entriesOf(l.frames)))
		}
		for _, width := range []int{1, 300} {
			for _, trustEnd := range []bool{false, true} {
				counts := map[string]int{}
				tried := 0
				for file := range 2 {
					for off := range l.images[file] {
						image := bytes.Clone(l.images[file])
						for i := off; i < min(off+width, len(image)); i++ {
							image[i] ^= 0xa5
						}
						changed := l.damage(t, file, image)
						r, err := l.read(trustEnd)
						outcome, problem := l.judge(r, err, file, changed)
						if outcome == outcomeDetected && problem == "" {
							problem = l.checkSalvage(file, changed)
						}
						if problem != "" && !(trustEnd && outcome == outcomeSilent) {
							t.Fatalf("torn end %v, %d bytes at byte %d of log file %d: %s", torn, width, off, file, problem)
						}
						counts[outcome]++
						tried++
					}
					l.restore(t, file)
				}
				t.Logf("torn end %v, %d bytes damaged, trusted end %v: %d offsets: %v", torn, width, trustEnd, tried, counts)
				switch {
				case !trustEnd && counts[outcomeSilent] > 0:
					t.Errorf("%d silent losses, want 0", counts[outcomeSilent])
				case trustEnd && counts[outcomeSilent] == 0:
					t.Errorf("negative control: no silent loss; the test cannot see one")
				case counts[outcomeDetected] == 0 && !trustEnd:
					t.Errorf("no damage detected")
				}
			}
		}
	}
}

// FuzzLogDamage overwrites bytes of a log (see TestLogDamageEveryOffset)
// with the fuzzer's and checks that every outcome is allowed: the damage
// reported, nothing lost, or a loss that a torn end cannot be told from.
func FuzzLogDamage(f *testing.F) {
	f.Add(uint8(1), uint16(40), []byte("XXXXXXXXXXXXXXXXXXXXXXXXXXXXXXXXXXXXXXXXXXXXXXXXXX"))
	f.Add(uint8(0), uint16(0), make([]byte, 28))
	f.Add(uint8(1), uint16(3), []byte{0xff})
	f.Add(uint8(0), uint16(100), bytes.Repeat([]byte{0}, 300))
	f.Add(uint8(1), uint16(200), []byte{1, 2, 3, 4, 5, 6, 7, 8})
	l := newTestLog(f, f.TempDir(), 4, true)
	f.Fuzz(func(t *testing.T, file uint8, off uint16, patch []byte) {
		i := int(file % 2)
		image := bytes.Clone(l.images[i])
		if int(off) < len(image) {
			copy(image[off:], patch)
		}
		changed := l.damage(t, i, image)
		defer l.restore(t, i)
		r, err := l.read(false)
		if _, problem := l.judge(r, err, i, changed); problem != "" {
			t.Fatalf("%d bytes at byte %d of log file %d: %s", len(patch), off, i, problem)
		}
	})
}

// TestLogTornTail: whatever a crash leaves of the last group's frame
// (never acknowledged) where it was being written, over an older frame:
// any part of it, zeros, other bytes, or all of it, the log opens with
// every acknowledged record.
func TestLogTornTail(t *testing.T) {
	l := newTestLog(t, t.TempDir(), 2, false)
	last := l.frames[len(l.frames)-1]
	// The next frame, as the writer would write it, over generation 2's
	// frames in file 0.
	w := &wal{gen: l.start.gen + 1, seq: l.start.seq + uint64(len(l.frames)), secret: testSecret}
	frame := w.buildFrame(t, logEntry{key: "torn", val: bytes.Repeat([]byte{'t'}, 120)})
	if last.end+int64(len(frame)) > int64(len(l.images[last.file])) {
		t.Fatalf("the torn frame goes past the end of the file")
	}
	old := l.images[last.file][last.end : last.end+int64(len(frame))]
	if bytes.Count(old, []byte{0}) == len(old) {
		t.Fatal("the torn frame lies over zeros; want it over older frames")
	}
	for _, tc := range []struct {
		name string
		make func(n int) []byte // the bytes where the frame goes, n: a length
	}{
		{"prefix written", func(n int) []byte { return append(bytes.Clone(frame[:n]), old[n:]...) }},
		{"suffix written", func(n int) []byte { return append(bytes.Clone(old[:n]), frame[n:]...) }},
		{"zeros", func(n int) []byte { return append(make([]byte, n), old[n:]...) }},
		{"garbage", func(n int) []byte { return append(bytes.Repeat([]byte{0x5a}, n), old[n:]...) }},
		{"whole, a byte wrong", func(n int) []byte { b := bytes.Clone(frame); b[n] ^= 1; return b }},
	} {
		for n := 1; n < len(frame); n++ {
			image := bytes.Clone(l.images[last.file])
			copy(image[last.end:], tc.make(n))
			l.damage(t, last.file, image)
			r, err := l.read(false)
			if err != nil || !slices.EqualFunc(r.entries, entriesOf(l.frames), entryEqual) {
				t.Fatalf("%s, %d bytes: got %d entries, %v; want the %d acknowledged", tc.name, n, len(r.entries), err, len(entriesOf(l.frames)))
			}
		}
	}
	l.restore(t, last.file)
}

// buildFrame returns the bytes of the frame w would append next.
func (w *wal) buildFrame(t *testing.T, es ...logEntry) []byte {
	t.Helper()
	f, err := os.CreateTemp(t.TempDir(), "frame")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	c := &wal{gen: w.gen, seq: w.seq, secret: w.secret, files: [2]logFile{{f: f}, {f: f}}, sync: func(*os.File) error { return nil }}
	if err := c.appendFrame(es, 0); err != nil {
		t.Fatal(err)
	}
	return bytes.Clone(c.buf)
}

// TestLogDamageAcrossGenerations: the last frames of the file's
// generation damaged, while the next generation's frames (in the other
// file) were written after them: the first frame of the next generation
// does not follow the last whole one, so the damage is reported in the
// first file, and Recover reads the second.
func TestLogDamageAcrossGenerations(t *testing.T) {
	l := newTestLog(t, t.TempDir(), 3, false)
	// Generation 3's last two frames (file 1), up to the end of the file.
	f := l.frames[2]
	image := bytes.Clone(l.images[1])
	for i := f.at; i < int64(len(image)); i++ {
		image[i] = 0
	}
	l.damage(t, 1, image)
	_, err := l.read(false)
	var ce *CorruptLogError
	if !errors.As(err, &ce) || ce.Path != logPaths(l.path)[1] || ce.Offset != f.at || ce.Next != -1 || ce.Frames != 2 {
		t.Fatalf("got %v, want 2 frames missing at byte %d of %s, before the other file's", err, f.at, logPaths(l.path)[1])
	}
	w, r, _, err := openLog(l.path, l.start, 1<<20, true, false)
	if err != nil {
		t.Fatal(err)
	}
	w.close()
	want := entriesOf(append(slices.Clone(l.frames[:2]), l.frames[4:]...))
	if !slices.EqualFunc(r.entries, want, entryEqual) || len(r.damage) != 1 || r.damage[0] != ce.LogDamage {
		t.Fatalf("salvaged %v, damage %+v; want %v and %+v", keysOf(r.entries), r.damage, keysOf(want), ce.LogDamage)
	}
}

// TestLogDamagedMiddle: the case of the issue. 300 keys completed, the
// process killed before a checkpoint (a copy of the files), 300 bytes of
// the log overwritten at offset 2000: Open refuses the store with a
// *CorruptLogError naming the file and the offset, where it used to open
// without 286 of the 300 keys. Recover keeps every frame that is whole and
// copies the damaged log aside; the store then opens with every key but
// those of the frames it reports lost.
func TestLogDamagedMiddle(t *testing.T) {
	s := openTest(t, filepath.Join(t.TempDir(), "idem.db"), WithSweepInterval(0))
	ctx := t.Context()
	const n = 300
	for i := range n {
		key := fmt.Sprint("key-", i)
		a := mustAcquire(t, s, key, newReq("o", time.Minute), storekit.Acquired)
		if err := s.Complete(ctx, key, a.Lease, []byte(key), time.Hour); err != nil {
			t.Fatal(err)
		}
	}
	crashCopy(t, s, filepath.Join(t.TempDir(), "copy.db"), func(copy string) {
		log := copy + ".log.1"
		f, err := os.OpenFile(log, os.O_RDWR, 0)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := f.WriteAt([]byte(strings.Repeat("X", 300)), 2000); err != nil {
			t.Fatal(err)
		}
		f.Close()
		damaged, err := os.ReadFile(log)
		if err != nil {
			t.Fatal(err)
		}
		c, err := Open(copy, WithSweepInterval(0))
		if err == nil {
			missing := 0
			for i := range n {
				if _, err := c.Get(ctx, fmt.Sprint("key-", i)); err != nil {
					missing++
				}
			}
			c.Close()
			t.Fatalf("Open of a log damaged in the middle: got no error (%d of %d acknowledged keys missing), want ErrCorrupt", missing, n)
		}
		var ce *CorruptLogError
		if !errors.As(err, &ce) || !errors.Is(err, ErrCorrupt) || ce.Path != log || ce.Offset > 2000 || ce.Next < 2300 || ce.Frames == 0 ||
			!strings.Contains(err.Error(), log) || !strings.Contains(err.Error(), fmt.Sprint("byte ", ce.Offset)) {
			t.Fatalf("Open of a log damaged in the middle: got %v, want a *CorruptLogError naming %s and the offset", err, log)
		}
		t.Logf("Open: %v", err)

		rec, err := Recover(copy)
		if err != nil {
			t.Fatal(err)
		}
		t.Logf("Recover: %+v", rec)
		if len(rec.Damage) != 1 || rec.Damage[0] != ce.LogDamage || rec.Lost != ce.Frames || len(rec.Saved) != 2 {
			t.Fatalf("Recover: got %+v, want the damage Open reported and 2 copies", rec)
		}
		if saved, err := os.ReadFile(rec.Saved[1]); err != nil || !bytes.Equal(saved, damaged) || !strings.HasPrefix(rec.Saved[1], log+".damaged-") {
			t.Fatalf("copy of the damaged log %s: %v; want the damaged bytes", rec.Saved[1], err)
		}
		// Each request's two writes went to frames of their own: the
		// keys whose COMPLETED frame was lost are not completed.
		c = openTest(t, copy, WithSweepInterval(0))
		completed := 0
		for i := range n {
			if rec, err := c.Get(ctx, fmt.Sprint("key-", i)); err == nil && rec.State == storekit.StateCompleted {
				completed++
			}
		}
		if completed < n-int(rec.Lost) || completed == n || rec.Frames != 2*n-int(rec.Lost) {
			t.Fatalf("after Recover: %d of %d keys completed, %d frames read; want at least %d of them, and %d frames", completed, n, rec.Frames, n-int(rec.Lost), 2*n-int(rec.Lost))
		}
	})
}

// TestRecover: Recover of a log without damage does what Open does and
// copies nothing; of a store whose file does not exist, or is open, it
// fails; after a repair, Recover finds no damage.
func TestRecover(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "idem.db")
	if _, err := Recover(path); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("Recover of no store: got %v, want ErrNotExist", err)
	}
	s := openTest(t, path, WithSweepInterval(0))
	mustAcquire(t, s, "k", newReq("o", time.Minute), storekit.Acquired)
	if _, err := Recover(path, WithLockTimeout(10*time.Millisecond)); !errors.Is(err, ErrLocked) {
		t.Fatalf("Recover of an open store: got %v, want ErrLocked", err)
	}
	crashCopy(t, s, filepath.Join(t.TempDir(), "copy.db"), func(copy string) {
		for range 2 {
			rec, err := Recover(copy)
			if err != nil || len(rec.Damage) != 0 || rec.Lost != 0 || len(rec.Saved) != 0 {
				t.Fatalf("Recover of a whole log: got %+v, %v; want no damage and no copy", rec, err)
			}
		}
		c := openTest(t, copy, WithSweepInterval(0))
		mustAcquire(t, c, "k", newReq("o2", time.Minute), storekit.InProgress)
		if recs, _ := onDisk(t, c); recs != 1 {
			t.Fatalf("after Recover: %d records in the file, want 1", recs)
		}
	})
}

// TestOpenFormat2Log: a store of format 2 killed with records only in its
// log (frames without sequence numbers) opens with them, and is format 3
// from then on, with its log read once: frames written after are numbered.
func TestOpenFormat2Log(t *testing.T) {
	path := filepath.Join(t.TempDir(), "idem.db")
	s, err := Open(path, WithSweepInterval(0))
	if err != nil {
		t.Fatal(err)
	}
	mustAcquire(t, s, "in-file", newReq("o", time.Minute), storekit.Acquired)
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	// The file as format 2 left it: generation 4, and two frames of
	// generation 5 (file 1), with the header of format 2.
	db, err := bolt.Open(path, 0o600, nil)
	if err != nil {
		t.Fatal(err)
	}
	var secret []byte
	err = db.Update(func(tx *bolt.Tx) error {
		meta := tx.Bucket(bucketMeta)
		secret = bytes.Clone(meta.Get(metaLogSecret))
		return errors.Join(meta.Put(metaFormat, []byte{2}), meta.Delete(metaLogSeq), meta.Put(metaLog, binary.BigEndian.AppendUint64(nil, 4)))
	})
	if err != nil || db.Close() != nil {
		t.Fatal(err)
	}
	rec := encode(&record{State: storekit.StateCompleted, Fence: 7, Fingerprint: "fp", Owner: "o", ExpiresAt: time.Now().Add(time.Hour).UnixMicro(), Result: []byte("r")})
	var log []byte
	for _, es := range [][]logEntry{{{key: "in-log", val: rec}}, {{key: "in-file"}}} {
		log = append(log, legacyFrame(5, secret, 7, es)...)
	}
	log = append(log, make([]byte, 100)...)
	if err := os.WriteFile(path+".log.1", log, 0o600); err != nil {
		t.Fatal(err)
	}

	s = openTest(t, path, WithSweepInterval(0))
	if r, err := s.Get(t.Context(), "in-log"); err != nil || string(r.Result) != "r" {
		t.Fatalf("record of the format 2 log: got %+v, %v", r, err)
	}
	if _, err := s.Get(t.Context(), "in-file"); !errors.Is(err, storekit.ErrNotFound) {
		t.Fatalf("record deleted by the format 2 log: got %v, want ErrNotFound", err)
	}
	err = s.db.View(func(tx *bolt.Tx) error {
		meta := tx.Bucket(bucketMeta)
		if v, g := meta.Get(metaFormat), binary.BigEndian.Uint64(meta.Get(metaLog)); !slices.Equal(v, []byte{3}) || g != 6 {
			t.Errorf("after Open: format %v, generation %d; want [3], 6", v, g)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	err = s.db.View(func(tx *bolt.Tx) error {
		if seq := binary.BigEndian.Uint64(tx.Bucket(bucketMeta).Get(metaLogSeq)); s.log.gen != 6 || s.log.seq != seq || s.log.first != seq {
			t.Errorf("the log goes on with generation %d, frame %d (first %d); want 6, %d (%[4]d)", s.log.gen, s.log.seq, s.log.first, seq)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}

// legacyFrame is a frame as format 2 wrote it.
func legacyFrame(gen uint64, secret []byte, fence int64, es []logEntry) []byte {
	b := appendPayload(make([]byte, legacyFrameHeader, 64), es, fence)
	binary.BigEndian.PutUint64(b, gen)
	binary.BigEndian.PutUint32(b[8:], uint32(len(b)-legacyFrameHeader))
	sum := crc32.Update(crc32.Checksum(secret, crcTable), crcTable, b[:12])
	binary.BigEndian.PutUint32(b[12:], crc32.Update(sum, crcTable, b[legacyFrameHeader:]))
	return b
}
