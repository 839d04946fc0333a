package idemhttp

import (
	"context"
	"errors"
)

// Recorder commits a handler's own effect together with its response, in
// place of the middleware's completion: the Postgres commit gate
// (github.com/idemgo/idem/postgres/pggate, Gate.HTTP) is one, which makes
// a handler's database writes and its stored response commit in one
// transaction. A handler registers it with SetRecorder; the middleware
// then calls exactly one of its methods once the handler has returned.
type Recorder interface {
	// Record is called when the response is to be stored (the Policy said
	// StoreResponse and the response is within the limits), with the
	// response as the middleware stores it (see adapterkit.EncodeResult for
	// its stored form). It commits the effect with the response and ends
	// the key's attempt (idem.AttemptFrom), as Commit would. If a response
	// was already recorded for the key (by an earlier run whose completion
	// the store lost), it rolls back and returns that response as stored:
	// the client gets it as a replay. An error means that the response was
	// not recorded and the attempt was ended: the client gets 503 (outcome
	// unknown, as when the middleware's own completion fails).
	Record(ctx context.Context, response []byte) (stored []byte, err error)
	// Discard is called instead when the response is not stored (the key
	// is released or abandoned, the response is over the limit, the
	// handler panicked, the connection was hijacked): it rolls the effect
	// back. The middleware ends the attempt.
	Discard(ctx context.Context)
}

// ErrNoMiddleware is returned by SetRecorder outside a request that the
// middleware runs with its key held.
var ErrNoMiddleware = errors.New("idemhttp: SetRecorder outside a request that the middleware runs with its key held")

// recorderKey is the context key of a request's recorder slot.
type recorderKey struct{}

// recorderCtx is the context the handler runs with: it carries the slot of
// a Recorder without an allocation of its own (it lives with the capture
// writer).
type recorderCtx struct {
	context.Context
	rec Recorder
}

func (c *recorderCtx) Value(key any) any {
	if key == (recorderKey{}) {
		return c
	}
	return c.Context.Value(key)
}

// SetRecorder registers rec for the request that runs with ctx (the
// handler's request context, or one derived from it): the middleware
// hands the response to rec instead of completing the key itself (see
// Recorder). It returns ErrNoMiddleware outside the middleware's handler,
// and an error if a recorder is already set. A streamed response (see
// httpkit.StreamOnFlush) reaches the client, all but its end, before Record
// commits it, and is aborted if Record fails or returns another run's
// response: do not stream from a handler with a recorder.
func SetRecorder(ctx context.Context, rec Recorder) error {
	c, ok := ctx.Value(recorderKey{}).(*recorderCtx)
	switch {
	case !ok:
		return ErrNoMiddleware
	case rec == nil:
		return invalidf("nil recorder")
	case c.rec != nil:
		return invalidf("a recorder is already set for this request")
	}
	c.rec = rec
	return nil
}
