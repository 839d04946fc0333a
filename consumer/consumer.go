package consumer

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"runtime/debug"
	"sync"
	"sync/atomic"
	"time"

	"github.com/idemgo/idem"
	"github.com/idemgo/idem/adapterkit"
	"github.com/idemgo/idem/observe"
	"github.com/idemgo/idem/storekit"
)

// ErrNoKey is the error of a message whose key extractor found no key.
var ErrNoKey = errors.New("consumer: message has no idempotency key")

// ErrPanic is the error of a handler that panicked: the panic is recovered
// and handled as the handler's error (the key is released and the message
// redelivered, then dead-lettered after the maximum of deliveries). The
// panic value is in the error's text; the stack is logged.
var ErrPanic = errors.New("consumer: handler panicked")

// ErrStopping is the error of a message whose handler did not start
// because the batch's context was done (the consumer is stopping): its key
// is released and the message is left for redelivery.
var ErrStopping = errors.New("consumer: stopping")

// ErrAbandoned is the error of a message whose handler had not returned
// AbandonAfter after the batch's context was done (the consumer stopping
// past its shutdown timeout, a Kafka partition revoked), although its own
// context was cancelled then: the Processor stopped waiting for it, so
// that the consumer can stop. The key is left to its lease (IN_PROGRESS
// under the handler's fence, no longer extended: the next owner takes it
// over with a higher fence once the lease ended) and the message is left
// for redelivery. The handler's goroutine runs on until the handler
// returns; what it returns then is ignored: nothing is completed,
// released or acknowledged for it.
var ErrAbandoned = errors.New("consumer: handler abandoned: it ignored its context's cancellation")

// AbandonAfter is how long the Processor waits for a handler once the
// batch's context is done (the handler's context is cancelled then)
// before it abandons the handler (ErrAbandoned). So a consumer's Run
// returns at most about the shutdown timeout plus AbandonAfter (plus its
// broker calls) after it was told to stop, whatever its handlers do.
const AbandonAfter = time.Second

// IsInvalid reports whether err is the error of a message that cannot be
// processed however often it is delivered: it has no key (ErrNoKey), or
// its key or fingerprint is over its limit (idem.ErrInvalid). Such a
// message is dead-lettered at once.
func IsInvalid(err error) bool { return errors.Is(err, ErrNoKey) || errors.Is(err, idem.ErrInvalid) }

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
	// ID is the broker's identifier of the message (optional), for a
	// CommitFunc that acknowledges it with the completion.
	ID string
	// Last is true when the broker will not deliver the message again (a
	// server-side maximum of deliveries reached): then a failure
	// dead-letters it rather than leave it to be lost, as after the
	// maximum of deliveries.
	Last bool
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

// String returns the action's name: "ack", "retry" or "dead-letter".
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
	// Err says why, for Retry and DeadLetter: the handler's error (ErrPanic
	// for a panic), ErrNoKey, an error wrapping idem.ErrInvalid (a key or
	// fingerprint over its limit), idem.ErrMismatch, a *idem.FailedError,
	// an *idem.InProgressError, ErrStopping, ErrAbandoned or a store error.
	Err error
}

// Handler processes message i of a batch. ctx carries the lease
// (idem.FenceFrom) and is cancelled if the lease is lost or the batch's
// context is done. It runs on a goroutine of its own (unless the batch's
// context can never be done); a handler that has not returned AbandonAfter
// after the batch's context was done is abandoned (ErrAbandoned).
type Handler func(ctx context.Context, i int) error

// CommitFunc completes the keys of the handled messages of a batch:
// attempts[k] holds the key of msgs[k], and values[k] the result its
// handler set (SetResult; nil if none), to store with the completion. It
// returns one error per attempt with the meaning of idem.Attempt.Commit's.
// The default is adapterkit.CommitBatch; an adapter whose broker can
// acknowledge in the same atomic call as the completion (Redis Streams)
// passes its own, built on adapterkit.CommitBatchWith.
type CommitFunc func(ctx context.Context, msgs []Message, attempts []*idem.Attempt, values [][]byte) []error

// Event is what the event hook (WithEventHook) learns of each message.
type Event struct {
	// Result is the Processor's decision.
	Result Result
	// KeyDigest is the digest of the message's scoped key (idem.Key.Digest),
	// empty when it has none: raw keys never reach hooks or logs.
	KeyDigest string
	// Deliveries is the message's delivery count (Message.Deliveries).
	Deliveries int
	// Duration is how long the handler ran (0 if it did not run).
	Duration time.Duration
}

// duplicateKey is the context key of a duplicate passed to the handler.
type duplicateKey struct{}

// resultKey is the context key of a handler's result slot (SetResult).
type resultKey struct{}

// resultSlot is what a handler's context carries: its message, and the
// result it set.
type resultSlot struct {
	msg   Message
	i     int     // the message's index in its batch
	group *gather // WithGatheredHandlers: the batch's handlers
	dup   bool    // a duplicate passed to the handler: no result to set
	mu    sync.Mutex
	value []byte
}

// MessageFrom returns the Message (key, delivery count, broker ID) whose
// handler runs with ctx; ok is false outside a handler.
func MessageFrom(ctx context.Context) (m Message, ok bool) {
	s, ok := ctx.Value(resultKey{}).(*resultSlot)
	if !ok {
		return Message{}, false
	}
	return s.msg, true
}

// SetResult sets the result stored with the completion of the key of the
// message whose handler's context is ctx: what a duplicate passed to a
// handler later finds (DuplicateFrom), and what idem's admin commands
// show. A later call replaces an earlier one; the result is copied. The
// default is an empty result. It reports false when ctx is not a
// handler's context (a duplicate's included: its key is completed
// already). It is safe for concurrent use; a result set after the handler
// returned is ignored.
func SetResult(ctx context.Context, value []byte) bool {
	s, ok := ctx.Value(resultKey{}).(*resultSlot)
	if !ok || s.dup {
		return false
	}
	s.mu.Lock()
	s.value = append([]byte(nil), value...)
	s.mu.Unlock()
	return true
}

// DuplicateFrom reports whether ctx is the context of a duplicate passed to
// the handler (WithPassDuplicates), and returns the key's stored result.
func DuplicateFrom(ctx context.Context) (result []byte, ok bool) {
	v, ok := ctx.Value(duplicateKey{}).([]byte)
	return v, ok
}

// Stats are a Processor's counters since New, one per message decision;
// the same type for every adapter. When the broker call that carries a
// decision out fails (an acknowledgement, a dead-letter write), Errors
// counts it too and the message comes back, to be decided again. Safe to
// copy.
type Stats struct {
	// Processed: the handler ran and the key was completed (Ack).
	Processed int64
	// Replayed: the key was already COMPLETED, or the message repeated one
	// completed earlier in its batch; acknowledged without the handler.
	Replayed int64
	// Retried: left for redelivery (key in progress elsewhere, handler
	// error, store error, lease lost, stopping).
	Retried int64
	// DeadLettered: sent to the dead-letter path (Invalid included).
	DeadLettered int64
	// Invalid: messages without a key, or with a key or fingerprint over
	// its limit; dead-lettered at once (also counted in DeadLettered).
	Invalid int64
	// Panics: handlers that panicked (also counted in Retried or
	// DeadLettered).
	Panics int64
	// Redelivered: messages the broker delivered more than once
	// (Message.Deliveries > 1), whatever their outcome.
	Redelivered int64
	// Errors: broker calls that failed (an acknowledgement, a dead-letter
	// write, a fetch), as adapters report them with ReportError.
	Errors int64
	// Abandoned: handlers that had not returned AbandonAfter after their
	// context was cancelled by the consumer's stop (ErrAbandoned; also
	// counted in Retried or DeadLettered). Each one's goroutine runs on
	// until the handler returns.
	Abandoned int64
}

// Processor runs handlers at most once per message key. It is safe for
// concurrent use.
type Processor struct {
	exec           *idem.Executor
	scope          string
	maxDeliveries  int
	retryDelay     time.Duration
	commit         CommitFunc
	onEvent        func(Event)
	log            *slog.Logger
	onLeaseLost    func(context.Context, idem.LeaseLost)
	passDuplicates bool
	parallel       int
	maxRetryDelay  time.Duration
	completeEach   bool
	gathered       bool
	// work hands a handler to an idle worker (handleOwn, goHandler).
	work chan func()

	stats struct {
		processed, replayed, retried, dead, invalid, panics, redelivered, errors, abandoned atomic.Int64
	}
}

// New returns a Processor on exec, configured by the options of package
// consumer (an adapter's own options are refused). Errors wrap
// idem.ErrInvalid.
func New(exec *idem.Executor, opts ...Option) (*Processor, error) {
	p, _, err := Setup(exec, Config{Scope: "consumer"}, nil, opts)
	return p, err
}

// Executor returns the processor's executor.
func (p *Processor) Executor() *idem.Executor { return p.exec }

// Key returns the idem.Key of a message key.
func (p *Processor) Key(key string) idem.Key { return idem.Key{Scope: p.scope, ID: key} }

// Stats returns a snapshot of the counters.
func (p *Processor) Stats() Stats {
	return Stats{
		Processed:    p.stats.processed.Load(),
		Replayed:     p.stats.replayed.Load(),
		Retried:      p.stats.retried.Load(),
		DeadLettered: p.stats.dead.Load(),
		Invalid:      p.stats.invalid.Load(),
		Panics:       p.stats.panics.Load(),
		Redelivered:  p.stats.redelivered.Load(),
		Errors:       p.stats.errors.Load(),
		Abandoned:    p.stats.abandoned.Load(),
	}
}

// ReportError counts a failed broker call of an adapter in Stats.Errors
// and logs it (WARN). msg says what failed.
func (p *Processor) ReportError(msg string, err error) {
	p.stats.errors.Add(1)
	p.log.Warn("consumer: "+msg, "scope", p.scope, "err", err)
}

// Process runs h for each message whose key is not COMPLETED yet, in order,
// and returns one Result per message: Acquire, then Batch.Handle, then
// Batch.Commit. Messages are acquired before any handler runs and completed
// after the last one (or each as its handler returns, WithCompleteEach), so
// that a store that batches does so in about two round trips per batch.
//
// A message whose key already appeared earlier in the batch is not
// acquired and its handler does not run: it follows the first one. If the
// first was acknowledged, the repeat is acknowledged as a replay (or
// dead-lettered with idem.ErrMismatch when its fingerprint differs);
// otherwise it is retried with the first's delay.
func (p *Processor) Process(ctx context.Context, msgs []Message, h Handler) []Result {
	b := p.Acquire(ctx, msgs)
	b.Handle(h)
	return b.Commit(ctx)
}

// Batch is a batch of messages between its acquisition and its commit, for
// adapters that act between the steps (Process runs them in a row). Its
// methods are called in order from one goroutine: Handle once, then Commit
// or Abandon once.
type Batch struct {
	p         *Processor
	ctx       context.Context
	msgs      []Message
	results   []Result
	held      []*idem.Attempt
	ctxs      []context.Context
	follow    []int // index+1 of the first message with the same key, or 0
	done      []bool
	durations []time.Duration
	invalid   []bool
	dups      [][]byte // stored results of duplicates passed to the handler
	values    []*resultSlot
	group     *gather         // WithGatheredHandlers
	state     []atomic.Uint32 // handleOwn: each handler's state

	// The completions of WithCompleteEach: handlers that returned append
	// their index to queued; one of them at a time (flushing) completes
	// every queued key in one commit call while the others wait.
	cmu      sync.Mutex
	cdone    *sync.Cond
	queued   []int
	flushing bool
	recorded []bool
}

// Acquire checks every message and acquires the keys of the valid ones in
// one BeginBatch. A message without a key, or whose key or fingerprint is
// over its limit, is dead-lettered at once: redelivering it cannot fix it.
func (p *Processor) Acquire(ctx context.Context, msgs []Message) *Batch {
	n := len(msgs)
	b := &Batch{
		p: p, ctx: ctx, msgs: msgs,
		results: make([]Result, n), held: make([]*idem.Attempt, n), ctxs: make([]context.Context, n),
		follow: make([]int, n), done: make([]bool, n), durations: make([]time.Duration, n), invalid: make([]bool, n),
		values: make([]*resultSlot, n),
	}
	keys := make([]idem.Key, 0, n)
	fps := make([]string, 0, n)
	idx := make([]int, 0, n)
	first := make(map[string]int, n)
	for i, m := range msgs {
		if err := p.check(m); err != nil {
			b.invalid[i] = true
			b.results[i] = Result{Action: DeadLetter, Err: err}
			continue
		}
		if f, ok := first[m.Key]; ok {
			b.follow[i] = f + 1
			continue
		}
		first[m.Key] = i
		keys = append(keys, p.Key(m.Key))
		fps = append(fps, m.Fingerprint)
		idx = append(idx, i)
	}
	for j, r := range adapterkit.BeginBatch(ctx, p.exec, keys, fps) {
		i := idx[j]
		switch {
		case r.Err == nil && r.Attempt.Replayed():
			b.results[i] = Result{Action: Ack, Replayed: true}
			if p.passDuplicates {
				if b.dups == nil {
					b.dups = make([][]byte, n)
				}
				b.dups[i] = append([]byte{}, r.Attempt.Value()...)
			}
		case r.Err == nil:
			b.values[i] = &resultSlot{msg: msgs[i], i: i}
			b.held[i], b.ctxs[i] = r.Attempt, context.WithValue(r.Ctx, resultKey{}, b.values[i])
		default:
			b.results[i] = p.refused(r.Err)
		}
	}
	return b
}

// check returns why m cannot be processed, if it cannot.
func (p *Processor) check(m Message) error {
	if m.Key == "" {
		return ErrNoKey
	}
	if err := p.Key(m.Key).Validate(); err != nil {
		return fmt.Errorf("consumer: %w", err)
	}
	if len(m.Fingerprint) > storekit.MaxFingerprintLen {
		return fmt.Errorf("consumer: %w: fingerprint is %d bytes, over the limit of %d", idem.ErrInvalid, len(m.Fingerprint), storekit.MaxFingerprintLen)
	}
	return nil
}

// Held reports whether message i's key is held by the batch (its handler
// is to run or ran successfully and it is not committed yet).
func (b *Batch) Held(i int) bool { return b.held[i] != nil }

// Handle runs h for every message whose key the batch holds: in order,
// one at a time, or up to WithParallelHandlers at once (the keys of a
// batch are distinct: a repeat follows the first, so one key's messages
// never run at the same time). A panic in h (or runtime.Goexit) is
// recovered and handled as an error wrapping ErrPanic. A failed message's
// key is released for a redelivery or, after the maximum of deliveries or
// for an error marked with idem.Terminal, stored as FAILED and the message
// dead-lettered. Once the batch's context is done, no handler starts: the
// remaining keys are released (ErrStopping); a handler still running then
// is waited for at most AbandonAfter, then abandoned (ErrAbandoned: its key
// is left to its lease, its message retried). Handle returns when every
// handler returned or was abandoned: nothing is completed or acknowledged
// before (Commit).
func (b *Batch) Handle(h Handler) {
	n := b.p.parallel
	if b.p.gathered {
		n = b.gather() // every handler at once: they wait for each other
	}
	if n <= 1 {
		for i := range b.msgs {
			b.handle(h, i)
		}
		return
	}
	if b.ctx.Done() != nil {
		b.handleOwn(h, n)
		return
	}
	sem := make(chan struct{}, n)
	var wg sync.WaitGroup
	for i := range b.msgs {
		if !b.toRun(i) {
			continue // nothing to run: skip without taking a slot
		}
		sem <- struct{}{}
		wg.Go(func() {
			defer func() { <-sem }()
			b.handle(h, i)
		})
	}
	wg.Wait()
}

// The states of a handler that runs on a goroutine of its own
// (handleOwn): Handle abandons a running one, or it returns first.
const (
	handlerRunning = iota + 1
	handlerReturned
	handlerAbandoned
)

// handleOwn is Handle for up to n handlers at once on a batch whose
// context can be done: each message's handler runs on one goroutine of its
// own, which also settles the message (runOwn), while Handle's goroutine
// waits for them all and, AbandonAfter after the batch's context is done,
// abandons those still running (so one goroutine a message, not two).
func (b *Batch) handleOwn(h Handler, n int) {
	b.state = make([]atomic.Uint32, len(b.msgs))
	stop := b.ctx.Done()
	var sem chan struct{} // nil when every handler may run at once
	if n < len(b.msgs) {
		sem = make(chan struct{}, n)
	}
	// left counts the handlers not settled yet, plus one for this loop
	// until every handler started; the one that counts the last sends on
	// all, so that Handle wakes once, not once per handler.
	var left atomic.Int64
	left.Store(1)
	all := make(chan struct{}, 1)
	settled := func() {
		if left.Add(-1) == 0 {
			all <- struct{}{}
		}
	}
	for i := range b.msgs {
		if !b.toRun(i) {
			continue // nothing to run: skip without taking a slot
		}
		slot := sem != nil
		if slot {
			select {
			case sem <- struct{}{}:
			case <-stop:
				// The batch stops: no handler of a held key starts
				// (ErrStopping), and none waits for a slot.
				slot = false
			}
		}
		left.Add(1)
		b.p.goHandler(func() {
			defer func() {
				if slot {
					<-sem
				}
				if b.state[i].Load() != handlerAbandoned { // counted when abandoned
					settled()
				}
			}()
			b.handle(h, i)
		})
	}
	settled()
	var t *time.Timer
	var late <-chan time.Time
	for {
		select {
		case <-all:
			return
		case <-stop:
			stop = nil
			t = time.NewTimer(AbandonAfter)
			defer t.Stop()
			late = t.C
		case <-late:
			for i := range b.state {
				if b.state[i].CompareAndSwap(handlerRunning, handlerAbandoned) {
					b.abandon(i)
					settled()
				}
			}
			// A handler that started since (a duplicate passed on as the
			// batch stopped) gets AbandonAfter too.
			t.Reset(AbandonAfter)
		}
	}
}

// workerIdle is how long a worker of handleOwn waits for another handler
// before its goroutine ends.
const workerIdle = 5 * time.Second

// goHandler runs f, a message's handler with what settles it (handleOwn),
// on an idle worker of the processor, or on a new one when none is idle.
// A worker runs one f after another, so the handlers of each batch do
// not each start a goroutine whose stack grows again on the way into
// the handler (a gathered batch starts all of its handlers at once); it
// ends after workerIdle without one. A worker whose f does not return
// (an abandoned handler) serves nothing else, and one whose f calls
// runtime.Goexit ends with it.
func (p *Processor) goHandler(f func()) {
	select {
	case p.work <- f:
	default:
		go p.worker(f)
	}
}

// worker runs f, then what goHandler hands it, until it has been idle for
// workerIdle.
func (p *Processor) worker(f func()) {
	var idle *time.Timer
	for {
		f()
		if idle == nil {
			idle = time.NewTimer(workerIdle)
		} else {
			idle.Reset(workerIdle)
		}
		select {
		case f = <-p.work:
		case <-idle.C:
			return
		}
	}
}

// toRun reports whether message i's handler is to run: the batch holds
// its key, or it is a duplicate passed on.
func (b *Batch) toRun(i int) bool { return b.held[i] != nil || b.dups != nil && b.dups[i] != nil }

// handle runs h for message i if the batch holds its key (or passes it on
// as a duplicate) and settles its attempt on failure. Calls for distinct
// i may run at the same time: each touches only the i-th slots.
func (b *Batch) handle(h Handler, i int) {
	if b.dups != nil && b.dups[i] != nil {
		b.passDuplicate(h, i)
		return
	}
	a := b.held[i]
	if a == nil {
		return
	}
	var err error
	if cerr := b.ctx.Err(); cerr != nil {
		err = fmt.Errorf("%w: %w", ErrStopping, cerr)
		b.group.leave(i)
	} else if b.ctxs[i].Err() != nil {
		err = context.Cause(b.ctxs[i]) // the lease was lost before the handler started
		b.group.leave(i)
	} else {
		b.runThen(b.ctxs[i], h, i, a.Key(), func(err error) { b.settle(i, a, err, true) })
		return
	}
	b.settle(i, a, err, false)
}

// runThen runs h for message i (run) and then decides the message with
// its error (then), after timing it; or abandons it, unless Handle did
// (handleOwn).
func (b *Batch) runThen(ctx context.Context, h Handler, i int, digest string, then func(error)) {
	start := time.Now()
	ran := func(err error) {
		b.durations[i] = time.Since(start)
		then(err)
	}
	abandoned, err := b.run(ctx, h, i, digest, ran)
	switch {
	case abandoned && b.state != nil:
		return // Handle settled it (handleOwn)
	case abandoned:
		b.durations[i] = time.Since(start)
		b.abandon(i)
		return
	}
	ran(err)
}

// settle decides message i, whose key a holds, after its handler
// returned err (ran) or did not start with err: a success waits for
// Commit (or is completed now, WithCompleteEach); a failure releases
// the key for a redelivery or fails it and dead-letters the message.
func (b *Batch) settle(i int, a *idem.Attempt, err error, ran bool) {
	p := b.p
	m := b.msgs[i]
	if err == nil {
		b.done[i] = true
		if p.completeEach {
			b.completeNow(i)
		}
		return
	}
	// sctx is for the store calls that settle a failed message: made on
	// that path only, not per message.
	sctx := context.WithoutCancel(b.ctx)
	b.held[i] = nil
	if !errors.Is(err, ErrStopping) && (idem.IsTerminal(err) || p.lastTry(m, a)) {
		a.SetLastTry() // FAILED whatever the Executor's failure policy
		ferr := a.Fail(sctx, err)
		if ran {
			b.leaseLost(i, a, ferr, err)
		}
		b.results[i] = Result{Action: DeadLetter, Err: errors.Join(err, ferr)}
		if ferr != nil && !errors.Is(ferr, idem.ErrLeaseLost) {
			// The failure was not stored: retry rather than lose it.
			b.results[i] = Result{Action: Retry, Delay: p.retryDelay, Err: errors.Join(err, ferr)}
		}
		return
	}
	rerr := a.Release(sctx)
	if ran {
		b.leaseLost(i, a, rerr, err)
	}
	b.results[i] = Result{Action: Retry, Delay: p.backoff(m, a), Err: errors.Join(err, rerr)}
}

// abandon settles message i, whose handler had not returned AbandonAfter
// after the batch's context was done (ErrAbandoned). The handler may
// still complete its work: neither release the key (another owner would
// run it at once, beside this one) nor store anything. Its lease ends,
// and the next owner takes the key over with a higher fence.
func (b *Batch) abandon(i int) {
	p := b.p
	a := b.held[i]
	var digest string
	if a != nil {
		digest = a.Key()
	} else {
		digest = p.Key(b.msgs[i].Key).Digest()
	}
	p.stats.abandoned.Add(1)
	p.log.Warn("consumer: handler abandoned: it had not returned "+AbandonAfter.String()+" after its context was cancelled; its goroutine runs on",
		"scope", p.scope, "key_digest", digest)
	if a == nil { // a duplicate passed on
		b.results[i] = Result{Action: Retry, Delay: p.retryDelay, Err: ErrAbandoned}
		return
	}
	_ = a.Abandon(context.WithoutCancel(b.ctx), observe.Abandoned)
	b.held[i] = nil
	b.results[i] = Result{Action: Retry, Delay: max(time.Until(a.LeaseDeadline()), time.Millisecond), Err: ErrAbandoned}
}

// lastTry reports whether m, whose key a holds, is dead-lettered if its
// handler fails: the broker will not deliver it again, or it reached the
// maximum of deliveries (counted by the broker or, when the broker's count
// was lost, by the store's acquisitions).
func (p *Processor) lastTry(m Message, a *idem.Attempt) bool {
	return m.Last || p.maxDeliveries > 0 && max(m.Deliveries, a.Attempts()) >= p.maxDeliveries
}

// backoff is the redelivery delay of m, whose key a holds, after its
// handler failed: the retry delay, doubled with each delivery after the
// first (counted as lastTry counts them) up to the maximum of
// WithRetryBackoff; the retry delay itself without one.
func (p *Processor) backoff(m Message, a *idem.Attempt) time.Duration {
	d := p.retryDelay
	if p.maxRetryDelay <= d {
		return d
	}
	for n := max(m.Deliveries, a.Attempts()); n > 1 && d < p.maxRetryDelay; n-- {
		d *= 2
	}
	return min(d, p.maxRetryDelay)
}

// passDuplicate runs h for message i, a duplicate of a COMPLETED key
// (WithPassDuplicates), with the stored result in its context.
func (b *Batch) passDuplicate(h Handler, i int) {
	p := b.p
	ctx := context.WithValue(context.WithValue(b.ctx, duplicateKey{}, b.dups[i]), resultKey{}, &resultSlot{msg: b.msgs[i], dup: true, i: i, group: b.group})
	b.runThen(ctx, h, i, p.Key(b.msgs[i].Key).Digest(), func(err error) {
		if err != nil {
			b.results[i] = Result{Action: Retry, Delay: p.retryDelay, Err: err}
		}
	})
}

// run runs h for message i and returns its error, or abandoned if it had
// not returned AbandonAfter after the batch's context was done (ctx, the
// handler's, is done by then): on a goroutine of its own, unless the
// batch's context can never be done or the caller's goroutine is the
// message's own (handleOwn; then Handle abandons it). An abandoned
// handler's goroutine runs on; its error is dropped. goexit settles the
// message, on the message's own goroutine, when h called runtime.Goexit
// there (its error wraps ErrPanic).
func (b *Batch) run(ctx context.Context, h Handler, i int, digest string, goexit func(error)) (abandoned bool, err error) {
	stop := b.ctx.Done()
	if stop == nil {
		return false, b.call(ctx, h, i, digest) // a batch that is never stopped
	}
	if b.state != nil {
		return b.runOwn(ctx, h, i, digest, goexit)
	}
	done := make(chan error, 1)
	go func() {
		returned := false
		defer func() {
			if !returned { // runtime.Goexit in h
				done <- goexitError
			}
		}()
		err := b.call(ctx, h, i, digest)
		returned = true
		done <- err
	}()
	select {
	case err := <-done:
		return false, err
	case <-stop:
	}
	t := time.NewTimer(AbandonAfter)
	defer t.Stop()
	select {
	case err := <-done:
		return false, err
	case <-t.C:
	}
	return true, nil
}

// goexitError is the error of a handler that called runtime.Goexit.
var goexitError = fmt.Errorf("%w: runtime.Goexit", ErrPanic)

// runOwn is run on the message's own goroutine (handleOwn): abandoned
// reports that Handle abandoned the handler before it returned (Handle
// settled the message: touch nothing of it). A handler that calls
// runtime.Goexit ends this goroutine: the message is settled with
// goexit on the way out, unless Handle abandoned it.
func (b *Batch) runOwn(ctx context.Context, h Handler, i int, digest string, goexit func(error)) (abandoned bool, err error) {
	b.state[i].Store(handlerRunning)
	returned := false
	defer func() {
		if !returned && b.state[i].CompareAndSwap(handlerRunning, handlerReturned) {
			goexit(goexitError)
		}
	}()
	err = b.call(ctx, h, i, digest)
	returned = true
	if !b.state[i].CompareAndSwap(handlerRunning, handlerReturned) {
		return true, nil
	}
	return false, err
}

// leaseLost calls the compensation hook for message i if endErr, the
// error of the store call that ended its attempt, says that the lease was
// lost; handlerErr is the handler's error.
func (b *Batch) leaseLost(i int, a *idem.Attempt, endErr, handlerErr error) {
	if b.p.onLeaseLost == nil || !errors.Is(endErr, idem.ErrLeaseLost) {
		return
	}
	b.p.onLeaseLost(context.WithoutCancel(b.ctx), idem.LeaseLost{Key: b.p.Key(b.msgs[i].Key), Fence: a.Lease().Fence, Err: handlerErr})
}

// call runs h for message i with p.call; with WithGatheredHandlers, a
// handler that returns without Gather leaves its batch's group.
func (b *Batch) call(ctx context.Context, h Handler, i int, digest string) error {
	defer b.group.leave(i)
	return b.p.call(ctx, h, i, digest)
}

// call runs h for message i, turning a panic into an error.
func (p *Processor) call(ctx context.Context, h Handler, i int, digest string) (err error) {
	defer func() {
		if r := recover(); r != nil {
			p.stats.panics.Add(1)
			err = fmt.Errorf("%w: %v", ErrPanic, r)
			p.log.Error("consumer: handler panicked", "scope", p.scope, "key_digest", digest, "panic", fmt.Sprint(r), "stack", string(debug.Stack()))
		}
	}()
	return h(ctx, i)
}

// completeNow completes message i's key before it returns (WithCompleteEach),
// together with the keys of the handlers that returned meanwhile: the
// first caller to find no commit call under way makes one for every
// queued key, the others wait for it.
func (b *Batch) completeNow(i int) {
	b.cmu.Lock()
	defer b.cmu.Unlock()
	if b.cdone == nil {
		b.cdone = sync.NewCond(&b.cmu)
		b.recorded = make([]bool, len(b.msgs))
	}
	b.queued = append(b.queued, i)
	for !b.recorded[i] {
		if b.flushing {
			b.cdone.Wait()
			continue
		}
		take := b.queued
		b.queued, b.flushing = nil, true
		b.cmu.Unlock()
		b.complete(context.WithoutCancel(b.ctx), take)
		b.cmu.Lock()
		for _, j := range take {
			b.recorded[j] = true
		}
		b.flushing = false
		b.cdone.Broadcast()
	}
}

// complete completes the keys of the handled messages idx with the
// processor's CommitFunc and sets their results: Ack, or Retry (the
// record decides at the redelivery) or DeadLetter (a refused effect on
// its last try) when the key could not be completed. Each message's slots
// are touched only here once its handler returned.
func (b *Batch) complete(ctx context.Context, idx []int) {
	p := b.p
	cmsgs := make([]Message, len(idx))
	catt := make([]*idem.Attempt, len(idx))
	cvals := make([][]byte, len(idx))
	for k, i := range idx {
		cmsgs[k], catt[k] = b.msgs[i], b.held[i]
		s := b.values[i]
		s.mu.Lock()
		cvals[k], s.value = s.value, nil
		s.mu.Unlock()
		b.held[i] = nil
		if p.lastTry(cmsgs[k], catt[k]) {
			catt[k].SetLastTry()
		}
	}
	for k, err := range p.commit(ctx, cmsgs, catt, cvals) {
		i := idx[k]
		b.leaseLost(i, catt[k], err, nil)
		if err != nil {
			b.results[i] = Result{Action: Retry, Delay: p.retryDelay, Err: err}
			// A refused effect (idem.SetEffect) is a failed message:
			// nothing was applied, and the Executor released the key or
			// failed it, per its policy or because this was the
			// message's last try (SetLastTry above); then the error is
			// terminal and the message dead-lettered. An effect that
			// failed after it wrote (idem.ErrEffectPartial) left its key
			// FAILED, and its error is terminal: dead-lettered at once.
			if errors.Is(err, idem.ErrEffect) && idem.IsTerminal(err) {
				b.results[i] = Result{Action: DeadLetter, Err: err}
			}
			continue
		}
		b.results[i] = Result{Action: Ack}
	}
}

// Commit completes the keys of the successful messages with the
// processor's CommitFunc (those WithCompleteEach did not complete yet),
// settles the repeats within the batch, counts and reports every
// message's decision, and returns one Result per message. A message whose
// key could not be completed (lease lost, store down) is retried: the
// record decides at its redelivery.
func (b *Batch) Commit(ctx context.Context) []Result {
	p := b.p
	var idx []int
	for i, a := range b.held {
		if a != nil && b.done[i] {
			idx = append(idx, i)
		}
	}
	if len(idx) > 0 {
		b.complete(context.WithoutCancel(ctx), idx)
	}
	for i, f := range b.follow {
		if f == 0 {
			continue
		}
		first := b.results[f-1]
		switch {
		case first.Action == Ack && b.msgs[i].Fingerprint != b.msgs[f-1].Fingerprint:
			b.results[i] = Result{Action: DeadLetter, Err: fmt.Errorf("consumer: an earlier message of the batch has the same key: %w", idem.ErrMismatch)}
		case first.Action == Ack:
			b.results[i] = Result{Action: Ack, Replayed: true}
		default:
			b.results[i] = Result{Action: Retry, Delay: max(first.Delay, time.Millisecond),
				Err: fmt.Errorf("consumer: an earlier message of the batch with the same key was not completed: %w", first.Err)}
		}
	}
	for i, r := range b.results {
		if r.Action == Retry && b.msgs[i].Last {
			// The broker will not deliver it again: dead-letter rather
			// than lose it.
			b.results[i] = Result{Action: DeadLetter, Err: fmt.Errorf("consumer: last delivery: %w", r.Err)}
		}
		p.settled(b.msgs[i], b.results[i], b.durations[i], b.invalid[i])
	}
	return b.results
}

// Abandon ends the batch without telling the store: the keys it holds stay
// IN_PROGRESS until their lease ends, as after a crash. For tests of
// adapters that simulate one.
func (b *Batch) Abandon() {
	for i, a := range b.held {
		if a != nil {
			_ = a.Abandon(context.WithoutCancel(b.ctx), observe.Abandoned)
			b.held[i] = nil
		}
	}
}

// settled counts a decision, logs it and calls the event hook.
func (p *Processor) settled(m Message, r Result, d time.Duration, invalid bool) {
	if invalid {
		p.stats.invalid.Add(1)
	}
	if m.Deliveries > 1 {
		p.stats.redelivered.Add(1)
	}
	switch {
	case r.Action == Ack && r.Replayed:
		p.stats.replayed.Add(1)
	case r.Action == Ack:
		p.stats.processed.Add(1)
	case r.Action == Retry:
		p.stats.retried.Add(1)
	case r.Action == DeadLetter:
		p.stats.dead.Add(1)
	}
	if r.Action == Ack && p.onEvent == nil {
		return // the hot path: nothing to report
	}
	digest := ""
	if m.Key != "" {
		digest = p.Key(m.Key).Digest()
	}
	switch r.Action {
	case DeadLetter:
		p.log.Warn("consumer: dead-lettered", "scope", p.scope, "key_digest", digest, "deliveries", m.Deliveries, "err", r.Err)
	case Retry:
		p.log.Debug("consumer: retry", "scope", p.scope, "key_digest", digest, "deliveries", m.Deliveries, "delay", r.Delay, "err", r.Err)
	}
	if p.onEvent != nil {
		p.onEvent(Event{Result: r, KeyDigest: digest, Deliveries: m.Deliveries, Duration: d})
	}
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

// GraceContext returns the context of an adapter's in-flight work
// (handlers, broker calls): it is not cancelled with ctx, but grace after
// ctx is done, with cause, so that a batch under way can finish when Run
// is told to stop. stop releases it (cancelling it with context.Canceled
// if it still runs); call it when Run returns.
func GraceContext(ctx context.Context, grace time.Duration, cause error) (work context.Context, stop func()) {
	work, cancel := context.WithCancelCause(context.WithoutCancel(ctx))
	stopAfter := context.AfterFunc(ctx, func() {
		t := time.AfterFunc(grace, func() { cancel(cause) })
		context.AfterFunc(work, func() { t.Stop() })
	})
	return work, func() {
		stopAfter()
		cancel(context.Canceled)
	}
}

// KeepAlive calls renew every interval until the returned stop is called:
// an adapter's broker-side counterpart of the lease heartbeat (a NATS
// InProgress, an SQS visibility change, a Redis Streams claim), so that
// the broker does not redeliver messages whose handler still runs. stop
// returns once no renew is in flight, so that a later broker call on the
// same messages is not overwritten; it may be called more than once.
func KeepAlive(interval time.Duration, renew func()) (stop func()) {
	done := make(chan struct{})
	var wg sync.WaitGroup
	wg.Go(func() {
		t := time.NewTicker(interval)
		defer t.Stop()
		for {
			select {
			case <-done:
				return
			case <-t.C:
				renew()
			}
		}
	})
	var once sync.Once
	return func() { once.Do(func() { close(done); wg.Wait() }) }
}
