package storekit

import (
	"context"
	"time"
)

// Effect is work on data that lives in the store's own server (a counter,
// a hash, a stream entry) that the store applies in the same atomic call as
// the completion of an attempt: after it checked that the attempt still
// owns the record and before it writes COMPLETED. So the effect happens
// exactly once per key, with the completion and never without it: a stale
// owner's effect is never applied, and a completion repeated after a lost
// reply does not apply it twice.
//
// What Name, Keys and Args mean is the store's: redisstore runs the Lua
// body registered under Name (redisstore.WithEffect) with Keys as its KEYS
// and Args as its ARGV. An operation attaches an effect to its attempt with
// idem.SetEffect.
type Effect struct {
	// Name is the name under which the effect was registered with the
	// store.
	Name string
	// Keys are the keys the effect touches. On a Redis Cluster they must
	// share the record's hash tag (see redisstore.Store.EffectKey).
	Keys []string
	// Args are the effect's arguments.
	Args []string

	// partial is the result a store writes, with the FAILED state, when
	// the effect fails after it may have written (see PartialResult). The
	// Executor sets it when it completes the attempt.
	partial []byte
}

// PartialResult returns the result, encoded as the Executor stores
// results, that an EffectStore writes with the FAILED state when e fails
// after it may have written (ErrEffectPartial): a description of that
// failure, which later calls with the key get as a *FailedError. The
// Executor sets it on the attempt's effect when it completes the attempt;
// it is empty on an Effect made by other code. It is part of the
// store-writer API.
func (e Effect) PartialResult() []byte { return e.partial }

// WithPartialResult returns e with the result that PartialResult returns.
// The Executor calls it when it completes an attempt that carries e; a
// store never needs it.
func (e Effect) WithPartialResult(result []byte) Effect {
	e.partial = result
	return e
}

// EffectStore is implemented by stores that apply an Effect atomically with
// a completion (redisstore, with effects registered when the store is
// built). The Executor calls CompleteEffect instead of Complete for an
// attempt that carries an effect (SetEffect).
//
// This is part of the store-writer API, like Store: applications use
// SetEffect.
type EffectStore interface {
	Store
	// CheckEffect reports, without I/O, whether the store can apply e with
	// the completion of the record key: e names a registered effect and its
	// keys are allowed. Errors wrap ErrInvalid.
	CheckEffect(key string, e Effect) error
	// CompleteEffect does what Complete does and, in the same atomic call,
	// applies e after the owner and fence check and before the COMPLETED
	// write. A stale owner gets ErrLeaseLost and e is not applied. Repeating
	// a call that succeeded (same lease and result) succeeds again without
	// applying e again. When e itself fails, CompleteEffect returns an
	// *EffectError and writes no COMPLETED record. Whatever e wrote before
	// it failed stays, so the store tells the two cases apart: when e
	// failed before its first write, the record stays IN_PROGRESS and the
	// error wraps ErrEffect only; when e may have written, the same atomic
	// call ends the record FAILED with e.PartialResult() and the error
	// wraps ErrEffectPartial, so that no retry applies e's first writes
	// again. A call repeated after such a failure (same lease) answers
	// ErrEffectPartial again.
	CompleteEffect(ctx context.Context, key string, lease Lease, result []byte, retention time.Duration, e Effect) error
}

// EffectError is returned by EffectStore.CompleteEffect (and so by Do and
// Commit) when the effect itself failed: it raised an error or returned one.
// The completion was not written.
//
// When the effect failed before its first write (Partial is false; the
// error wraps ErrEffect), nothing was applied: Do and Commit end the
// attempt as if the operation had returned this error, and the failure
// policy decides whether the key is released (the default: the next call
// runs the operation again) or becomes FAILED, as it does on the attempt's
// last try (SetLastTry) whatever the policy.
//
// When it failed after it may have written (Partial is true; the error
// wraps ErrEffectPartial, and so ErrEffect), its first writes stand, since
// Redis does not undo a script: the store ended the key FAILED in the same
// call, so no retry runs the operation and the effect again, and later
// calls with the key get a *FailedError that says the effect may have
// partly applied. Whatever the effect wrote needs looking at.
//
// Either way, when the key is FAILED the error Do and Commit return is
// marked with Terminal (IsTerminal reports true), and a broker consumer
// dead-letters the message with it.
type EffectError struct {
	// Name is the effect's name.
	Name string
	// Message is the error the effect raised.
	Message string
	// Partial reports that the effect failed after it may have written.
	Partial bool
}

func (e *EffectError) Error() string {
	if e.Partial {
		return "idem: effect " + e.Name + " failed after it wrote (it may have partly applied): " + e.Message
	}
	return "idem: effect " + e.Name + " failed: " + e.Message
}

// Unwrap returns ErrEffectPartial when the effect may have partly applied,
// ErrEffect otherwise.
func (e *EffectError) Unwrap() error {
	if e.Partial {
		return ErrEffectPartial
	}
	return ErrEffect
}
