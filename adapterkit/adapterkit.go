package adapterkit

import (
	"time"

	"github.com/idemgo/idem"
	"github.com/idemgo/idem/internal/execseam"
)

// Defaults of the Executor's options, for programs that show them or
// configure other parts to match (the idem binary's flags).
const (
	DefaultLease         = execseam.DefaultLease         // idem.WithLease
	DefaultRetention     = execseam.DefaultRetention     // idem.WithRetention
	DefaultMaxResultSize = execseam.DefaultMaxResultSize // idem.WithMaxResultSize
)

var funcs = execseam.Get[*idem.Executor, idem.Key, *idem.Attempt]()

// Store returns e's store: the Store given to idem.New.
func Store(e *idem.Executor) idem.Store { return funcs.Store(e) }

// Lease returns e's lease (idem.WithLease).
func Lease(e *idem.Executor) time.Duration { return funcs.Lease(e) }

// Retention returns e's retention (idem.WithRetention).
func Retention(e *idem.Executor) time.Duration { return funcs.Retention(e) }

// MaxResultSize returns the largest result e stores
// (idem.WithMaxResultSize).
func MaxResultSize(e *idem.Executor) int { return funcs.MaxResultSize(e) }

// EncodeResult returns the stored form of value under the store key
// storeKey, as Commit would store it: compressed and sealed per e's
// options. It returns an error wrapping idem.ErrResultTooLarge when value
// is over the size limit. It is for completions written outside the store
// (the commit gate), read back with DecodeResult. It is safe for
// concurrent use.
func EncodeResult(e *idem.Executor, storeKey string, value []byte) ([]byte, error) {
	return funcs.EncodeResult(e, storeKey, value)
}

// DecodeResult returns the value held by blob, a stored result as
// Store.Get returns it in Record.Result for the store key storeKey. blob
// must have been written by an Executor with a compatible configuration:
// the same encryption key, and a maximum result size no larger than e's.
// It is for tools that inspect records (the idem binary's get command);
// Do and Begin decode replays themselves. The value may share memory with
// blob. Errors wrap idem.ErrCorruptResult. It is safe for concurrent use.
func DecodeResult(e *idem.Executor, storeKey string, blob []byte) ([]byte, error) {
	return funcs.DecodeResult(e, storeKey, blob)
}
