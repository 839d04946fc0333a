package backend

import (
	"context"
	"runtime"
	"sync"
	"time"
)

// Coalescer sends the script calls of a store in pipelines, but only when
// calls are already in flight: a call made while none is goes out at once,
// alone, as a plain call (a lone caller waits for nothing); a call made
// while one is in flight is queued. The queue is sent as one pipeline by the
// first sender to finish, then the calls queued meanwhile, until none is
// left; or, if fewer than Senders are busy when a queue's first call comes,
// by that call's caller, which first yields its thread (runtime.Gosched)
// so that the callers ready to run queue their calls too, and then sends
// the queue as one more sender (a call found alone in its queue goes out
// as a plain call). A pipeline costs a write and a read on each side
// instead of one per call: at 64 callers, go-redis spent most of a
// lifecycle in those system calls, and rueidis, which pipelines on its own
// but writes whatever each connection holds at once, half of its CPU.
//
// Before the yield, the call that found a sender free went out alone at
// once: at 64 callers, the first caller woken by a pipeline's replies took
// the free sender for a call of its own for a whole round trip, while the
// callers woken with it queued behind. With rueidis under load, as many
// calls went alone as pipelines went out (BENCHMARKS.md, "The lifecycle
// target's last 0.4%").
//
// A queued call waits at most MaxQueueWait: if no call in flight returned
// by then, the queue is sent at once by one more sender. One timer per
// queue, armed when the queue's first call comes and stopped when a sender
// takes the queue, bounds that wait for all of its calls: a timer per call
// cost the client as much CPU as a system call per call.
//
// go-redis v9.23's own AutoPipeline (experimental) does the same with one
// batch in flight; in place of the coalescer it measured slower, in
// BenchmarkLifecycle/go-redis (3 interleaved rounds, 100,000 lifecycles
// each): 47–53 µs/op at 64 callers against 56–66 (half duplex) and 53–60
// (full duplex), and 334–380 µs/op at 1 caller against 460–489.
//
// A queued call whose context ends returns the context's error; if it was
// sent already, its outcome is unknown, as for any call whose reply did not
// come back in time. A queued call whose context ended before its pipeline
// was sent is not sent.
//
// A queued call costs no allocation once the coalescer is warm: the calls
// (with their wake-up channels) are reused once their caller has read the
// reply, and the queue's backing array once its pipeline was sent. With
// the hybrid commit gate at 64 callers most calls are queued (about 1.7 a
// key), and each cost two allocations, plus the queue's growth and a slice
// of the live calls per pipeline.
type Coalescer struct {
	Senders int
	// one sends one call and returns its reply; many sends calls as one
	// pipeline and sets each call's reply and err.
	One  func(ctx context.Context, s *Script, keys, args []string, fcall bool) (any, error)
	Many func(ctx context.Context, calls []*QueuedCall)
	// Lone, if set, sends a call made while none is in flight in place of
	// One: a client whose shared connection hands every call to goroutines
	// of its own can send a lone call on a connection the caller writes
	// and reads itself.
	Lone func(ctx context.Context, s *Script, keys, args []string, fcall bool) (any, error)

	mu       sync.Mutex
	active   int
	queue    []*QueuedCall
	spare    []*QueuedCall // a sent queue's backing array, for the next queue
	queuedAt time.Time     // when the queue's first call came
	late     *time.Timer   // sendLate, MaxQueueWait after queuedAt
}

// QueuedCall is a call the coalescer queued: Many sends S with Keys and
// Args (FCALL when Fcall) and sets Reply and Err.
type QueuedCall struct {
	ctx        context.Context
	S          *Script
	Keys, Args []string
	Fcall      bool
	Reply      any
	Err        error
	done       chan struct{} // one value when Reply and Err are set
}

// queuedCalls holds the calls whose caller read the reply. A call whose
// caller left on its context's end is not put back: the sender may still
// set its reply.
var queuedCalls = sync.Pool{New: func() any { return &QueuedCall{done: make(chan struct{}, 1)} }}

// CoalesceSenders is the number of calls a store sends at once before it
// queues the next ones.
const CoalesceSenders = 2

// MaxQueueWait bounds how long a queued call waits for a call in flight to
// return: past it, the queue is sent at once by one more sender, so that a
// slow network or server does not delay every queued call by a whole round
// trip of the calls before it.
//
// It is longer than a deep pipeline takes on a busy server: at 64 callers
// the senders' pipelines carry 15–30 calls each, which Redis runs one after
// the other in a few hundred µs. At 250 µs the timer fired for most queues
// although the calls in flight were about to return, and the extra
// senders split the calls into shallower pipelines that cost Redis and the
// client more CPU per call. With go-redis at 64 callers, at 250 µs: 14
// calls per read of the server, 23.9 µs of Redis CPU and 12.7 µs of
// client CPU per lifecycle; at 1 ms: 18, 19.3 and 10.3 (BENCHMARKS.md,
// "The coalescer's queue wait"). A lone caller never queues: its calls do
// not see this wait.
var MaxQueueWait = time.Millisecond // a variable for tests

// Run runs one call: at once and alone if no call is in flight, else
// queued; the caller of a queue's first call sends the queue if a sender is
// free.
func (q *Coalescer) Run(ctx context.Context, s *Script, keys, args []string, fcall bool) (any, error) {
	q.mu.Lock()
	if q.active == 0 {
		q.active++
		q.mu.Unlock()
		send := q.One
		if q.Lone != nil {
			send = q.Lone
		}
		v, err := send(ctx, s, keys, args, fcall)
		q.drain()
		return v, err
	}
	call := queuedCalls.Get().(*QueuedCall)
	call.ctx, call.S, call.Keys, call.Args, call.Fcall = ctx, s, keys, args, fcall
	if len(q.queue) == 0 {
		q.queuedAt = time.Now()
		q.armLate(MaxQueueWait)
		if q.queue == nil {
			q.queue, q.spare = q.spare, nil
		}
	}
	q.queue = append(q.queue, call)
	lead := len(q.queue) == 1 && q.active < q.Senders
	if lead {
		q.active++
	}
	q.mu.Unlock()
	if lead {
		// The callers woken with this one by the same replies are
		// runnable: let them queue their calls before the queue goes.
		runtime.Gosched()
		q.drain()
	}
	if done := ctx.Done(); done != nil {
		select {
		case <-call.done:
		case <-done:
			return nil, ctx.Err()
		}
	} else {
		<-call.done
	}
	v, err := call.Reply, call.Err
	*call = QueuedCall{done: call.done}
	queuedCalls.Put(call)
	return v, err
}

// armLate starts the queue's timer, to run sendLate after d; q.mu is held.
func (q *Coalescer) armLate(d time.Duration) {
	if q.late == nil {
		q.late = time.AfterFunc(d, q.sendLate)
		return
	}
	q.late.Reset(d)
}

// sendLate runs when the queue's timer fires: if the queue's first call
// has waited MaxQueueWait, the calls in flight are slow (a slow network, a
// busy server); the queue is sent now, as one more sender, instead of
// after them. A timer that fires for a queue taken meanwhile finds the
// queue empty, or younger than MaxQueueWait and is armed again for it.
func (q *Coalescer) sendLate() {
	q.mu.Lock()
	if len(q.queue) == 0 {
		q.mu.Unlock()
		return
	}
	if wait := MaxQueueWait - time.Since(q.queuedAt); wait > 0 {
		q.armLate(wait)
		q.mu.Unlock()
		return
	}
	batch := q.take()
	q.active++
	q.mu.Unlock()
	q.send(batch)
	q.drain()
}

// take empties the queue and returns its calls; q.mu is held.
func (q *Coalescer) take() []*QueuedCall {
	batch := q.queue
	if len(batch) == 0 {
		return nil
	}
	q.queue = nil
	q.late.Stop()
	return batch
}

// drain sends the queued calls until none is left, then frees the
// caller's sender slot.
func (q *Coalescer) drain() {
	for {
		q.mu.Lock()
		batch := q.take()
		if len(batch) == 0 {
			q.active--
			q.mu.Unlock()
			return
		}
		q.mu.Unlock()
		q.send(batch)
	}
}

// send sends the live calls of batch as one pipeline (a single one as a
// plain call) and wakes each call, then keeps batch's backing array for a
// later queue.
func (q *Coalescer) send(batch []*QueuedCall) {
	ctx := context.Background() // the client's read and write timeouts apply
	live := batch[:0]           // the calls are taken out of batch in order, in place
	for _, c := range batch {
		if err := c.ctx.Err(); err != nil {
			c.Err = err
			c.done <- struct{}{}
			continue
		}
		live = append(live, c)
	}
	switch len(live) {
	case 0:
	case 1:
		c := live[0]
		c.Reply, c.Err = q.One(ctx, c.S, c.Keys, c.Args, c.Fcall)
		c.done <- struct{}{}
	default:
		q.Many(ctx, live)
		for _, c := range live {
			c.done <- struct{}{} // the caller may reuse c from here on
		}
	}
	clear(batch)
	q.mu.Lock()
	if q.spare == nil {
		q.spare = batch[:0]
	}
	q.mu.Unlock()
}

// Queued returns the number of calls queued (tests).
func (q *Coalescer) Queued() int {
	q.mu.Lock()
	defer q.mu.Unlock()
	return len(q.queue)
}
