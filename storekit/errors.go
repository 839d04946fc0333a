package storekit

import (
	"errors"
	"fmt"
)

// Sentinel errors that stores return. Test for them with errors.Is: stores
// wrap them with context. The idem package exports the same values under
// the same names (idem.ErrLeaseLost is ErrLeaseLost), save ErrNotFound,
// which only Store.Get returns.
var (
	// ErrLeaseLost is returned by Complete, Fail, Extend and Release (and by
	// Do and Attempt methods) when the caller is no longer the owner of the
	// record: another caller took the key over after the lease expired, the
	// record was deleted, or it already left IN_PROGRESS. The caller's work
	// may have to be compensated; its result was not stored.
	ErrLeaseLost = errors.New("idem: lease lost")

	// ErrNotFound is returned by Store.Get when no record exists for the key.
	ErrNotFound = errors.New("idem: record not found")

	// ErrInvalid is wrapped by every error that reports bad input (an empty
	// or oversized key, a fingerprint that is too long, a non-positive
	// lease, a result over the size limit, ...). Such input never reaches a
	// store.
	ErrInvalid = errors.New("idem: invalid input")

	// ErrNotDurable is returned by stores configured with a durability
	// option (WAIT, WAITAOF) when the write was applied on the primary but
	// not acknowledged by as many replicas or AOF fsyncs as required. The
	// state transition happened; it may be lost on failover. Treat the
	// outcome as unknown: do not report the operation as durably done, and
	// retry the same key later (it replays, or runs again if Redis lost
	// the write). A primary cut off from its replicas answers every call
	// with it, where without WAIT it would acknowledge writes that the
	// failover then loses (RELIABILITY.md, Sentinel partition).
	ErrNotDurable = errors.New("idem: write not acknowledged by enough replicas")

	// ErrEffect is wrapped by the *EffectError a store returns when an
	// attempt's effect failed (see EffectStore): the record was not
	// completed.
	ErrEffect = errors.New("idem: effect failed")

	// ErrEffectPartial is wrapped by the *EffectError a store returns when
	// an attempt's effect failed after it may have written (it wraps
	// ErrEffect): Redis does not undo what the effect wrote before it
	// failed, so the store ended the key FAILED in the same call, and no
	// retry applies the effect again. Do and Commit return it marked with
	// Terminal; a broker consumer dead-letters the message with it. What
	// the effect wrote needs looking at.
	ErrEffectPartial = fmt.Errorf("%w after it may have partly applied", ErrEffect)
)

// OutcomeUnknown reports whether err, returned by a Store call, leaves the
// call's outcome unknown: the transition may or may not have happened (a
// timeout, a broken connection, a server error), and repeating the call
// with the same arguments resolves it (see Store). It is false for nil and
// for the errors that answer the call: ErrLeaseLost, ErrNotFound,
// ErrInvalid, ErrNotDurable and ErrEffect.
func OutcomeUnknown(err error) bool {
	return err != nil && !errors.Is(err, ErrLeaseLost) && !errors.Is(err, ErrNotFound) &&
		!errors.Is(err, ErrInvalid) && !errors.Is(err, ErrNotDurable) && !errors.Is(err, ErrEffect)
}

// invalidf returns an error wrapping ErrInvalid.
func invalidf(format string, args ...any) error {
	return fmt.Errorf("%w: "+format, append([]any{ErrInvalid}, args...)...)
}
