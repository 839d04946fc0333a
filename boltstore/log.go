package boltstore

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"io"
	"os"
	"sync/atomic"

	"github.com/idemgo/idem/internal/fsync"
)

// The log. Every group of writes is appended to a log file beside the bbolt
// file as one frame and fdatasynced: one write and one sync per group,
// where a bbolt commit writes every B+tree page the group changes and syncs
// twice. The records a frame holds are kept in memory (the overlay), which
// reads consult before the bbolt file. Once the log holds logLimit bytes (or
// the sweeper asks), a checkpoint applies the overlay to the bbolt file in
// one transaction, in the background: many groups' records share each page
// it writes.
//
// There are two log files, path + ".log.0" and ".log.1". The generation of
// the log is kept in the bbolt file (meta "log"); frames of generation g go
// to file g%2, from its start. A checkpoint freezes the overlay, moves the
// writer to generation g+1 (the other file, from its start; new writes go
// on there and into a new overlay), and commits the frozen overlay with
// generation g+1 in one transaction. So while the file says generation g,
// the records it lacks are in the frames of generations g and g+1, and
// recovery (Open) reads those two, in that order, each from the start of
// its file. Frames are written over a region of the file written before
// (zeros first, then older frames), so that a sync flushes data blocks and
// no file size; the region grows by logGrowth at a time.
//
// Frames are numbered: each carries a sequence number one more than the
// frame before it, across generations, and the checkpoint that moves the
// log to generation g records the number of g's first frame (meta
// "logseq"). A frame is written only once the frame before it is synced,
// so only the last frame of the log can be torn by a crash (or by a write
// that failed: the next frame goes to the same place); it was never
// acknowledged. A file's frames end where the next frame is not whole (its
// header's checksum, its generation, its number or its payload's checksum
// is wrong): older frames and zeros, or the torn last frame. Then recovery
// looks at the rest of the file for the header of a later frame of the
// same generation (the header has a checksum of its own, keyed with the
// log's secret: no bytes a client chose pass for one). Finding one means
// the frame before it was synced, so a frame that was acknowledged is
// damaged: Open fails with a *CorruptLogError, which names the file and
// the offset, rather than drop every acknowledged frame after the damage.
// The same holds across the two files: the first frame of generation g+1
// must be numbered right after the last one of generation g. Damage that
// leaves no later frame's header (the last frame, or the bytes from some
// frame to the end of the log) cannot be told from a torn write, and ends
// the log as one does. Recover reads every whole frame, past damage, and
// reports the frames missing between them.
//
// A frame:
//
//	uint64  generation
//	uint64  sequence number
//	uint32  length of the payload
//	uint32  CRC-32C of the payload
//	uint32  CRC-32C of the log's secret and the 24 bytes above
//	payload:
//	  uint64   the last fence issued once the group is applied
//	  entries, each:
//	    uvarint  len(key), key
//	    byte     1: the record below replaces key's; 0: key's record is deleted
//	    uvarint  len(record), record (as encode makes it), when 1
//
// Files of format 2 (see formatVersion) have frames without a sequence number:
// a 16-byte header (generation, length, CRC-32C of the secret, the first 12
// bytes and the payload). Open reads such a log as format 2 did, up to the
// first frame that is not whole, and moves the store to format 3 at once
// (a checkpoint), so that such frames are read only once.

// Defaults of the log.
const (
	// defaultLogLimit is the size of the log beyond which the writer makes
	// a checkpoint.
	defaultLogLimit = 16 << 20
	// logGrowth is how much a log file is extended with zeros at a time.
	logGrowth = 4 << 20
	// frameHeader is the size of a frame's header, legacyFrameHeader that
	// of a frame of format 2.
	frameHeader       = 28
	legacyFrameHeader = 16
	// scanChunk is how much of a file the search for frames' headers reads
	// at a time.
	scanChunk = 1 << 20
)

var (
	metaLog       = []byte("log")       // 8 bytes big-endian: the log's generation
	metaLogSeq    = []byte("logseq")    // 8 bytes big-endian: the sequence number of its first frame
	metaLogSecret = []byte("logsecret") // 8 random bytes: the key of the headers' checksums
	crcTable      = crc32.MakeTable(crc32.Castagnoli)
	errLogFull    = errors.New("boltstore: log frame too large")
)

// logFile is one of the two log files.
type logFile struct {
	f    *os.File
	size int64 // bytes of the file written (zeros or frames)
}

// wal is the log, owned by the writer goroutine.
type wal struct {
	files  [2]logFile
	gen    uint64 // generation of the frames written now, into files[gen%2]
	seq    uint64 // sequence number of the next frame
	first  uint64 // sequence number of generation gen's first frame
	at     int64  // where the next frame goes
	limit  int64  // checkpoint once at reaches it
	buf    []byte // the frame being built
	zeros  []byte
	secret []byte
	legacy bool                 // the frames read are of format 2
	sync   func(*os.File) error // fsync.Data; tests replace it
	broken error                // a sync failed: nothing more is written
	frames atomic.Int64         // frames written, for tests
}

// logEntry is one record of a frame: val is an encoded record, or nil for
// a deletion.
type logEntry struct {
	key string
	val []byte
}

// logPaths are the names of the two log files of the store at path.
func logPaths(path string) [2]string { return [2]string{path + ".log.0", path + ".log.1"} }

// logStart is where the log the bbolt file lacks starts, as the file says.
type logStart struct {
	gen    uint64 // generation (meta log)
	seq    uint64 // sequence number of its first frame (meta logseq)
	secret []byte
	legacy bool // the file is of format 2: frames without sequence numbers
}

// logRead is what openLog read: the entries of the frames the bbolt file
// lacks, in the order they were written, how many frames held them, and
// the last fence they carry; and, when openLog salvages, the damage it read
// past.
type logRead struct {
	entries   []logEntry
	frames    int
	lastFence int64
	damage    []LogDamage
}

// openLog opens (creating them if needed) the log files of the store at
// path, whose file says the log starts at st, and reads the frames of
// generations st.gen and st.gen+1. The log goes on with generation
// st.gen+1, after its frames. created reports whether a file was created.
// With salvage, frames are read past damage, which is reported in
// r.damage instead of failing; with trustEnd (tests only: the negative
// control), a file's frames end at the first that is not whole, as before
// the frames were numbered.
func openLog(path string, st logStart, limit int64, salvage, trustEnd bool) (w *wal, r logRead, created bool, err error) {
	w = &wal{gen: st.gen + 1, seq: st.seq, limit: limit, secret: st.secret, legacy: st.legacy, sync: fsync.Data}
	for i, name := range logPaths(path) {
		l, made, err := openLogFile(name)
		if err != nil {
			w.close()
			return nil, logRead{}, false, err
		}
		w.files[i], created = l, created || made
	}
	if err := w.readLog(st.gen, &r, salvage, trustEnd); err != nil {
		w.close()
		return nil, logRead{}, false, err
	}
	w.legacy = false // the log goes on in frames of formatVersion
	return w, r, created, nil
}

// openLogFile opens the log file name, creating it if needed (created).
func openLogFile(name string) (l logFile, created bool, err error) {
	f, err := os.OpenFile(name, os.O_RDWR, 0)
	if created = errors.Is(err, os.ErrNotExist); created {
		f, err = os.OpenFile(name, os.O_RDWR|os.O_CREATE, 0o600)
	}
	if err != nil {
		return logFile{}, false, err
	}
	st, err := f.Stat()
	if err != nil {
		f.Close()
		return logFile{}, false, err
	}
	return logFile{f: f, size: st.Size()}, created, nil
}

// frameHead is a frame's header.
type frameHead struct {
	gen, seq uint64
	n        int64  // length of the payload
	sum      uint32 // CRC-32C of the payload (format 2: of the secret, the header and the payload)
}

// headerSum is the checksum of a frame's header: of the secret and its
// first 24 bytes.
func (w *wal) headerSum(head []byte) uint32 {
	return crc32.Update(crc32.Checksum(w.secret, crcTable), crcTable, head[:24])
}

// parseHead decodes the header b of a frame (frameHeader bytes, or
// legacyFrameHeader of format 2); ok is false when its checksum is wrong
// (format 2 has none: ok is always true).
func (w *wal) parseHead(b []byte) (h frameHead, ok bool) {
	h.gen = binary.BigEndian.Uint64(b)
	if w.legacy {
		h.n, h.sum = int64(binary.BigEndian.Uint32(b[8:])), binary.BigEndian.Uint32(b[12:])
		return h, true
	}
	h.seq = binary.BigEndian.Uint64(b[8:])
	h.n, h.sum = int64(binary.BigEndian.Uint32(b[16:])), binary.BigEndian.Uint32(b[20:])
	return h, w.headerSum(b) == binary.BigEndian.Uint32(b[24:])
}

// headerSize is the size of the headers of the frames read.
func (w *wal) headerSize() int64 {
	if w.legacy {
		return legacyFrameHeader
	}
	return frameHeader
}

// frame reads the frame at offset at of l, of generation gen and numbered
// seq, and returns its header and payload; whole is false (and err nil)
// when there is no such frame there whole.
func (w *wal) frame(l logFile, at int64, gen, seq uint64) (h frameHead, payload []byte, whole bool, err error) {
	hs := w.headerSize()
	if at+hs > l.size {
		return h, nil, false, nil
	}
	var buf [frameHeader]byte
	head := buf[:hs]
	if _, err := l.f.ReadAt(head, at); err != nil {
		return h, nil, false, fmt.Errorf("read log: %w", err)
	}
	h, ok := w.parseHead(head)
	if !ok || h.gen != gen || (!w.legacy && h.seq != seq) || h.n < 8 || at+hs+h.n > l.size {
		return h, nil, false, nil
	}
	payload = make([]byte, h.n)
	if _, err := l.f.ReadAt(payload, at+hs); err != nil {
		return h, nil, false, fmt.Errorf("read log: %w", err)
	}
	sum := crc32.Checksum(payload, crcTable)
	if w.legacy {
		sum = crc32.Update(crc32.Update(crc32.Checksum(w.secret, crcTable), crcTable, head[:12]), crcTable, payload)
	}
	return h, payload, sum == h.sum, nil
}

// readLog reads the frames of generations gen and gen+1, numbered from
// w.seq on, into r, and leaves the log after generation gen+1's frames,
// with w.seq the number of the next. Where a file's frames end, the rest of
// the file is searched for the header of a later frame of the generation
// (findHeader): finding one means damage, which is returned as a
// *CorruptLogError or, with salvage, added to r.damage, and the frames are
// read on from that header.
func (w *wal) readLog(gen uint64, r *logRead, salvage, trustEnd bool) error {
	var prevPath string // gen's file, and where its frames end
	var prevEnd int64
	for _, g := range []uint64{gen, gen + 1} {
		l := w.files[g%2]
		w.first = w.seq
		if g == 0 { // no writer writes generation 0
			continue
		}
		at := int64(0)
		for {
			end, err := w.readFrames(l, g, at, r, salvage)
			if err != nil {
				return err
			}
			w.at = end
			if w.legacy || trustEnd {
				break
			}
			p, h, found, err := w.findHeader(l, g, end)
			if err != nil {
				return err
			}
			if !found {
				break
			}
			d := LogDamage{Path: l.f.Name(), Offset: end, Next: p, Frames: h.seq - w.seq}
			if g == gen+1 && at == 0 && p == 0 && h.seq > w.seq && prevPath != "" {
				// This file's first frame is not the one after the last of
				// gen's: the frames between were at the end of gen's file.
				d.Path, d.Offset, d.Next = prevPath, prevEnd, -1
			}
			if !salvage {
				return &CorruptLogError{LogDamage: d}
			}
			r.damage = append(r.damage, d)
			at, w.seq = p, h.seq
		}
		prevPath, prevEnd = l.f.Name(), w.at
	}
	return nil
}

// readFrames reads the whole frames of generation gen from offset at of l,
// numbered from w.seq on, into r, and returns where they end. A whole frame
// whose payload cannot be read was not torn by a crash: it is an error
// wrapping ErrCorrupt, or with salvage, damage of one frame, skipped.
func (w *wal) readFrames(l logFile, gen uint64, at int64, r *logRead, salvage bool) (end int64, err error) {
	for {
		h, payload, whole, err := w.frame(l, at, gen, w.seq)
		if err != nil || !whole {
			return at, err
		}
		fence, es, err := decodeFrame(payload)
		next := at + w.headerSize() + h.n
		if err != nil {
			// A frame whose checksums hold was written whole by this
			// package: a payload it cannot read is not a torn write.
			d := LogDamage{Path: l.f.Name(), Offset: at, Next: next, Frames: 1, Reason: fmt.Sprintf("frame %d cannot be read: %v", w.seq, err)}
			if !salvage {
				return 0, &CorruptLogError{LogDamage: d}
			}
			r.damage = append(r.damage, d)
		} else {
			r.entries = append(r.entries, es...)
			r.frames++
			r.lastFence = fence
		}
		at = next
		w.seq++
	}
}

// findHeader looks in l, from offset from on, for the header of a frame
// of generation gen numbered w.seq or later, other than the header of
// frame w.seq at from (the last frame, torn), and returns the first one's
// offset. Such a header was written after the frame numbered w.seq (or
// instead of it) was synced.
func (w *wal) findHeader(l logFile, gen uint64, from int64) (at int64, h frameHead, found bool, err error) {
	var pattern [8]byte
	binary.BigEndian.PutUint64(pattern[:], gen)
	buf := make([]byte, max(min(scanChunk+frameHeader-1, l.size-from), 0))
	for base := from; base+frameHeader <= l.size; base += scanChunk {
		n := min(int64(len(buf)), l.size-base)
		if _, err := l.f.ReadAt(buf[:n], base); err != nil && !errors.Is(err, io.EOF) {
			return 0, h, false, fmt.Errorf("read log: %w", err)
		}
		b := buf[:n]
		for i := 0; i <= len(b)-frameHeader && i < scanChunk; {
			j := bytes.Index(b[i:], pattern[:])
			if j < 0 || i+j > len(b)-frameHeader || i+j >= scanChunk {
				break
			}
			i += j
			if h, ok := w.parseHead(b[i : i+frameHeader]); ok && h.gen == gen && h.seq >= w.seq && (h.seq > w.seq || base+int64(i) > from) {
				return base + int64(i), h, true, nil
			}
			i++
		}
	}
	return 0, h, false, nil
}

func decodeFrame(p []byte) (int64, []logEntry, error) {
	fence := int64(binary.BigEndian.Uint64(p))
	p = p[8:]
	var es []logEntry
	for len(p) > 0 {
		k, rest, ok := cutBytes(p)
		if !ok || len(rest) == 0 {
			return 0, nil, errors.New("truncated entry")
		}
		e := logEntry{key: string(k)}
		switch rest[0] {
		case 0:
			p = rest[1:]
		case 1:
			v, rest2, ok := cutBytes(rest[1:])
			if !ok {
				return 0, nil, errors.New("truncated record")
			}
			e.val, p = v, rest2
		default:
			return 0, nil, fmt.Errorf("entry kind %d", rest[0])
		}
		es = append(es, e)
	}
	return fence, es, nil
}

// cutBytes splits a uvarint-prefixed byte string off p.
func cutBytes(p []byte) (b, rest []byte, ok bool) {
	n, k := binary.Uvarint(p)
	if k <= 0 || n > uint64(len(p)-k) {
		return nil, nil, false
	}
	return p[k : k+int(n)], p[k+int(n):], true
}

// appendPayload appends the payload of a frame holding entries and
// lastFence to b.
func appendPayload(b []byte, entries []logEntry, lastFence int64) []byte {
	b = binary.BigEndian.AppendUint64(b, uint64(lastFence))
	for _, e := range entries {
		b = binary.AppendUvarint(b, uint64(len(e.key)))
		b = append(b, e.key...)
		if e.val == nil {
			b = append(b, 0)
			continue
		}
		b = append(b, 1)
		b = binary.AppendUvarint(b, uint64(len(e.val)))
		b = append(b, e.val...)
	}
	return b
}

// appendFrame writes one frame holding entries and lastFence at the end of
// the log and fdatasyncs it. An error growing the file or writing the frame
// (a full disk, a file size limit) leaves the log as it was, and the next
// call tries again; an error syncing it breaks the log for good (what a
// failed sync left on disk is unknown: the kernel may have dropped the
// pages and a second sync would succeed), and every later call returns it.
func (w *wal) appendFrame(entries []logEntry, lastFence int64) error {
	if w.broken != nil {
		return w.broken
	}
	b := appendPayload(append(w.buf[:0], make([]byte, frameHeader)...), entries, lastFence)
	n := len(b) - frameHeader
	if int64(n) > 1<<31 {
		return errLogFull
	}
	binary.BigEndian.PutUint64(b[0:], w.gen)
	binary.BigEndian.PutUint64(b[8:], w.seq)
	binary.BigEndian.PutUint32(b[16:], uint32(n))
	binary.BigEndian.PutUint32(b[20:], crc32.Checksum(b[frameHeader:], crcTable))
	binary.BigEndian.PutUint32(b[24:], w.headerSum(b))
	w.buf = b
	l := &w.files[w.gen%2]
	end := w.at + int64(len(b))
	if end > l.size {
		// Extend the file with zeros first, so that the syncs of the
		// next frames flush no file size. This frame's sync flushes it.
		grow := max(end, l.size+logGrowth) - l.size
		if w.zeros == nil {
			w.zeros = make([]byte, 1<<20)
		}
		for off := int64(0); off < grow; off += int64(len(w.zeros)) {
			if _, err := l.f.WriteAt(w.zeros[:min(int64(len(w.zeros)), grow-off)], l.size+off); err != nil {
				return fmt.Errorf("boltstore: grow log: %w", err)
			}
		}
		l.size += grow
	}
	if _, err := l.f.WriteAt(b, w.at); err != nil {
		// Nothing is acknowledged and the next frame, with the same
		// number, goes to the same place: what this one left there is
		// not read (a frame that follows starts inside it, where no
		// header of its generation holds a checksum).
		return fmt.Errorf("boltstore: write log: %w", err)
	}
	if err := w.sync(l.f); err != nil {
		w.broken = fmt.Errorf("boltstore: sync log: %w", err)
		return w.broken
	}
	w.at = end
	w.seq++
	w.frames.Add(1)
	if cap(w.buf) > 1<<20 {
		w.buf = nil // do not keep a large group's buffer
	}
	return nil
}

// full reports whether the log reached its limit.
func (w *wal) full() bool { return w.at >= w.limit }

// next moves the log to the next generation, in the other file, from its
// start. The caller has made sure that the other file's frames are in the
// bbolt file.
func (w *wal) next() {
	w.gen, w.at, w.first = w.gen+1, 0, w.seq
}

// size is the size of the log files.
func (w *wal) size() int64 {
	var n int64
	for _, l := range w.files {
		if st, err := l.f.Stat(); err == nil {
			n += st.Size()
		}
	}
	return n
}

func (w *wal) close() error {
	var errs []error
	for _, l := range w.files {
		if l.f != nil {
			errs = append(errs, l.f.Close())
		}
	}
	return errors.Join(errs...)
}
