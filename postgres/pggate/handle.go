package pggate

import (
	"context"
	"errors"
	"fmt"

	"github.com/idemgo/idem"
)

// ErrNoAttempt is returned by Handle, and answered by HTTP, outside an
// attempt: ctx does not come from a consumer handler, an idemhttp
// middleware or an Executor.
var ErrNoAttempt = errors.New("pggate: no idem attempt in the context (Handle runs inside a consumer handler, HTTP under idemhttp's middleware)")

// Handle runs fn with a transaction inside a broker consumer's handler,
// so that the message's effect commits at most once per key, whatever the
// store says. It works with every adapter (consumer/redisstream, nats,
// rabbitmq, kafka, sqs) and with consumer.Processor itself, since their
// handlers all run with the context of the message's attempt (see
// idem.AttemptFrom); the attempt's store must be the gate's.
//
// Handle begins a transaction and calls fn with it. When fn returns nil,
// Handle inserts the completion row (the message's fingerprint, the
// attempt's fence, the empty result the Processor stores) in the same
// transaction and commits; then it returns nil and the Processor
// completes the record in the store and acknowledges the message, as
// without the gate. So:
//
//   - A redelivery whose key the store still knows is acknowledged from
//     the store (Redis) without running the handler.
//   - If the store never got the completion (the process died after the
//     commit, the completion failed, Redis lost the record) the
//     redelivery runs the handler again, but the completion insert
//     conflicts with the committed one: the transaction, fn's effect
//     included, is rolled back, and Handle returns nil, so the message is
//     acknowledged and its record completed. A committed completion with
//     another fingerprint makes Handle return idem.ErrMismatch, marked
//     terminal (the message is dead-lettered). The relay also repairs the
//     store in the background, so redeliveries get the fast path again.
//   - A stale owner (a handler paused past its lease while a redelivery
//     took over) conflicts the same way, whichever commits first; on
//     pgstore it is refused before its commit (an error wrapping
//     idem.ErrLeaseLost).
//
// fn's error rolls the transaction back and is returned (the Processor
// releases the key, or fails it after the maximum of deliveries). A panic
// rolls back and continues (the Processor recovers it). fn must neither
// commit nor roll back the transaction: Handle then returns ErrTxDone,
// marked terminal. If Postgres is unreachable the error is returned and
// the message redelivered; if the outcome of COMMIT is unknown the
// redelivery finds the completion, or runs again, never both.
//
// Rows committed by Handle reach the store through the Processor's
// completion and again through the relay, as Do's (relaying a COMPLETED
// record changes nothing).
func (g *Gate[T]) Handle(ctx context.Context, fn func(ctx context.Context, tx T) error) error {
	if fn == nil {
		return fmt.Errorf("%w: nil function", idem.ErrInvalid)
	}
	a, ok := idem.AttemptFrom(ctx)
	if !ok {
		return ErrNoAttempt
	}
	sctx := context.WithoutCancel(ctx)
	tx, handle, err := g.db.Begin(ctx)
	if err != nil {
		return fmt.Errorf("pggate: begin: %w", err)
	}
	ended := false
	defer func() {
		if !ended { // fn panicked or called runtime.Goexit
			_ = tx.Rollback(sctx)
		}
	}()
	ferr := fn(ctx, handle)
	ended = true
	if ferr != nil {
		_ = tx.Rollback(sctx)
		return ferr
	}
	_, conflict, st, err := g.record(ctx, sctx, a.Executor(), a, tx, nil)
	switch {
	case st == stepInsert:
		if err = insertErr(err); errors.Is(err, ErrTxDone) {
			return idem.Terminal(err)
		}
		return err
	case err != nil:
		return err
	case conflict:
		c, err := g.load(ctx, a.Key())
		if err != nil {
			return err
		}
		if c.Fingerprint != a.Fingerprint() {
			return idem.Terminal(fmt.Errorf("pggate: a completion with another fingerprint committed for this key: %w", idem.ErrMismatch))
		}
	}
	return nil
}
