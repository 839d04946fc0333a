// Package consumer turns at-least-once delivery into one execution per
// message key. Broker adapters decorate the broker's own handler shape with
// a Processor and map its Actions to the broker's acknowledgements.
//
// The order of operations for each message is: acquire the key, run the
// handler (with the lease and fence in its context), complete the key, and
// only then acknowledge. So:
//
//   - a duplicate whose key is COMPLETED is acknowledged without running the
//     handler (Ack, Replayed);
//   - a duplicate whose key is IN_PROGRESS elsewhere is never acknowledged:
//     it is redelivered after the lease left (Retry);
//   - a handler error releases the key and the message is redelivered
//     (Retry), until the broker delivered it MaxDeliveries times: then the
//     key becomes FAILED and the message goes to the dead-letter path
//     (DeadLetter);
//   - a message without a key is dead-lettered, never processed twice
//     silently.
//
// A crash anywhere before the acknowledgement leads to a redelivery, which
// the record turns into a replay (after completion) or a takeover (after the
// lease). Nothing is lost; effects happen once per key, within the limits
// of the idem package's guarantees (the fence, for owners that were paused
// past their lease).
package consumer

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/idemgo/idem"
)

// ErrNoKey is the error of a message whose key extractor found no key.
var ErrNoKey = errors.New("consumer: message has no idempotency key")

// Message is a delivered message, reduced to what idempotency needs.
type Message struct {
	// Key is the message's idempotency key, as the adapter's key extractor
	// found it; empty means none.
	Key string
	// Fingerprint identifies the payload (optional): the same key with
	// another fingerprint is dead-lettered with idem.ErrMismatch.
	Fingerprint string
	// Deliveries is how often the broker delivered the message, this
	// delivery included; 0 if the broker does not say.
	Deliveries int
}

// Action is what the adapter must do with a message.
type Action uint8

const (
	// Ack: the key is COMPLETED, now or before. Acknowledge (or commit).
	Ack Action = iota + 1
	// Retry: do not acknowledge; have the message redelivered after Delay
	// (nack with a delay, or leave it pending).
	Retry
	// DeadLetter: route the message to the dead-letter path, then
	// acknowledge it.
	DeadLetter
)

var actionNames = [...]string{"invalid", "ack", "retry", "dead-letter"}

func (a Action) String() string {
	if int(a) < len(actionNames) {
		return actionNames[a]
	}
	return "invalid"
}

// Result is the outcome of one message.
type Result struct {
	Action Action
	// Delay is when to redeliver, for Retry.
	Delay time.Duration
	// Replayed is true for an Ack of a key that was already COMPLETED: the
	// handler did not run.
	Replayed bool
	// Err says why, for Retry and DeadLetter: the handler's error,
	// ErrNoKey, idem.ErrMismatch, a *idem.FailedError, an
	// *idem.InProgressError or a store error.
	Err error
}

// Handler processes message i of a batch. ctx carries the lease
// (idem.FenceFrom) and is cancelled if the lease is lost.
type Handler func(ctx context.Context, i int) error

// Option configures a Processor.
type Option func(*Processor)

// WithScope sets the scope of message keys, for example the topic or queue
// name, so that two consumers with overlapping key spaces do not share
// records. The default is "consumer".
func WithScope(scope string) Option { return func(p *Processor) { p.scope = scope } }

// WithMaxDeliveries sets after how many deliveries a message whose handler
// keeps failing is dead-lettered (its key becomes FAILED). The default is 5;
// 0 means never (a failing message is retried forever).
func WithMaxDeliveries(n int) Option { return func(p *Processor) { p.maxDeliveries = n } }

// WithRetryDelay sets the redelivery delay after a handler or store error.
// The default is 1s.
func WithRetryDelay(d time.Duration) Option { return func(p *Processor) { p.retryDelay = d } }

// Processor runs handlers at most once per message key. It is safe for
// concurrent use.
type Processor struct {
	exec          *idem.Executor
	scope         string
	maxDeliveries int
	retryDelay    time.Duration
}

// New returns a Processor on exec.
func New(exec *idem.Executor, opts ...Option) (*Processor, error) {
	if exec == nil {
		return nil, fmt.Errorf("%w: consumer: nil executor", idem.ErrInvalid)
	}
	p := &Processor{exec: exec, scope: "consumer", maxDeliveries: 5, retryDelay: time.Second}
	for _, o := range opts {
		o(p)
	}
	switch {
	case p.maxDeliveries < 0:
		return nil, fmt.Errorf("%w: consumer: max deliveries %d is negative", idem.ErrInvalid, p.maxDeliveries)
	case p.retryDelay < 0:
		return nil, fmt.Errorf("%w: consumer: retry delay %v is negative", idem.ErrInvalid, p.retryDelay)
	}
	return p, nil
}

// Executor returns the processor's executor.
func (p *Processor) Executor() *idem.Executor { return p.exec }

// Key returns the idem.Key of a message key.
func (p *Processor) Key(key string) idem.Key { return idem.Key{Scope: p.scope, ID: key} }

// Process runs h for each message whose key is not COMPLETED yet, in order,
// and returns one Result per message. Messages are acquired before any
// handler runs and completed after the last one, so that a store that
// batches does so in about two round trips per batch. A panic in h releases
// the keys still held and continues.
func (p *Processor) Process(ctx context.Context, msgs []Message, h Handler) []Result {
	results := make([]Result, len(msgs))
	type held struct {
		ctx context.Context
		a   *idem.Attempt
	}
	attempts := make([]held, len(msgs))
	done := make([]bool, len(msgs))
	defer func() {
		// After a panic: complete the keys whose handler succeeded (their
		// effect happened) and give back the others.
		for i, h := range attempts {
			if h.a == nil {
				continue
			}
			if done[i] {
				_ = h.a.Commit(context.WithoutCancel(ctx), nil)
			} else {
				_ = h.a.Release(context.WithoutCancel(ctx))
			}
		}
	}()
	// Acquire every keyed message at once: one pipeline on a BatchStore.
	keys := make([]idem.Key, 0, len(msgs))
	fps := make([]string, 0, len(msgs))
	idx := make([]int, 0, len(msgs))
	for i, m := range msgs {
		if m.Key == "" {
			results[i] = Result{Action: DeadLetter, Err: ErrNoKey}
			continue
		}
		keys = append(keys, p.Key(m.Key))
		fps = append(fps, m.Fingerprint)
		idx = append(idx, i)
	}
	for j, b := range p.exec.BeginBatch(ctx, keys, fps) {
		i := idx[j]
		switch {
		case b.Err == nil && b.Attempt.Replayed():
			results[i] = Result{Action: Ack, Replayed: true}
		case b.Err == nil:
			attempts[i] = held{b.Ctx, b.Attempt}
		default:
			results[i] = p.refused(b.Err)
		}
	}
	sctx := context.WithoutCancel(ctx)
	for i, m := range msgs {
		at := attempts[i]
		if at.a == nil {
			continue
		}
		err := h(at.ctx, i)
		if err == nil {
			done[i] = true
			continue
		}
		attempts[i].a = nil
		if idem.IsTerminal(err) || (p.maxDeliveries > 0 && m.Deliveries >= p.maxDeliveries) {
			ferr := at.a.Fail(sctx, err)
			results[i] = Result{Action: DeadLetter, Err: errors.Join(err, ferr)}
			if ferr != nil && !errors.Is(ferr, idem.ErrLeaseLost) {
				// The failure was not stored: retry rather than lose it.
				results[i] = Result{Action: Retry, Delay: p.retryDelay, Err: errors.Join(err, ferr)}
			}
			continue
		}
		rerr := at.a.Release(sctx)
		results[i] = Result{Action: Retry, Delay: p.retryDelay, Err: errors.Join(err, rerr)}
	}
	// Complete every handled message at once: one pipeline on a BatchStore.
	commit := make([]*idem.Attempt, len(msgs))
	for i := range msgs {
		if attempts[i].a != nil && done[i] {
			commit[i] = attempts[i].a
			attempts[i].a = nil
		}
	}
	for i, err := range p.exec.CommitBatch(sctx, commit, make([][]byte, len(msgs))) {
		switch {
		case commit[i] == nil:
		case err != nil:
			// Not completed (lease lost, store down): the message must come
			// back; the record decides then.
			results[i] = Result{Action: Retry, Delay: p.retryDelay, Err: err}
		default:
			results[i] = Result{Action: Ack}
		}
	}
	return results
}

// refused maps a Begin error to a Result.
func (p *Processor) refused(err error) Result {
	var ip *idem.InProgressError
	var failed *idem.FailedError
	switch {
	case errors.As(err, &ip):
		return Result{Action: Retry, Delay: max(ip.RetryAfter, time.Millisecond), Err: err}
	case errors.As(err, &failed):
		// Dead-lettered before; again, in case the crash came between
		// storing the failure and the dead-letter write.
		return Result{Action: DeadLetter, Err: err}
	case errors.Is(err, idem.ErrMismatch):
		return Result{Action: DeadLetter, Err: err}
	default:
		return Result{Action: Retry, Delay: p.retryDelay, Err: err}
	}
}
