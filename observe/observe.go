// Package observe is what an Executor tells an observer: one Observation
// per call of Do, and per Begin with the end of its Attempt. It is the
// seam that metrics and traces hang on (idem.WithObserver); the
// prometheusidem and otelidem modules provide observers. It imports only
// the standard library.
//
//	exec, _ := idem.New(store, idem.WithObserver(func(ctx context.Context, o observe.Observation) {
//		log.Printf("%s %s in %v", o.ScopeKind, o.Outcome, o.Duration)
//	}))
package observe

import (
	"context"
	"time"
)

// Outcome is what became of one call of Do or Begin, as an Observer is
// told.
type Outcome uint8

// The outcomes an Observer is told. Each call of Do, and each Begin with
// the end of its Attempt, is reported exactly once; an acquisition (the
// operation is to run) is reported when its attempt ends.
const (
	// Executed: the operation ran and its outcome was stored: its result
	// (COMPLETED), or its terminal failure (FAILED; Observation.Err is the
	// operation's error, or wraps idem.ErrResultTooLarge).
	Executed Outcome = iota + 1
	// Replayed: the key was COMPLETED; the stored result was returned and
	// nothing ran.
	Replayed
	// Failed: the key was FAILED; the stored failure was returned (an
	// *idem.FailedError) and nothing ran.
	Failed
	// InProgress: another caller holds the key (*idem.InProgressError).
	InProgress
	// Mismatch: the key exists with another fingerprint
	// (idem.ErrMismatch).
	Mismatch
	// Released: the attempt gave the key back (Attempt.Release, a
	// retryable error given to Attempt.Fail, a panic in Do's function):
	// the next caller runs the operation.
	Released
	// Abandoned: the attempt ended with Attempt.Abandon; the key stays
	// IN_PROGRESS until its lease ends.
	Abandoned
	// LeaseLost: the attempt lost its lease (idem.ErrLeaseLost), while the
	// operation ran or when it ended, or the acquire's reply came after
	// the lease had ended. Nothing was stored.
	LeaseLost
	// StoreError: the acquire failed (the store is unreachable or answered
	// with an error, or the stored result cannot be decoded): nothing ran.
	StoreError
	// NotRecorded: the operation ran but the store call that ends the
	// attempt (complete, fail or release) failed, after the repetitions
	// the Executor makes: the key stays IN_PROGRESS until its lease ends,
	// and the outcome is unknown to later callers.
	NotRecorded

	end // the number of outcomes, plus one
)

var names = [...]string{"invalid", "executed", "replayed", "failed", "in-progress", "mismatch", "released", "abandoned", "lease-lost", "store-error", "not-recorded"}

// String returns the outcome's name, as used for metric labels:
// "executed", "replayed", "failed", "in-progress", "mismatch", "released",
// "abandoned", "lease-lost", "store-error", "not-recorded", or "invalid".
func (o Outcome) String() string {
	if o >= end {
		o = 0
	}
	return names[o]
}

// Outcomes lists every outcome an Observer may be told, in order, so that
// metrics can create their series in advance.
func Outcomes() []Outcome {
	out := make([]Outcome, 0, end-1)
	for o := Executed; o < end; o++ {
		out = append(out, o)
	}
	return out
}

// Observation describes one outcome. It never holds a key: only the
// scope's kind.
type Observation struct {
	Outcome Outcome
	// ScopeKind is the kind of the key's scope: idem.Key.Kind, or
	// Key.Scope when Kind is empty. idemhttp sets "http"; the consumer
	// adapters use their scope (by default "consumer").
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
	// Err is the error the caller got, if any (for Executed, the
	// operation's terminal error, if any).
	Err error
}

// Observer is told every outcome of an Executor (idem.WithObserver). It is
// called synchronously on the caller's goroutine, so it must be fast and
// safe for concurrent use; it must not keep o.Err's memory beyond the call
// if that matters to it. ctx is the context of the call (for Begin's
// outcomes) or the one given to the method that ended the attempt.
type Observer func(ctx context.Context, o Observation)
