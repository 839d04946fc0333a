package memstore

import (
	"context"
	"time"

	"github.com/idemgo/idem"
	"github.com/idemgo/idem/storekit"
)

var _ storekit.BatchStore = (*Store)(nil)

// AcquireBatch implements storekit.BatchStore: Acquire for each key, in order.
func (s *Store) AcquireBatch(ctx context.Context, keys []string, reqs []storekit.AcquireRequest) ([]storekit.Acquisition, []error) {
	out := make([]storekit.Acquisition, len(keys))
	errs := make([]error, len(keys))
	for i, k := range keys {
		if i >= len(reqs) {
			errs[i] = idem.ErrInvalid
			continue
		}
		out[i], errs[i] = s.Acquire(ctx, k, reqs[i])
	}
	return out, errs
}

// CompleteBatch implements storekit.BatchStore: Complete for each key, in order.
func (s *Store) CompleteBatch(ctx context.Context, keys []string, leases []storekit.Lease, results [][]byte, retention time.Duration) []error {
	errs := make([]error, len(keys))
	for i, k := range keys {
		if i >= len(leases) || i >= len(results) {
			errs[i] = idem.ErrInvalid
			continue
		}
		errs[i] = s.Complete(ctx, k, leases[i], results[i], retention)
	}
	return errs
}
