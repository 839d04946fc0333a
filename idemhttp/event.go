package idemhttp

import (
	"net/http"
	"time"
)

// Outcome is what the middleware did with a request that it covers.
type Outcome uint8

// The outcomes reported to hooks.
const (
	// OutcomeExecuted: the handler ran with the key held and the client got
	// its response. Event.Err is nil when the response was stored;
	// otherwise it tells why not: an error wrapping idem.ErrResultTooLarge
	// (the response was over the size limit; the key is FAILED), or, with
	// httpkit.StreamAll only, idem.ErrLeaseLost or a store error (the client
	// got the response whole although it was not recorded; the key stays
	// IN_PROGRESS until its lease expires).
	OutcomeExecuted Outcome = iota + 1
	// OutcomeReleased: the handler ran, and the key was released so that a
	// retry runs it again: the Policy said so for the status (by default
	// 408, 409, 425, 429 and 503), the handler hijacked the connection or
	// switched protocols (Event.Err wraps ErrHijacked), or it panicked
	// (Event.Err wraps ErrHandlerPanicked).
	OutcomeReleased
	// OutcomeReplayed: the stored response was sent again.
	OutcomeReplayed
	// OutcomeConflict: a request with the same key is in progress (409).
	OutcomeConflict
	// OutcomeMismatch: the key was used with another fingerprint (422).
	OutcomeMismatch
	// OutcomeFailed: the key is FAILED (422, TypeKeyFailed).
	OutcomeFailed
	// OutcomeRejected: the request was answered with 400 or 413 before
	// anything reached the store: the key is missing or malformed, or the
	// body is over the limit or unreadable.
	OutcomeRejected
	// OutcomeStoreError: the store failed and the middleware answered 503
	// (failing closed), or the stored response was corrupt (500).
	OutcomeStoreError
	// OutcomeFailedOpen: the store failed and, as configured by
	// WithFailOpen, the handler ran without protection. Event.Err is the
	// store's error.
	OutcomeFailedOpen
	// OutcomeNoKey: the key is optional (WithKeyRequired(false)), the
	// request had none, and the handler ran without protection.
	OutcomeNoKey
	// OutcomeAbandoned: the handler ran, and the Policy said AbandonKey:
	// nothing was stored and the key stays IN_PROGRESS until its lease
	// expires, because the outcome is unknown.
	OutcomeAbandoned
	// OutcomeNotRecorded: the handler ran, its response could not be
	// stored (Event.Err says why: a store error, idem.ErrLeaseLost, or a
	// response over the size limit whose key could not be marked FAILED),
	// and the client did not get it: a held response was replaced by 503
	// (TypeOutcomeUnknown; Event.Status is 503), and a stream was cut off
	// before its end (the connection aborted; Event.Status is the
	// stream's). The key stays IN_PROGRESS until its lease ends.
	OutcomeNotRecorded
)

var outcomeNames = [...]string{"invalid", "executed", "released", "replayed", "conflict", "mismatch", "failed", "rejected", "store-error", "failed-open", "no-key", "abandoned", "not-recorded"}

// String returns a short lower-case name, suitable as a metric label.
func (o Outcome) String() string {
	if int(o) < len(outcomeNames) {
		return outcomeNames[o]
	}
	return "invalid"
}

// Event describes how the middleware handled one request.
type Event struct {
	Outcome Outcome
	// Status is the status code sent to the client; 0 when the response
	// did not go through the middleware (OutcomeNoKey, OutcomeFailedOpen).
	Status int
	// Duration is the time from the middleware receiving the request to the
	// end of its work: reading the body, the store calls, any wait, the
	// handler, and storing or releasing.
	Duration time.Duration
	// Err is the error behind the outcome, if any.
	Err error
}

// Hook observes the outcome of each request that the middleware covers
// (requests whose method it does not cover are not reported). It runs on
// the request's goroutine after the response was written, so it must be
// quick; it is called concurrently for concurrent requests. r is the request
// as the middleware received it.
type Hook func(r *http.Request, e Event)
