package boltstore

import (
	"errors"
	"fmt"
	"io/fs"
	"runtime/debug"
	"time"

	bolt "go.etcd.io/bbolt"
	bolterrors "go.etcd.io/bbolt/errors"
)

// verify walks every page of the existing file at path that a read can
// reach, read-only, and returns an error wrapping ErrCorrupt if one is
// damaged (the file was truncated, or pages were overwritten).
//
// It runs before the file is opened for writing because bbolt, opening a
// file whose free list it rebuilds (NoFreelistSync), walks the pages in a
// goroutine of its own and panics there on a damaged page: nothing can
// recover that panic, and the process would die with a stack trace. A
// read-only open does not rebuild the free list, and here the walk runs on
// the caller's goroutine, where a bbolt assertion or a fault on the mapped
// file is turned into an error. The walk touches the pages of the B+trees,
// not the values, so it costs about what the free list rebuild costs.
func verify(path string, lockTimeout time.Duration) error {
	db, err := bolt.Open(path, 0o600, &bolt.Options{ReadOnly: true, Timeout: lockTimeout})
	if errors.Is(err, bolterrors.ErrTimeout) {
		return fmt.Errorf("%w: %s is open in another process or Store (waited %v for its lock)", ErrLocked, path, lockTimeout)
	}
	var pathErr *fs.PathError
	if err != nil && !errors.As(err, &pathErr) {
		// Invalid meta pages, a bad checksum, a file shorter than its
		// header: bbolt's own checks on open.
		return fmt.Errorf("%w: %s: %v", ErrCorrupt, path, err)
	}
	if err != nil {
		return fmt.Errorf("boltstore: open %s: %w", path, err)
	}
	defer db.Close()
	if err := walkPages(db); err != nil {
		return fmt.Errorf("%w: %s: %v", ErrCorrupt, path, err)
	}
	return nil
}

// walkPages reads every bucket and key of db, turning a panic (bbolt's
// page assertions) or a memory fault (a page beyond the end of a truncated
// file) into an error.
func walkPages(db *bolt.DB) (err error) {
	defer debug.SetPanicOnFault(debug.SetPanicOnFault(true))
	defer func() {
		if r := recover(); r != nil {
			err = fmt.Errorf("damaged page: %v", r)
		}
	}()
	return db.View(func(tx *bolt.Tx) error {
		return tx.ForEach(func(_ []byte, b *bolt.Bucket) error { return walkBucket(b) })
	})
}

func walkBucket(b *bolt.Bucket) error {
	return b.ForEach(func(k, v []byte) error {
		if v == nil {
			if child := b.Bucket(k); child != nil {
				return walkBucket(child)
			}
		}
		return nil
	})
}

// openRecovering is bolt.Open with a panic on the caller's goroutine
// (bbolt reports some inconsistencies it finds while rebuilding the free
// list that way) turned into an error wrapping ErrCorrupt.
func openRecovering(path string, o *bolt.Options) (db *bolt.DB, err error) {
	defer func() {
		if r := recover(); r != nil {
			db, err = nil, fmt.Errorf("%w: %s: %v", ErrCorrupt, path, r)
		}
	}()
	return bolt.Open(path, 0o600, o)
}
