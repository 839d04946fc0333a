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
// without joining, or does not start); once none is pending, the first
// joiner runs the group's function for all of them.
type gather struct {
	mu      sync.Mutex
	pending int
	state   []uint8 // per message: 0 pending (or not a member), 1 joined, 2 left
	ctxs    []context.Context
	items   []any
	ready   chan struct{}
	once    sync.Once
	members []int // the joined messages' indexes, in the batch's order
	value   any
}

// gather makes the batch's group of handlers and returns how many run at
// once: all of them.
func (b *Batch) gather() int {
	g := &gather{state: make([]uint8, len(b.msgs)), ctxs: make([]context.Context, len(b.msgs)), items: make([]any, len(b.msgs)), ready: make(chan struct{})}
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
	if g.pending == 0 {
		close(g.ready)
	}
	b.group = g
	return g.pending
}

// leave counts message i's handler out of the group unless it joined.
func (g *gather) leave(i int) {
	if g == nil {
		return
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.state[i] == 0 {
		g.state[i] = 2
		g.arrived()
	}
}

// arrived counts one member joined or left; g.mu is held.
func (g *gather) arrived() {
	if g.pending--; g.pending == 0 {
		close(g.ready)
	}
}

// Gather serves the messages of a batch together (WithGatheredHandlers):
// the handler of each message calls it with its own context and what it
// contributes (item); once every handler of the batch that runs has
// called it or returned (or did not start: its lease was lost, the
// consumer stops), f runs once, on one of them, with the callers'
// contexts and items in the batch's order, and Gather
// returns f's value to every caller with the caller's index in ctxs.
// Each handler then returns its own message's error, which the Processor
// decides as usual. f must cover every context (a lease lost cancels that
// handler's context only: cancel the shared work with it, so that no
// handler goes on past its lease). Gather waits for the other handlers
// without regard to ctx. It returns ErrNotGathered for a context that is
// not a gathered handler's, or a second call with one.
func Gather(ctx context.Context, item any, f func(ctxs []context.Context, items []any) any) (v any, me int, err error) {
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
	g.arrived()
	g.mu.Unlock()
	<-g.ready
	g.once.Do(func() {
		ctxs := make([]context.Context, 0, len(g.state))
		items := make([]any, 0, len(g.state))
		for i, st := range g.state {
			if st == 1 {
				g.members = append(g.members, i)
				ctxs, items = append(ctxs, g.ctxs[i]), append(items, g.items[i])
			}
		}
		g.value = f(ctxs, items)
	})
	for k, i := range g.members {
		if i == s.i {
			me = k
		}
	}
	return g.value, me, nil
}
