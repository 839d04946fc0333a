package idem

import (
	"errors"
	"fmt"
	"time"

	"github.com/idemgo/idem/storekit"
)

// Sentinel errors. Test for them with errors.Is: stores and the Executor wrap
// them with context. ErrLeaseLost, ErrInvalid, ErrNotDurable, ErrEffect and
// ErrEffectPartial are the values of package storekit, which stores return.
var (
	// ErrLeaseLost is returned by Complete, Fail, Extend and Release (and by
	// Do and Attempt methods) when the caller is no longer the owner of the
	// record: another caller took the key over after the lease expired, the
	// record was deleted, or it already left IN_PROGRESS. The caller's work
	// may have to be compensated; its result was not stored.
	ErrLeaseLost = storekit.ErrLeaseLost

	// ErrInProgress is returned by Do and Begin when another caller holds
	// the key and its lease has not expired. The returned error is an
	// *InProgressError that carries the remaining lease.
	ErrInProgress = errors.New("idem: operation in progress")

	// ErrMismatch is returned by Do and Begin when the key exists with a
	// different fingerprint: the same idempotency key was reused for a
	// different request.
	ErrMismatch = errors.New("idem: idempotency key reused with a different fingerprint")

	// ErrFailed is returned by Do and Begin when the key is in the FAILED
	// state: a previous attempt failed terminally or the attempts were
	// exhausted. The returned error is a *FailedError.
	ErrFailed = errors.New("idem: operation failed")

	// ErrInvalid is wrapped by every error that reports bad input (an empty
	// or oversized key, a fingerprint that is too long, a non-positive
	// lease, a result over the size limit, ...). Such input never reaches a
	// store.
	ErrInvalid = storekit.ErrInvalid

	// ErrResultTooLarge is returned (wrapping ErrInvalid) when a result is
	// larger than the configured maximum stored size.
	ErrResultTooLarge = fmt.Errorf("%w: result too large", ErrInvalid)

	// ErrNotDurable is returned by stores configured with a durability
	// option (WAIT, WAITAOF) when the write was applied on the primary but
	// not acknowledged by as many replicas or AOF fsyncs as required. The
	// state transition happened; it may be lost on failover. Treat the
	// outcome as unknown: do not report the operation as durably done, and
	// retry the same key later (it replays, or runs again if Redis lost
	// the write). A primary cut off from its replicas answers every call
	// with it, where without WAIT it would acknowledge writes that the
	// failover then loses (RELIABILITY.md, Sentinel partition).
	ErrNotDurable = storekit.ErrNotDurable

	// ErrEffect is wrapped by the *storekit.EffectError a store returns when an
	// attempt's effect failed (see storekit.EffectStore): the record was not
	// completed.
	ErrEffect = storekit.ErrEffect

	// ErrEffectPartial is wrapped by the *storekit.EffectError a store returns when
	// an attempt's effect failed after it may have written (it wraps
	// ErrEffect): Redis does not undo what the effect wrote before it
	// failed, so the store ended the key FAILED in the same call, and no
	// retry applies the effect again. Do and Commit return it marked with
	// Terminal; a broker consumer dead-letters the message with it. What
	// the effect wrote needs looking at.
	ErrEffectPartial = storekit.ErrEffectPartial

	// ErrCorruptResult is returned when a stored result cannot be decoded:
	// it was written by an incompatible version, sealed with another key, or
	// altered.
	ErrCorruptResult = errors.New("idem: stored result cannot be decoded")
)

// InProgressError is returned when another caller holds the key.
type InProgressError struct {
	// RetryAfter is the time left on the current owner's lease, as measured
	// by the store's clock.
	RetryAfter time.Duration
}

func (e *InProgressError) Error() string {
	return fmt.Sprintf("idem: operation in progress, retry after %v", e.RetryAfter)
}

// Unwrap returns ErrInProgress.
func (e *InProgressError) Unwrap() error { return ErrInProgress }

// FailedError is returned when the key is in the FAILED state. Message is
// the stored description of the failure (for Do, the text of the terminal
// error); it is empty when the attempts ran out without a terminal error.
type FailedError struct {
	Message string
	// Replayed is true when the failure was stored by an earlier attempt and
	// is being replayed, false when this call's own attempt failed.
	Replayed bool
}

func (e *FailedError) Error() string {
	if e.Message == "" {
		return "idem: operation failed: attempts exhausted"
	}
	return "idem: operation failed: " + e.Message
}

// Unwrap returns ErrFailed.
func (e *FailedError) Unwrap() error { return ErrFailed }

// terminalError marks an error as terminal for the default failure policy.
type terminalError struct{ err error }

func (e *terminalError) Error() string { return e.err.Error() }
func (e *terminalError) Unwrap() error { return e.err }

// Terminal marks err as a terminal failure: under the default failure policy
// the key becomes FAILED, the error text is stored, and later calls with the
// same key get a *FailedError instead of running again. Terminal(nil) is nil.
func Terminal(err error) error {
	if err == nil {
		return nil
	}
	return &terminalError{err: err}
}

// IsTerminal reports whether err (or an error it wraps) was marked with
// Terminal. It is the default FailurePolicy.
func IsTerminal(err error) bool {
	var t *terminalError
	return errors.As(err, &t)
}

func invalidf(format string, args ...any) error {
	return fmt.Errorf("%w: "+format, append([]any{ErrInvalid}, args...)...)
}

// errAttemptEnded is returned by the methods of an Attempt that already
// ended.
var errAttemptEnded = fmt.Errorf("%w: attempt already ended", ErrLeaseLost)
