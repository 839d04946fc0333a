package consumer

import (
	"context"
	"errors"
	"sync"
)

// ErrNotGathered is Gather's error for a context that is not the handler's
// of a batch with WithGatheredHandlers, or whose handler called Gather
// before or left its batch's group (it was abandoned).
var ErrNotGathered = errors.New("consumer: the handler's batch does not gather its handlers")

// gather is the group of a batch's handlers (WithGatheredHandlers): every
// handler that is to run either joins it (Gather) or leaves it (returns
// without joining, or does not start); once none is pending, one joiner
// runs the group's function for all of them: the last to arrive if it
// joined, or else the one that takes the token the last to leave sends
// (run). The other joiners wait for done alone, so each parks once.
type gather struct {
	mu      sync.Mutex
	pending int
	joined  int
	state   []uint8 // per message: 0 pending (or not a member), 1 joined, 2 left
	ctxs    []context.Context
	items   []any
	run     chan struct{} // one token for a joiner to run f when a leave was last
	done    chan struct{} // closed once f returned
	// Set by the runner, under mu.
	index  []int                   // per message: its index among the joined ones
	cancel context.CancelCauseFunc // f's context's
	cause  error                   // a joiner's context done before f started
	value  any
}

// gather makes the batch's group of handlers and returns how many run at
// once: all of them.
func (b *Batch) gather() int {
	g := &gather{state: make([]uint8, len(b.msgs)), ctxs: make([]context.Context, len(b.msgs)), items: make([]any, len(b.msgs)),
		run: make(chan struct{}, 1), done: make(chan struct{})}
	for i := range b.msgs {
		if !b.toRun(i) {
			g.state[i] = 2
			continue
		}
		g.pending++
		if b.values[i] != nil {
			b.values[i].group = g
		}
	}
	b.group = g
	return g.pending
}

// leave counts message i's handler out of the group unless it joined; the
// last to arrive hands the run to a joiner, if any joined.
func (g *gather) leave(i int) {
	if g == nil {
		return
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.state[i] == 0 {
		g.state[i] = 2
		if g.pending--; g.pending == 0 && g.joined > 0 {
			g.run <- struct{}{}
		}
	}
}

// stop cancels f's context with cause, or has the runner cancel it as f
// starts.
func (g *gather) stop(cause error) {
	g.mu.Lock()
	cancel := g.cancel
	if cancel == nil && g.cause == nil {
		g.cause = cause
	}
	g.mu.Unlock()
	if cancel != nil {
		cancel(cause)
	}
}

// Gather serves the messages of a batch together (WithGatheredHandlers):
// the handler of each message calls it with its own context and what it
// contributes (item); once every handler of the batch that runs has
// called it or returned (or did not start: its lease was lost, the
// consumer stops), f runs once, on one of them, with the callers'
// contexts and items in the batch's order, and Gather returns f's value
// to every caller with the caller's index in ctxs. Each handler then
// returns its own message's error, which the Processor decides as usual.
// f's ctx is cancelled, with the cause, as soon as any caller's context
// is done (a lease lost cancels that handler's context only: so no
// handler goes on past its lease in the shared work), and once f
// returned; it carries ctxs[0]'s values. The callers waiting for f watch
// their own contexts for it, so a batch's shared call costs no hook per
// message. Gather waits for the other handlers without regard to ctx. It
// returns ErrNotGathered for a context that is not a gathered handler's,
// or a second call with one.
func Gather(ctx context.Context, item any, f func(ctx context.Context, ctxs []context.Context, items []any) any) (v any, me int, err error) {
	s, ok := ctx.Value(resultKey{}).(*resultSlot)
	if !ok || s.group == nil {
		return nil, 0, ErrNotGathered
	}
	g := s.group
	g.mu.Lock()
	if g.state[s.i] != 0 {
		g.mu.Unlock()
		return nil, 0, ErrNotGathered
	}
	g.state[s.i], g.ctxs[s.i], g.items[s.i] = 1, ctx, item
	g.joined++
	g.pending--
	runner := g.pending == 0
	g.mu.Unlock()
	stopped := ctx.Done()
	for !runner {
		select {
		case <-g.done:
			return g.value, g.index[s.i], nil
		case <-g.run:
			runner = true
		case <-stopped:
			g.stop(context.Cause(ctx))
			stopped = nil
		}
	}
	g.mu.Lock()
	g.index = make([]int, len(g.state))
	ctxs := make([]context.Context, 0, g.joined)
	items := make([]any, 0, g.joined)
	for i, st := range g.state {
		if st == 1 {
			g.index[i] = len(ctxs)
			ctxs, items = append(ctxs, g.ctxs[i]), append(items, g.items[i])
		}
	}
	shared, cancel := context.WithCancelCause(context.WithoutCancel(ctxs[0]))
	g.cancel = cancel
	if g.cause != nil {
		cancel(g.cause)
	}
	g.mu.Unlock()
	stop := context.AfterFunc(ctx, func() { cancel(context.Cause(ctx)) })
	g.value = f(shared, ctxs, items)
	stop()
	cancel(nil)
	close(g.done)
	return g.value, g.index[s.i], nil
}
