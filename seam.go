package idem

import (
	"time"

	"github.com/idemgo/idem/internal/execseam"
)

// What package adapterkit exports of an Executor, for those who build
// adapters on it (docs/design.md#where-new-code-goes).
func init() {
	execseam.Set(&execseam.Funcs[*Executor, Key, *Attempt]{
		Store:           func(e *Executor) Store { return e.store },
		Lease:           func(e *Executor) time.Duration { return e.lease },
		Retention:       func(e *Executor) time.Duration { return e.retention },
		MaxResultSize:   func(e *Executor) int { return e.codec.maxSize },
		EncodeResult:    (*Executor).encodeResult,
		DecodeResult:    (*Executor).decodeResult,
		BeginBatch:      (*Executor).beginBatch,
		CommitBatch:     (*Executor).commitBatch,
		CommitBatchWith: (*Executor).commitBatchWith,
	})
}
