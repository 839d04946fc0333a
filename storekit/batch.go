package storekit

import (
	"context"
	"time"
)

// BatchStore is implemented by stores that acquire and complete many keys in
// about one round trip (redisstore pipelines the scripts).
// adapterkit.BeginBatch and CommitBatch use it when the store has it, also beneath
// wrappers that follow the Unwrapper convention (StoreAs), and fall back to
// one call per key otherwise. A wrapper (a decorator for tracing or
// metrics) should implement it itself when it can, or Unwrap. Each key keeps its own outcome and error, with
// the meaning of Acquire's and Complete's.
type BatchStore interface {
	AcquireBatch(ctx context.Context, keys []string, reqs []AcquireRequest) ([]Acquisition, []error)
	CompleteBatch(ctx context.Context, keys []string, leases []Lease, results [][]byte, retention time.Duration) []error
}

// EffectBatchStore is a BatchStore that completes a batch whose records
// carry effects (SetEffect) in about one round trip too (redisstore
// pipelines one call per record with an effect). CommitBatch uses it, for
// a batch with effects, when the store or a store it unwraps to has it
// (StoreAs: a wrapper without it is bypassed, as for CompleteEffect);
// otherwise it commits each attempt with an effect alone, with Commit.
//
// This is part of the store-writer API, like Store.
type EffectBatchStore interface {
	BatchStore
	EffectStore
	// CompleteEffectBatch is CompleteBatch where effects[i], when not
	// nil, is applied with the completion of keys[i] as CompleteEffect
	// applies it: each record's effect and completion stay one atomic
	// call, and a record whose effect failed gets an *EffectError.
	CompleteEffectBatch(ctx context.Context, keys []string, leases []Lease, results [][]byte, retention time.Duration, effects []*Effect) []error
}

// BatchCompletion is one record that adapterkit.CommitBatchWith asks its
// store call to complete.
type BatchCompletion struct {
	// Index is the position of the attempt in adapterkit.CommitBatchWith's
	// attempts.
	Index int
	// Key is the store key; Lease the acquisition being completed.
	Key   string
	Lease Lease
	// Result is the value as the Executor stores it (compressed and
	// sealed as configured): the blob to write, opaque to the store.
	Result []byte
	// Retention is how long the COMPLETED record is kept.
	Retention time.Duration
	// Effect, if not nil, is the attempt's effect (SetEffect): the store
	// call applies it atomically with this completion, as
	// EffectStore.CompleteEffect does, and answers an *EffectError when it
	// fails.
	Effect *Effect
}
