package redisstore

import (
	"context"
	_ "embed"
	"fmt"
	"strconv"
	"time"

	"github.com/idemgo/idem"
	"github.com/idemgo/idem/redisstore/internal/backend"
	"github.com/idemgo/idem/storekit"
	"github.com/idemgo/idem/storekit/statemachine"
)

var (
	//go:embed lua/complete_ack.lua
	completeAckSrc string
	//go:embed lua/complete_ack_many.lua
	completeAckManySrc string
	//go:embed lua/dead_letter.lua
	deadLetterSrc string

	completeAckScript     = newScript("complete_ack", completeLib+completeAckSrc)
	completeAckManyScript = newScript("complete_ack_many", completeLib+completeAckManySrc)
	deadLetterScript      = newScript("dead_letter", deadLetterSrc)
)

// errBatchWait is returned by the pipelined calls of a store configured
// with WithWait or WithWaitAOF.
var errBatchWait = fmt.Errorf("%w: pipelined calls do not support WithWait or WithWaitAOF", idem.ErrInvalid)

// evalCall is one script call of a pipeline.
type evalCall = backend.Call

// runMulti runs calls of sc in one pipeline. In Functions mode, the calls
// that found a node without the library are made again once it is loaded.
func (s *Store) runMulti(ctx context.Context, sc *script, calls []evalCall) ([]any, []error) {
	replies, errs := s.b.RunMulti(ctx, &sc.Script, calls, s.fcall)
	if s.fcall {
		var again []int
		for i, err := range errs {
			if functionNotFound(err) {
				again = append(again, i)
			}
		}
		if len(again) > 0 {
			if lerr := s.load(ctx, sc.lib); lerr != nil {
				for _, i := range again {
					errs[i] = lerr
				}
			} else {
				r2, e2 := s.b.RunMulti(ctx, &sc.Script, subset(calls, again), s.fcall)
				for k, i := range again {
					replies[i], errs[i] = r2[k], e2[k]
				}
			}
		}
	}
	for i, err := range errs {
		if err != nil {
			errs[i] = fmt.Errorf("redisstore: %s: %w", sc.Name, err)
		}
	}
	return replies, errs
}

// subset returns the elements of s at the indices idx, in that order.
func subset[T any](s []T, idx []int) []T {
	out := make([]T, len(idx))
	for k, i := range idx {
		out[k] = s[i]
	}
	return out
}

// AcquireBatch runs Acquire for every keys[i] with reqs[i], in one script
// call per 128 keys where the keys may share a script, otherwise in one
// pipeline of one-key scripts (on a Cluster, one per node; see Batches in
// the package documentation), and returns one Acquisition and one error
// per key, with the same meaning as Acquire's. Keys may repeat: their calls
// run in order. Invalid input fails that key only, before anything is
// sent. A store configured with WithWait or WithWaitAOF refuses batches
// (every error wraps idem.ErrInvalid): use Acquire. It is safe for
// concurrent use.
func (s *Store) AcquireBatch(ctx context.Context, keys []string, reqs []storekit.AcquireRequest) ([]storekit.Acquisition, []error) {
	out := make([]storekit.Acquisition, len(keys))
	errs := make([]error, len(keys))
	if len(reqs) != len(keys) {
		for i := range errs {
			errs[i] = fmt.Errorf("%w: %d keys and %d requests", idem.ErrInvalid, len(keys), len(reqs))
		}
		return out, errs
	}
	calls := make([]evalCall, 0, len(keys))
	idx := make([]int, 0, len(keys))
	for i, key := range keys {
		if s.wait != nil {
			errs[i] = errBatchWait
			continue
		}
		if err := storekit.ValidateStoreKey(key); err != nil {
			errs[i] = err
			continue
		}
		req := reqs[i]
		if err := req.Validate(); err != nil {
			errs[i] = err
			continue
		}
		keys, args := acquireCall(s.Key(key), req)
		calls = append(calls, evalCall{Keys: keys, Args: args})
		idx = append(idx, i)
	}
	if len(calls) == 0 {
		return out, errs
	}
	replies, rerrs := s.runBatch(ctx, acquireScript, acquireManyScript, calls, packAcquire)
	for j, i := range idx {
		if rerrs[j] != nil {
			errs[i] = rerrs[j]
			continue
		}
		a, err := parseAcquire(replies[j])
		if err != nil {
			errs[i] = err
			continue
		}
		if a.Outcome == storekit.Acquired || a.Outcome == storekit.TakenOver {
			a.Lease.Owner = reqs[i].Owner
		}
		out[i] = a
	}
	return out, errs
}

// StreamAck is one message of CompleteAndAckBatch: the record to complete
// and the stream entry to acknowledge with it.
type StreamAck struct {
	// Key is the store key (the digest of the idempotency key).
	Key string
	// Lease is the acquisition being completed.
	Lease storekit.Lease
	// Result is the result blob to store, as the Executor encodes it.
	Result []byte
	// ID is the stream entry ID.
	ID string
	// Effect, if not nil, is applied in the same call, after the owner and
	// fence check and before the COMPLETED write and the XACK (see
	// WithEffect and Store.CompleteEffect): the attempt's effect, from
	// idem.Attempt.Effect.
	Effect *storekit.Effect
}

// CompleteAndAck does what Complete does and, in the same Lua script,
// acknowledges the entry id of stream in the consumer group (XACK): either
// both happen or neither does, so no crash can fall between completing a
// key and acknowledging its message. stream must share the store's hash tag
// (see WithHashTag and CheckStream). It returns an error wrapping
// idem.ErrLeaseLost, and acknowledges nothing, when the caller no longer
// owns the record. Repeating a call that succeeded succeeds again. A store
// configured with WithWait or WithWaitAOF refuses it (idem.ErrInvalid). It
// is safe for concurrent use.
func (s *Store) CompleteAndAck(ctx context.Context, key string, lease storekit.Lease, result []byte, retention time.Duration, stream, group, id string) error {
	return s.CompleteAndAckBatch(ctx, stream, group, retention, []StreamAck{{Key: key, Lease: lease, Result: result, ID: id}})[0]
}

// CompleteAndAckBatch runs CompleteAndAck for every element of acks, as
// CompleteBatch runs Complete, and returns one error per element (nil:
// completed and acknowledged). An element with an Effect is completed,
// with its effect, and acknowledged in one call of its effect's script; a
// failed effect gives an *storekit.EffectError and acknowledges nothing. It is
// safe for concurrent use.
func (s *Store) CompleteAndAckBatch(ctx context.Context, stream, group string, retention time.Duration, acks []StreamAck) []error {
	errs := make([]error, len(acks))
	retentionErr := storekit.ValidateDuration("retention", retention)
	calls := make([]evalCall, 0, len(acks))
	idx := make([]int, 0, len(acks))
	var effects []int
	for i, a := range acks {
		if s.wait != nil {
			errs[i] = errBatchWait
			continue
		}
		if err := s.checkStreamArgs(stream, group, a.ID); err != nil {
			errs[i] = err
			continue
		}
		if err := statemachine.CheckLease(a.Key, a.Lease); err != nil {
			errs[i] = err
			continue
		}
		if retentionErr != nil {
			errs[i] = retentionErr
			continue
		}
		if a.Effect != nil {
			effects = append(effects, i)
			continue
		}
		calls = append(calls, evalCall{
			Keys: []string{s.Key(a.Key), stream},
			Args: []string{a.Lease.Owner, strconv.FormatInt(a.Lease.Fence, 10), string(a.Result), ms(retention), s.pub, s.channel(a.Key), group, a.ID},
		})
		idx = append(idx, i)
	}
	s.runOKBatch(ctx, completeAckScript, completeAckManyScript, packCompleteAck, calls, idx, errs)
	if len(effects) > 0 {
		s.completeAckEffects(ctx, stream, group, retention, acks, effects, errs)
	}
	return errs
}

// DeadLetter copies the pending entry id of stream to the stream dlq, with
// the given fields (field, value, …), and acknowledges it in the consumer
// group, in one Lua script. An entry that is no longer pending (another
// consumer acknowledged or dead-lettered it) is left alone and DeadLetter
// reports false. dlq must share the stream's hash tag on a Cluster. It is
// safe for concurrent use.
func (s *Store) DeadLetter(ctx context.Context, stream, group, id, dlq string, fields []string) (bool, error) {
	if err := s.checkStreamArgs(stream, group, id); err != nil {
		return false, err
	}
	if dlq == "" || len(fields) == 0 || len(fields)%2 != 0 {
		return false, fmt.Errorf("%w: dead letter needs a stream and field, value pairs", idem.ErrInvalid)
	}
	args := make([]string, 0, 2+len(fields))
	args = append(args, group, id)
	args = append(args, fields...)
	replies, errs := s.runMulti(ctx, deadLetterScript, []evalCall{{Keys: []string{stream, dlq}, Args: args}})
	if errs[0] != nil {
		return false, errs[0]
	}
	n, ok := asInt(replies[0])
	if !ok || (n != 0 && n != 1) {
		return false, replyError("dead_letter", replies[0])
	}
	return n == 1, nil
}

func (s *Store) checkStreamArgs(stream, group, id string) error {
	if stream == "" || group == "" || id == "" {
		return fmt.Errorf("%w: empty stream, group or entry ID", idem.ErrInvalid)
	}
	return nil
}
