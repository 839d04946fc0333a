package boltstore

import (
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
// its file while the frames' generation is right and their checksum holds.
// Frames of older generations, and a frame torn by a crash while it was
// written (never acknowledged), end a file's frames. Frames are written over
// a region of the file written before (zeros first, then older frames), so
// that a sync flushes data blocks and no file size; the region grows by
// logGrowth at a time.
//
// A frame:
//
//	uint64  generation
//	uint32  length of the payload
//	uint32  CRC-32C of the log's secret, the generation, the length and
//	        the payload
//	payload:
//	  uint64   the last fence issued once the group is applied
//	  entries, each:
//	    uvarint  len(key), key
//	    byte     1: the record below replaces key's; 0: key's record is deleted
//	    uvarint  len(record), record (as encode makes it), when 1

// Defaults of the log.
const (
	// defaultLogLimit is the size of the log beyond which the writer makes
	// a checkpoint.
	defaultLogLimit = 16 << 20
	// logGrowth is how much a log file is extended with zeros at a time.
	logGrowth = 4 << 20
	// frameHeader is the size of a frame's header.
	frameHeader = 16
)

var (
	metaLog       = []byte("log")       // 8 bytes big-endian: the log's generation
	metaLogSecret = []byte("logsecret") // 8 random bytes: the checksums' start
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
	at     int64  // where the next frame goes
	limit  int64  // checkpoint once at reaches it
	buf    []byte // the frame being built
	zeros  []byte
	secret []byte
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

// openLog opens (creating them if needed) the log files of the store at
// path, whose file says generation gen, and reads the frames of
// generations gen and gen+1. The log goes on with generation gen+1, after
// its frames. created reports whether a file was created.
func openLog(path string, gen uint64, secret []byte, limit int64) (w *wal, entries []logEntry, lastFence int64, created bool, err error) {
	w = &wal{gen: gen + 1, limit: limit, secret: secret, sync: fsync.Data}
	for i, name := range logPaths(path) {
		l, made, err := openLogFile(name)
		if err != nil {
			w.close()
			return nil, nil, 0, false, err
		}
		w.files[i], created = l, created || made
	}
	for _, g := range []uint64{gen, gen + 1} {
		es, fence, end, err := w.read(g)
		if err != nil {
			w.close()
			return nil, nil, 0, false, err
		}
		entries = append(entries, es...)
		if end > 0 {
			lastFence = fence
		}
		w.at = end
	}
	return w, entries, lastFence, created, nil
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

// checksum is the checksum of a frame's header (its first 12 bytes) and
// payload.
func (w *wal) checksum(head, payload []byte) uint32 {
	c := crc32.Update(crc32.Checksum(w.secret, crcTable), crcTable, head[:12])
	return crc32.Update(c, crcTable, payload)
}

// read returns the entries of the frames of generation gen from the start
// of its file, in the order they were written, the last fence the last of
// them carries, and where they end.
func (w *wal) read(gen uint64) (entries []logEntry, lastFence, at int64, err error) {
	l := w.files[gen%2]
	var head [frameHeader]byte
	for {
		if _, err := l.f.ReadAt(head[:], at); err != nil {
			if errors.Is(err, io.EOF) {
				return entries, lastFence, at, nil
			}
			return nil, 0, 0, fmt.Errorf("read log: %w", err)
		}
		g := binary.BigEndian.Uint64(head[0:])
		n := int64(binary.BigEndian.Uint32(head[8:]))
		if g != gen || n < 8 || at+frameHeader+n > l.size {
			return entries, lastFence, at, nil
		}
		payload := make([]byte, n)
		if _, err := l.f.ReadAt(payload, at+frameHeader); err != nil {
			return nil, 0, 0, fmt.Errorf("read log: %w", err)
		}
		if w.checksum(head[:], payload) != binary.BigEndian.Uint32(head[12:]) {
			return entries, lastFence, at, nil // torn by a crash: never acknowledged
		}
		fence, es, err := decodeFrame(payload)
		if err != nil {
			// A frame whose checksum holds was written whole by this
			// package: a payload it cannot read is not a torn write.
			return nil, 0, 0, fmt.Errorf("%w: log frame at %d of %s: %v", ErrCorrupt, at, l.f.Name(), err)
		}
		entries = append(entries, es...)
		lastFence = fence
		at += frameHeader + n
	}
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
	b := append(w.buf[:0], make([]byte, frameHeader)...)
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
	n := len(b) - frameHeader
	if int64(n) > 1<<31 {
		return errLogFull
	}
	binary.BigEndian.PutUint64(b[0:], w.gen)
	binary.BigEndian.PutUint32(b[8:], uint32(n))
	binary.BigEndian.PutUint32(b[12:], w.checksum(b, b[frameHeader:]))
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
		// Nothing is acknowledged and the next frame goes to the same
		// place: what this one left there is not read (a frame that
		// follows starts inside it, where no frame of its generation
		// holds a checksum).
		return fmt.Errorf("boltstore: write log: %w", err)
	}
	if err := w.sync(l.f); err != nil {
		w.broken = fmt.Errorf("boltstore: sync log: %w", err)
		return w.broken
	}
	w.at = end
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
	w.gen, w.at = w.gen+1, 0
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
