package idem

import "context"

// LeaseLost describes an operation whose lease was lost while it ran:
// another owner took the key over (with a higher fence) and may run the
// operation again, so the effects of this run may be repeated. It is what
// an OnLeaseLost hook receives, to undo the run's work or flag it (a
// compensation).
type LeaseLost struct {
	// Key is the operation's idempotency key.
	Key Key
	// Fence is the fence of the lost lease.
	Fence int64
	// Err is the operation's own error; nil if it succeeded.
	Err error
}

// WithOnLeaseLost sets a function that Do (and Typed) call when the lease
// of fn was lost while fn ran: its completion (or failure) was refused with
// ErrLeaseLost, nothing was stored, and the new owner may run the
// operation again. f runs on Do's goroutine before Do returns, with a
// context that is not cancelled; Do still returns the error wrapping
// ErrLeaseLost. Callers of Begin see ErrLeaseLost from the attempt's
// ending and compensate there. The default is none.
func WithOnLeaseLost(f func(ctx context.Context, l LeaseLost)) Option {
	return func(e *Executor) { e.onLeaseLost = f }
}
