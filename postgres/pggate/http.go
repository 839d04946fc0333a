package pggate

import (
	"context"
	"net/http"

	"github.com/idemgo/idem"
	"github.com/idemgo/idem/idemhttp"
	"github.com/idemgo/idem/postgres/internal/pgq"
)

// HTTP returns a handler, to put under an idemhttp middleware on the
// gate's Executor, that runs h with a transaction and commits h's effect
// and its response through the gate: exactly one run per key commits its
// effect, and its response is the one every retry gets.
//
// h writes its response as usual and makes its effect through tx; it must
// neither commit nor roll back tx. The response is only known once h
// returns, so the gate registers itself with the middleware
// (idemhttp.SetRecorder) and the middleware, once it has captured the
// response and its policy says to store it, hands the encoded response to
// the gate, which inserts the completion row holding that response in tx
// and commits, then writes the completion into the store (the relay
// repairs it later if that fails). The client gets the response only after
// the commit. So:
//
//   - A retry whose record the store holds gets the stored response from
//     Redis without running h.
//   - If the store does not know of the commit (the process died after
//     it, Redis lost the record), the retry runs h, its completion insert
//     conflicts, its transaction (its effect) is rolled back, and the
//     client gets the committed response, replayed.
//   - A response the middleware does not store (the policy releases or
//     abandons the key, the response is over the limit, h panics) rolls
//     tx back: its effect does not commit either. With
//     idemhttp.ReleaseServerErrors, a 5xx rolls back and releases the key.
//   - If Postgres fails at the commit, the client gets 503 (outcome
//     unknown) and the key is released: a retry finds the committed
//     response, or runs h again, never both.
//
// A request that reaches HTTP without the middleware's attempt gets 500
// (ErrNoAttempt); one for which no transaction can begin gets 503, which
// releases the key. Do not stream from h: a streamed response reaches the
// client before the commit.
func (g *Gate[T]) HTTP(h func(w http.ResponseWriter, r *http.Request, tx T)) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		ctx := r.Context()
		a, ok := idem.AttemptFrom(ctx)
		if !ok {
			g.cfg.log.Error("pggate: HTTP handler outside idemhttp's middleware", "error", ErrNoAttempt)
			http.Error(w, ErrNoAttempt.Error(), http.StatusInternalServerError)
			return
		}
		tx, handle, err := g.db.Begin(ctx)
		if err != nil {
			g.cfg.log.Warn("pggate: begin", "error", err)
			http.Error(w, "pggate: the database is unavailable; retry with the same idempotency key", http.StatusServiceUnavailable)
			return
		}
		rec := &recorder[T]{g: g, a: a, tx: tx}
		if err := idemhttp.SetRecorder(ctx, rec); err != nil {
			_ = tx.Rollback(context.WithoutCancel(ctx))
			g.cfg.log.Error("pggate: HTTP handler", "error", err)
			http.Error(w, err.Error(), http.StatusInternalServerError)
			return
		}
		h(w, r, handle)
	})
}

// recorder commits a request's transaction with its response.
type recorder[T any] struct {
	g  *Gate[T]
	a  *idem.Attempt
	tx pgq.Tx
}

// Record implements idemhttp.Recorder.
func (r *recorder[T]) Record(ctx context.Context, response []byte) ([]byte, error) {
	res, err := r.g.commit(ctx, ctx, r.a, r.tx, idem.Result{Value: response})
	if err != nil {
		return nil, err
	}
	if res.Replayed {
		return res.Value, nil
	}
	return nil, nil
}

// Discard implements idemhttp.Recorder.
func (r *recorder[T]) Discard(ctx context.Context) {
	if err := r.tx.Rollback(ctx); err != nil {
		r.g.cfg.log.Debug("pggate: rollback", "error", err)
	}
}
