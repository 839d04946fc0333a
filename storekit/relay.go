package storekit

import (
	"context"
	"time"
)

// This file holds the store-writer side of transactional completion
// (docs/design.md#the-commit-gate): the commit gate (module
// github.com/idemgo/idem/postgres) commits a completion row in the caller's
// own database transaction, and then writes the same completion into the
// store with a Relayer. Users of Do and Begin do not need it.

// Completion is a completion committed outside the store (the commit gate's
// completion row), for Relayer.RelayCompletion.
type Completion struct {
	// Fingerprint is the fingerprint of the request that committed.
	Fingerprint string
	// Fence is the fence of the attempt that committed.
	Fence int64
	// Result is the stored result blob, as the Executor encodes it
	// (adapterkit.EncodeResult).
	Result []byte
	// Retention is how long the record is kept from now on.
	Retention time.Duration
}

// Validate reports whether c may be passed to Relayer.RelayCompletion.
func (c Completion) Validate() error {
	if len(c.Fingerprint) > MaxFingerprintLen {
		return invalidf("fingerprint is %d bytes, over the limit of %d", len(c.Fingerprint), MaxFingerprintLen)
	}
	if c.Fence <= 0 {
		return invalidf("fence %d is not positive", c.Fence)
	}
	if len(c.Result) == 0 {
		return invalidf("empty result")
	}
	return ValidateDuration("retention", c.Retention)
}

// Relayer is implemented by stores that can record a completion that
// committed elsewhere (redisstore, memstore, boltstore and pgstore do). The
// commit gate needs it; find it with StoreAs, which looks through wrappers.
type Relayer interface {
	// RelayCompletion moves key's record to COMPLETED with c's result,
	// whatever its state and owner: an absent record is created, an
	// IN_PROGRESS one (whoever owns it), a RELEASED or a FAILED one is
	// overwritten. A COMPLETED record is never changed (its result is kept):
	// the first completion stays. The record keeps the highest of its fence
	// and c.Fence, its attempts (1 for a new record) and takes
	// c.Fingerprint. A later Complete, Fail, Extend or Release of the
	// displaced owner returns ErrLeaseLost. Waiters are woken as by
	// Complete.
	//
	// It may be repeated: a repeated call finds the record COMPLETED and
	// succeeds. Errors follow the Store contract (ErrInvalid for bad input,
	// other errors leave the outcome unknown).
	RelayCompletion(ctx context.Context, key string, c Completion) error
}

// Unwrapper is implemented by stores that decorate another store (tracing,
// metrics). StoreAs follows Unwrap to find the optional capabilities of
// the store underneath (Relayer, Watcher, BatchStore), so that a wrapper
// does not hide them.
type Unwrapper interface {
	// Unwrap returns the wrapped store.
	Unwrap() Store
}

// StoreAs returns s as a T (an optional capability such as Relayer) if s
// or a store it wraps (see Unwrapper) implements T. A wrapper that
// implements T itself is used before the store it wraps.
func StoreAs[T any](s Store) (T, bool) {
	for range 16 { // a bound against a wrapper that unwraps to itself
		if t, ok := s.(T); ok {
			return t, true
		}
		u, ok := s.(Unwrapper)
		if !ok {
			break
		}
		s = u.Unwrap()
		if s == nil {
			break
		}
	}
	var zero T
	return zero, false
}
