// Package adapterkit is the kit of those who build adapters on an
// idem.Executor: broker consumers, HTTP and gRPC middleware, the proxy,
// the commit gate, tools that read records. It gives what an application
// does not need: the Executor's batch calls (BeginBatch, CommitBatch, and
// CommitBatchWith for a store call that completes more in the same atomic
// step, as a stream acknowledgement), its settings (Store, Lease,
// Retention, MaxResultSize, and their defaults) and its result codec
// (EncodeResult, DecodeResult), with which an adapter writes or reads a
// stored result the way Commit and a replay do.
//
// An adapter that writes a completion outside the store, as the commit
// gate does in its own transaction, encodes it first:
//
//	blob, err := adapterkit.EncodeResult(exec, a.Key(), value)
//	if err != nil {
//		return err // wraps idem.ErrResultTooLarge over the limit
//	}
//	… INSERT the blob for a.Key() with adapterkit.Retention(exec) …
//
// Store writers use package storekit instead. Where a new adapter goes,
// and how it is tested: docs/design.md#where-new-code-goes.
package adapterkit
