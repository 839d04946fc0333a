package boltstore

import (
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"time"
)

// Recovery is what Recover found in a store's log and did.
type Recovery struct {
	// Damage is the damage found, in the order of the log; empty when the
	// log had none (then Recover did what Open does).
	Damage []LogDamage
	// Lost is the number of frames (groups of acknowledged writes) missing:
	// the sum of Damage's Frames. Their records are lost; a record that a
	// later frame changed again has that later version.
	Lost uint64
	// Frames is the number of whole frames read, and Records the number of
	// records (and deletions) they held: all are applied to the file.
	Frames, Records int
	// Saved are the copies of the log files made before the repair, which
	// keep the damage for inspection: path.log.0 and path.log.1 with
	// ".damaged-" and the time (UTC) added.
	Saved []string
}

// Recover repairs the store at path whose log holds damage (Open returned a
// *CorruptLogError), so that it opens again with every record that can be
// read. It reads every whole frame of the log, past the damage; copies both
// log files aside (Recovery.Saved), so that nothing is lost of the
// evidence; then applies the records read to the file in one transaction
// and moves the log on to a new generation, as a checkpoint does, which
// leaves the damaged frames unread from then on. A crash at any point
// leaves either the store as it was (Recover can run again) or the
// repaired one.
//
// The records of the missing frames are lost: a key whose last change was
// in them reads as the frames before left it (in progress, say, instead of
// completed) or as absent, and a retried request with that key may run
// again. Recovery counts them.
//
// When the log holds no damage, Recover does what Open does and reports
// none. The file itself must be whole (Open's checks; ErrCorrupt
// otherwise) and exist, and the store must not be open (ErrLocked after
// WithLockTimeout). The options are Open's.
func Recover(path string, opts ...Option) (*Recovery, error) {
	c, err := newConfig(path, opts)
	if err != nil {
		return nil, err
	}
	if _, err := os.Stat(path); err != nil {
		return nil, fmt.Errorf("boltstore: %w", err)
	}
	rec := &Recovery{}
	s, err := open(path, c, rec)
	if err != nil {
		return nil, err
	}
	if err := errors.Join(s.log.close(), s.db.Close()); err != nil {
		return nil, fmt.Errorf("boltstore: close %s: %w", path, err)
	}
	return rec, nil
}

// saveLog copies the log files of the store at path to new files named
// with the time now, synced, and returns their names.
func saveLog(path string, now time.Time) ([]string, error) {
	var saved []string
	for _, name := range logPaths(path) {
		dst := name + ".damaged-" + now.UTC().Format("20060102T150405Z")
		if err := copyFile(dst, name); err != nil {
			return nil, fmt.Errorf("boltstore: keep a copy of the damaged log: %w", err)
		}
		saved = append(saved, dst)
	}
	if err := syncDir(filepath.Dir(path)); err != nil {
		return nil, fmt.Errorf("boltstore: %w", err)
	}
	return saved, nil
}

// copyFile copies src to dst, a file that must not exist, and syncs it.
func copyFile(dst, src string) error {
	in, err := os.Open(src)
	if err != nil {
		return err
	}
	defer in.Close()
	out, err := os.OpenFile(dst, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return err
	}
	if _, err := io.Copy(out, in); err != nil {
		out.Close()
		return err
	}
	if err := out.Sync(); err != nil {
		out.Close()
		return err
	}
	return out.Close()
}
