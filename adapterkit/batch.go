package adapterkit

import (
	"context"

	"github.com/idemgo/idem"
	"github.com/idemgo/idem/storekit"
)

// Began is the outcome of one key of BeginBatch: what Begin returns.
type Began struct {
	Ctx     context.Context
	Attempt *idem.Attempt
	Err     error
}

// BeginBatch is e.Begin for many keys at once: on a storekit.BatchStore
// the acquisitions go in one pipeline. Each key gets the outcome Begin
// would give it; a key that appears twice is acquired once, the second
// gets an *idem.InProgressError. fingerprints must have one entry per
// key. As Begin, it repeats the acquisitions whose outcome is unknown a
// few times within about 70ms.
func BeginBatch(ctx context.Context, e *idem.Executor, keys []idem.Key, fingerprints []string) []Began {
	out := make([]Began, len(keys))
	funcs.BeginBatch(e, ctx, keys, fingerprints, func(i int, ctx context.Context, a *idem.Attempt, err error) {
		out[i] = Began{ctx, a, err}
	})
	return out
}

// CommitBatch is Attempt.Commit for many attempts of e at once: on a
// storekit.BatchStore the completions go in one pipeline, those of
// attempts with an effect too on a storekit.EffectBatchStore. It returns
// one error per attempt, with Commit's meaning; a nil or replayed attempt
// gets nil. values must have one entry per attempt; the store does not
// keep them.
func CommitBatch(ctx context.Context, e *idem.Executor, attempts []*idem.Attempt, values [][]byte) []error {
	return funcs.CommitBatch(e, ctx, attempts, values)
}

// CommitBatchWith is CommitBatch with the store call made by complete, for
// a store call that does more in the same atomic step as the completions
// (redisstore's CompleteAndAckBatch acknowledges a stream entry with each
// one). The Executor checks sizes, encodes the values, ends the attempts
// and repeats, with the same arguments, the elements of complete's answer
// whose outcome is unknown (storekit.OutcomeUnknown), for up to one lease,
// as Commit does. complete must answer one error per element of cs with
// the meaning of Store.Complete's, and must be safe to call again with a
// subset of the completions it was given. A value over the size limit is
// committed with Commit (which fails the key) without complete. An
// attempt's effect is in its storekit.BatchCompletion; when complete
// answers that it failed (idem.ErrEffect), the attempt ends as Commit's
// does then: released or FAILED per the failure policy, or already FAILED
// by the store (idem.ErrEffectPartial). CommitBatchWith returns one error
// per attempt; a nil or replayed attempt gets nil.
func CommitBatchWith(ctx context.Context, e *idem.Executor, attempts []*idem.Attempt, values [][]byte, complete func(ctx context.Context, cs []storekit.BatchCompletion) []error) []error {
	return funcs.CommitBatchWith(e, ctx, attempts, values, complete)
}
