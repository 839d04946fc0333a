package redisstore

import (
	"context"
	"fmt"
	"strconv"
	"time"

	"github.com/idemgo/idem"
	"github.com/idemgo/idem/storekit"
	"github.com/idemgo/idem/storekit/statemachine"
)

var _ storekit.BatchStore = (*Store)(nil)

// CompleteBatch runs Complete for every keys[i] with leases[i] and
// results[i], in one script call per 128 keys where the keys may share a
// script, otherwise in one pipeline of one-key scripts (on a Cluster, one
// per node; see Batches in the package documentation), and returns one
// error per key with Complete's meaning. A store configured with WithWait
// or WithWaitAOF refuses batches (every error wraps idem.ErrInvalid): use
// Complete. The results must not be modified during the call.
func (s *Store) CompleteBatch(ctx context.Context, keys []string, leases []storekit.Lease, results [][]byte, retention time.Duration) []error {
	errs := make([]error, len(keys))
	if len(leases) != len(keys) || len(results) != len(keys) {
		for i := range errs {
			errs[i] = fmt.Errorf("%w: %d keys, %d leases and %d results", idem.ErrInvalid, len(keys), len(leases), len(results))
		}
		return errs
	}
	if err := storekit.ValidateDuration("retention", retention); err != nil {
		for i := range errs {
			errs[i] = err
		}
		return errs
	}
	calls := make([]evalCall, 0, len(keys))
	idx := make([]int, 0, len(keys))
	for i, key := range keys {
		if s.wait != nil {
			errs[i] = errBatchWait
			continue
		}
		if err := statemachine.CheckLease(key, leases[i]); err != nil {
			errs[i] = err
			continue
		}
		calls = append(calls, evalCall{
			Keys: []string{s.Key(key)},
			Args: []string{leases[i].Owner, strconv.FormatInt(leases[i].Fence, 10), bytesArg(results[i]), ms(retention), s.pub, s.channel(key)},
		})
		idx = append(idx, i)
	}
	s.runOKBatch(ctx, completeScript, completeManyScript, packComplete, calls, idx, errs)
	return errs
}

// runOKBatch runs calls of a script whose reply is 1 or 0 (see parseOK) as
// runBatch does, and sets errs[idx[j]] to the outcome of calls[j].
func (s *Store) runOKBatch(ctx context.Context, one, many *script, pack func([]evalCall) ([]evalCall, []span), calls []evalCall, idx []int, errs []error) {
	if len(calls) == 0 {
		return
	}
	replies, rerrs := s.runBatch(ctx, one, many, calls, pack)
	for j, i := range idx {
		if rerrs[j] != nil {
			errs[i] = rerrs[j]
			continue
		}
		errs[i] = parseOK(one.Name, replies[j])
	}
}
