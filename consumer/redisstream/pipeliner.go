package redisstream

import (
	"context"
	"sync"

	"github.com/idemgo/idem"
	"github.com/idemgo/idem/redisstore"
)

// pipeliner is the store of a Consumer's Executor: a redisstore.Store whose
// concurrent Acquire calls are sent together with AcquireBatch, so that the
// concurrent Begin calls of a batch cost about two round trips instead of
// one each. The first caller sends its own request at once; the calls that
// arrive meanwhile wait and go in the next pipeline, sent by the same
// caller as soon as the previous one returned (natural batching: no timer,
// no added latency for a lone call). All other methods are the store's.
type pipeliner struct {
	*redisstore.Store

	mu    sync.Mutex
	queue []*acquireCall
	busy  bool
}

type acquireCall struct {
	key  string
	req  idem.AcquireRequest
	acq  idem.Acquisition
	err  error
	done chan struct{}
}

var _ idem.Store = (*pipeliner)(nil)

// Acquire implements idem.Store. A waiting call is sent with the context
// of the caller that sends the pipeline (within a Consumer, the same
// context).
func (p *pipeliner) Acquire(ctx context.Context, key string, req idem.AcquireRequest) (idem.Acquisition, error) {
	call := &acquireCall{key: key, req: req, done: make(chan struct{})}
	p.mu.Lock()
	p.queue = append(p.queue, call)
	if p.busy {
		p.mu.Unlock()
		select {
		case <-call.done:
			return call.acq, call.err
		case <-ctx.Done():
			// The call may still be sent; a lost acquisition expires with
			// its lease, as after a lost reply.
			return idem.Acquisition{}, ctx.Err()
		}
	}
	p.busy = true
	for len(p.queue) > 0 {
		calls := p.queue
		p.queue = nil
		p.mu.Unlock()
		p.send(ctx, calls)
		p.mu.Lock()
	}
	p.busy = false
	p.mu.Unlock()
	return call.acq, call.err
}

func (p *pipeliner) send(ctx context.Context, calls []*acquireCall) {
	keys := make([]string, len(calls))
	reqs := make([]idem.AcquireRequest, len(calls))
	for i, c := range calls {
		keys[i], reqs[i] = c.key, c.req
	}
	acqs, errs := p.AcquireBatch(ctx, keys, reqs)
	for i, c := range calls {
		c.acq, c.err = acqs[i], errs[i]
		close(c.done)
	}
}
