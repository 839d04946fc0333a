package boltstore

import "errors"

// Sentinel errors of the package; test for them with errors.Is. The errors
// of the idem.Store methods are idem's (idem.ErrLeaseLost, idem.ErrNotFound,
// idem.ErrInvalid), wrapped.
var (
	// ErrClosed is returned by the methods of a Store after Close.
	ErrClosed = errors.New("boltstore: store is closed")

	// ErrLocked is wrapped by the error Open returns when another process,
	// or another Store of this process, has the file open.
	ErrLocked = errors.New("boltstore: database file is in use")

	// ErrCorrupt is wrapped by the errors returned when a record or the
	// store's metadata on disk cannot be decoded: the file was written by
	// another program or an incompatible version of this package, or it was
	// altered.
	ErrCorrupt = errors.New("boltstore: corrupt data")
)
