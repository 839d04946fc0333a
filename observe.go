package idem

import (
	"context"
	"errors"
	"time"
)

// Observed is what became of one call of Do or Begin, as an Observer is
// told.
type Observed uint8

// The outcomes an Observer is told. Each call of Do, and each Begin with
// the end of its Attempt, is reported exactly once; an acquisition (the
// operation is to run) is reported when its attempt ends.
const (
	// ObservedExecuted: the operation ran and its outcome was stored: its
	// result (COMPLETED), or its terminal failure (FAILED; Observation.Err
	// is the operation's error, or wraps ErrResultTooLarge).
	ObservedExecuted Observed = iota + 1
	// ObservedReplayed: the key was COMPLETED; the stored result was
	// returned and nothing ran.
	ObservedReplayed
	// ObservedFailed: the key was FAILED; the stored failure was returned
	// (a *FailedError) and nothing ran.
	ObservedFailed
	// ObservedInProgress: another caller holds the key (*InProgressError).
	ObservedInProgress
	// ObservedMismatch: the key exists with another fingerprint
	// (ErrMismatch).
	ObservedMismatch
	// ObservedReleased: the attempt gave the key back (Release, a
	// retryable error given to Abort, a panic in Do's function): the next
	// caller runs the operation.
	ObservedReleased
	// ObservedAbandoned: the attempt ended with Abandon; the key stays
	// IN_PROGRESS until its lease ends.
	ObservedAbandoned
	// ObservedLeaseLost: the attempt lost its lease (ErrLeaseLost), while
	// the operation ran or when it ended, or the acquire's reply came after
	// the lease had ended. Nothing was stored.
	ObservedLeaseLost
	// ObservedStoreError: the acquire failed (the store is unreachable or
	// answered with an error, or the stored result cannot be decoded):
	// nothing ran.
	ObservedStoreError
	// ObservedNotRecorded: the operation ran but the store call that ends
	// the attempt (complete, fail or release) failed, after the repetitions
	// the Executor makes: the key stays IN_PROGRESS until its lease ends,
	// and the outcome is unknown to later callers.
	ObservedNotRecorded

	observedEnd // the number of outcomes, plus one
)

var observedNames = [...]string{"invalid", "executed", "replayed", "failed", "in-progress", "mismatch", "released", "abandoned", "lease-lost", "store-error", "not-recorded"}

// String returns the outcome's name, as used for metric labels:
// "executed", "replayed", "failed", "in-progress", "mismatch", "released",
// "abandoned", "lease-lost", "store-error", "not-recorded", or "invalid".
func (o Observed) String() string {
	if o >= observedEnd {
		o = 0
	}
	return observedNames[o]
}

// ObservedOutcomes lists every outcome an Observer may be told, in order,
// so that metrics can create their series in advance.
func ObservedOutcomes() []Observed {
	out := make([]Observed, 0, observedEnd-1)
	for o := ObservedExecuted; o < observedEnd; o++ {
		out = append(out, o)
	}
	return out
}

// Observation describes one outcome. It never holds a key: only the
// scope's kind.
type Observation struct {
	Outcome Observed
	// ScopeKind is the kind of the key's scope: Key.Kind, or Key.Scope when
	// Kind is empty. idemhttp sets "http"; the consumer adapters use their
	// scope (by default "consumer").
	ScopeKind string
	// TakenOver is set when the attempt took the key over from a previous
	// owner whose lease had expired (the owner crashed, hung, or its
	// outcome was unknown).
	TakenOver bool
	// Duration is the time from the start of Do or Begin to the report:
	// the end of the attempt, or Begin's return when nothing was to run.
	Duration time.Duration
	// StoreDuration is the part of Duration spent in the store calls that
	// acquire the key and end the attempt, repetitions included (not the
	// lease extensions, which run beside the operation).
	StoreDuration time.Duration
	// Err is the error the caller got, if any (for ObservedExecuted, the
	// operation's terminal error, if any).
	Err error
}

// Observer is told every outcome of an Executor (see WithObserver). It is
// called synchronously on the caller's goroutine, so it must be fast and
// safe for concurrent use; it must not keep o.Err's memory beyond the call
// if that matters to it. ctx is the context of the call (for Begin's
// outcomes) or the one given to the method that ended the attempt.
type Observer func(ctx context.Context, o Observation)

// WithObserver sets a function told every outcome of the Executor's calls:
// so idemhttp, the consumer adapters and every other user of the Executor
// report their outcomes through it. The default is none, which costs
// nothing. The prometheusidem module and otelidem provide observers that
// record metrics.
func WithObserver(o Observer) Option { return func(e *Executor) { e.observer = o } }

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
	var o Observed
	switch {
	case err == nil:
		o = ObservedReplayed
	case errors.Is(err, ErrInProgress):
		o = ObservedInProgress
	case errors.Is(err, ErrMismatch):
		o = ObservedMismatch
	case errors.Is(err, ErrFailed):
		o = ObservedFailed
	case errors.Is(err, ErrLeaseLost):
		o = ObservedLeaseLost
	case errors.Is(err, ErrInvalid):
		return // a caller's mistake, not an outcome of the store
	default:
		o = ObservedStoreError
	}
	e.observer(ctx, Observation{Outcome: o, ScopeKind: kind, Duration: time.Since(start), StoreDuration: store, Err: err})
}

// observeEnd reports the end of an attempt: how it ended (op, or
// abandoned), the store call's error serr and the error ret returned to
// the caller.
func (a *Attempt) observeEnd(ctx context.Context, o Observed, serr, ret error) {
	if a.obs == nil {
		return
	}
	switch {
	case errors.Is(serr, ErrLeaseLost):
		o = ObservedLeaseLost
	case serr != nil:
		o = ObservedNotRecorded
	}
	a.e.observer(ctx, Observation{
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
	a.observeEnd(ctx, ObservedLeaseLost, err, err)
}

// attemptObs is what an attempt keeps for the Observer. It is allocated
// only when there is one, so that an Attempt stays as small without.
type attemptObs struct {
	kind      string        // the scope's kind
	started   time.Time     // when Begin was called
	storeTime time.Duration // in the acquire and the ending calls
}
