package boltstore

import (
	"errors"
	"fmt"
)

// Sentinel errors of the package; test for them with errors.Is. The errors
// of the storekit.Store methods are storekit's (storekit.ErrLeaseLost,
// storekit.ErrNotFound, storekit.ErrInvalid), wrapped.
var (
	// ErrClosed is returned by the methods of a Store after Close.
	ErrClosed = errors.New("boltstore: store is closed")

	// ErrLocked is wrapped by the error Open returns when another process,
	// or another Store of this process, has the file open.
	ErrLocked = errors.New("boltstore: database file is in use")

	// ErrCorrupt is wrapped by the errors returned when a record or the
	// store's metadata on disk cannot be decoded: the file was written by
	// another program or an incompatible version of this package, or it was
	// altered; and by the *CorruptLogError of Open when the log holds
	// damage that acknowledged writes follow.
	ErrCorrupt = errors.New("boltstore: corrupt data")
)

// LogDamage is damage found in the store's log: bytes where a frame (one
// group of acknowledged writes) should be and none is whole, while a later
// frame was written after it, so that the damage is not the end of the log
// that a crash tore.
type LogDamage struct {
	// Path is the log file.
	Path string
	// Offset is where the damage starts in Path: the first byte after the
	// last whole frame before it.
	Offset int64
	// Next is where whole frames resume in Path, or -1 when the frames
	// missing were the last of Path and the log goes on in the other file.
	Next int64
	// Frames is the number of frames (groups of writes) missing.
	Frames uint64
	// Reason says what is wrong when it is not that frames are missing
	// (a whole frame whose payload cannot be read).
	Reason string
}

// String describes the damage in one line, naming the file and the offset.
func (d LogDamage) String() string {
	where := fmt.Sprintf("log %s is damaged at byte %d", d.Path, d.Offset)
	switch {
	case d.Reason != "":
		return where + ": " + d.Reason
	case d.Next < 0:
		return fmt.Sprintf("%s: %d frames (groups of acknowledged writes) are missing from its end, before the frames of the other log file", where, d.Frames)
	}
	return fmt.Sprintf("%s: %d frames (groups of acknowledged writes) are missing before the frame at byte %d", where, d.Frames, d.Next)
}

// CorruptLogError is the error Open returns when the log holds damage:
// acknowledged writes would be lost if the frames after it were dropped,
// as a torn end of the log is. It wraps ErrCorrupt. Recover keeps every
// frame that is whole, past the damage, and reports what was lost.
type CorruptLogError struct {
	LogDamage
}

// Error describes the damage (LogDamage.String).
func (e *CorruptLogError) Error() string { return "boltstore: corrupt data: " + e.LogDamage.String() }

// Unwrap returns ErrCorrupt.
func (e *CorruptLogError) Unwrap() error { return ErrCorrupt }
