package idem

import (
	"context"
	"errors"
	"time"

	"github.com/idemgo/idem/observe"
)

// WithObserver sets a function told every outcome of the Executor's calls:
// so idemhttp, the consumer adapters and every other user of the Executor
// report their outcomes through it. The default is none, which costs
// nothing. The prometheusidem module and otelidem provide observers that
// record metrics.
func WithObserver(o observe.Observer) Option { return func(e *Executor) { e.observer = o } }

// scopeKind returns the scope kind of k for an Observation.
func (k Key) scopeKind() string {
	if k.Kind != "" {
		return k.Kind
	}
	return k.Scope
}

// observeBegin reports the outcome of a Begin that did not start an
// attempt; err is what Begin returns.
func (e *Executor) observeBegin(ctx context.Context, kind string, start time.Time, store time.Duration, err error) {
	var o observe.Outcome
	switch {
	case err == nil:
		o = observe.Replayed
	case errors.Is(err, ErrInProgress):
		o = observe.InProgress
	case errors.Is(err, ErrMismatch):
		o = observe.Mismatch
	case errors.Is(err, ErrFailed):
		o = observe.Failed
	case errors.Is(err, ErrLeaseLost):
		o = observe.LeaseLost
	case errors.Is(err, ErrInvalid):
		return // a caller's mistake, not an outcome of the store
	default:
		o = observe.StoreError
	}
	e.observer(ctx, observe.Observation{Outcome: o, ScopeKind: kind, Duration: time.Since(start), StoreDuration: store, Err: err})
}

// observeEnd reports the end of an attempt: how it ended (op, or
// abandoned), the store call's error serr and the error ret returned to
// the caller.
func (a *Attempt) observeEnd(ctx context.Context, o observe.Outcome, serr, ret error) {
	if a.obs == nil {
		return
	}
	switch {
	case errors.Is(serr, ErrLeaseLost):
		o = observe.LeaseLost
	case serr != nil:
		o = observe.NotRecorded
	}
	a.e.observer(ctx, observe.Observation{
		Outcome:       o,
		ScopeKind:     a.obs.kind,
		TakenOver:     a.previous != "",
		Duration:      time.Since(a.obs.started),
		StoreDuration: a.obs.storeTime,
		Err:           ret,
	})
}

// endFailed reports an attempt whose end found the lease lost while the
// operation ran; err is what Attempt.end returned. An attempt that had
// already ended was reported then.
func (a *Attempt) endFailed(ctx context.Context, err error) {
	if a.obs == nil || errors.Is(err, errAttemptEnded) {
		return
	}
	a.observeEnd(ctx, observe.LeaseLost, err, err)
}

// attemptObs is what an attempt keeps for the Observer. It is allocated
// only when there is one, so that an Attempt stays as small without.
type attemptObs struct {
	kind      string        // the scope's kind
	started   time.Time     // when Begin was called
	storeTime time.Duration // in the acquire and the ending calls
}
