// Package storekit is the kit of those who implement an idem Store: the
// contract (Store) and its optional capabilities (BatchStore, EffectStore,
// EffectBatchStore, Watcher, Relayer, StatsStore, found beneath wrappers
// with StoreAs and Unwrapper), the record and acquisition types (Record,
// State, Acquisition, Outcome, AcquireRequest, Failure, Completion,
// BatchCompletion), the validators a store calls before anything reaches
// its backend and the limits they check, and the errors a store returns.
// Applications do not import it: they use package idem, whose Store,
// Lease and Effect are this package's, and whose errors are the same
// values.
//
// Two packages beside it hold what in-process stores share, so that the
// rules live in one place (docs/design.md#the-state-machine):
// storekit/statemachine, the transitions of a record as pure functions,
// and storekit/watchset, the registry of callers waiting for a key. The
// conformance suite every store passes is storetest.Run.
//
// A store asserts the contract at compile time and checks its input first:
//
//	var _ storekit.Store = (*Store)(nil)
//
//	func (s *Store) Acquire(ctx context.Context, key string, req storekit.AcquireRequest) (storekit.Acquisition, error) {
//		if err := storekit.ValidateStoreKey(key); err != nil {
//			return storekit.Acquisition{}, err
//		}
//		if err := req.Validate(); err != nil {
//			return storekit.Acquisition{}, err
//		}
//		…
//	}
//
// Where a new store goes, and how it is tested: docs/design.md#where-new-code-goes.
package storekit
