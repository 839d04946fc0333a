package idem

import "context"

type leaseKey struct{}

// leaseCtx carries an attempt's lease. It is one allocation instead of the
// two of context.WithValue with a struct value.
type leaseCtx struct {
	context.Context
	lease Lease
	a     *Attempt // for SetEffect
}

func (c *leaseCtx) Value(key any) any {
	if key == (leaseKey{}) {
		return c
	}
	return c.Context.Value(key)
}

// LeaseFrom returns the lease of the attempt that runs with ctx: the owner
// token and the fencing token. ok is false outside an attempt.
func LeaseFrom(ctx context.Context) (l Lease, ok bool) {
	c, ok := ctx.Value(leaseKey{}).(*leaseCtx)
	if !ok {
		return Lease{}, false
	}
	return c.lease, true
}

// FenceFrom returns the fencing token of the attempt that runs with ctx. Pass
// it to side effects that can reject stale writers, for example
// "UPDATE accounts SET ..., fence = $1 WHERE id = $2 AND fence < $1".
// ok is false outside an attempt.
func FenceFrom(ctx context.Context) (fence int64, ok bool) {
	l, ok := LeaseFrom(ctx)
	return l.Fence, ok
}

// AttemptFrom returns the attempt that runs with ctx: the one whose
// operation got ctx (or a context derived from it) from Do, Typed.Do,
// Begin, adapterkit.BeginBatch or a consumer.Processor. It is for code that must
// record the attempt's completion elsewhere too (the Postgres commit gate,
// github.com/idemgo/idem/postgres/pggate, inside a consumer handler or an
// idemhttp handler); the attempt is ended by whoever began it. ok is false
// outside an attempt.
func AttemptFrom(ctx context.Context) (a *Attempt, ok bool) {
	c, ok := ctx.Value(leaseKey{}).(*leaseCtx)
	if !ok || c.a == nil {
		return nil, false
	}
	return c.a, true
}
