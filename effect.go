package idem

import (
	"context"
	"errors"
	"slices"

	"github.com/idemgo/idem/observe"
	"github.com/idemgo/idem/storekit"
)

// SetEffect attaches e to the attempt that runs with ctx (the context Do,
// Typed.Do and Begin give the operation, or one derived from it): when the
// operation succeeds, its completion applies e atomically with the
// COMPLETED record (see Effect). A second call replaces the effect; an
// operation that fails drops it (nothing is applied without a completion).
// SetEffect copies e's slices.
//
// It returns an error wrapping ErrInvalid outside an attempt, when the
// store applies no effects (it is not a storekit.EffectStore, nor a wrapper that
// unwraps to one: see storekit.StoreAs), or when the store
// refuses e (an unknown name, a key outside the record's hash tag), and an
// error wrapping ErrLeaseLost when the attempt already ended. It is safe
// for concurrent use.
func SetEffect(ctx context.Context, e Effect) error {
	c, ok := ctx.Value(leaseKey{}).(*leaseCtx)
	if !ok || c.a == nil {
		return invalidf("SetEffect outside an attempt")
	}
	a := c.a
	es, ok := storekit.StoreAs[storekit.EffectStore](a.e.store)
	if !ok {
		return invalidf("store %T applies no effects", a.e.store)
	}
	if err := es.CheckEffect(a.key, e); err != nil {
		return err
	}
	e.Keys, e.Args = slices.Clone(e.Keys), slices.Clone(e.Args)
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.finished {
		return errAttemptEnded
	}
	a.effect = &e
	return nil
}

// SetLastTry marks the attempt as the key's last try: the key becomes
// FAILED whatever the failure policy when the attempt ends with Fail, or
// when its completion is refused because its effect failed (ErrEffect),
// and then the error Commit (or adapterkit.CommitBatch) returns is marked with
// Terminal. A broker consumer calls it for a
// message that it dead-letters if it fails (the maximum of deliveries
// reached, or a last delivery), so that the dead-lettered message's key is
// FAILED, as after a handler's own error, rather than left RELEASED for a
// later copy to run again. Call it before the ending; it is safe for
// concurrent use.
func (a *Attempt) SetLastTry() {
	a.mu.Lock()
	a.lastTry = true
	a.mu.Unlock()
}

// hasEffect reports whether the operation attached an effect.
func (a *Attempt) hasEffect() bool {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.effect != nil
}

// setPartialResult sets, on the attempt's effect, the result that the
// store writes with the FAILED state if the effect fails after it may have
// written (Effect.PartialResult).
func (a *Attempt) setPartialResult() error {
	msg := (&storekit.EffectError{Name: a.effect.Name, Message: "its error is not stored", Partial: true}).Error()
	blob, err := a.e.codec.encode(a.key, []byte(msg))
	if err != nil {
		return err
	}
	*a.effect = a.effect.WithPartialResult(blob)
	return nil
}

// effectFailed ends an attempt whose completion was refused because its
// effect failed (err wraps ErrEffect). When the effect may have written
// (ErrEffectPartial), the store already ended the key FAILED in the
// completion's call. Otherwise nothing was written, so the operation
// failed after all, and the failure policy decides whether the key is
// released or FAILED.
func (a *Attempt) effectFailed(ctx context.Context, err error) error {
	if errors.Is(err, ErrEffectPartial) {
		err = Terminal(err)
		a.observeEnd(ctx, observe.Executed, nil, err)
		return err
	}
	a.mu.Lock()
	terminal := a.lastTry || a.e.policy(err)
	a.mu.Unlock()
	st, ferr := a.fail(ctx, err, terminal)
	if ferr != nil {
		err = errors.Join(err, ferr)
		a.observeEnd(ctx, observe.Executed, ferr, err)
		return err
	}
	if terminal {
		err = Terminal(err) // the key is FAILED: say so to the caller
	}
	a.observeEnd(ctx, failedOrReleased(st), nil, err)
	return err
}
