// Package execseam hands package adapterkit what package idem keeps
// unexported: the Executor's settings, its result codec and its batch
// calls, which adapter writers use and applications do not. idem sets the
// functions in its init; adapterkit imports idem, so they are set before
// it reads them.
package execseam

import (
	"context"
	"time"

	"github.com/idemgo/idem/storekit"
)

// Defaults of the Executor's options, which adapterkit exports.
const (
	DefaultLease         = 30 * time.Second
	DefaultRetention     = 24 * time.Hour
	DefaultMaxResultSize = 1 << 20
)

// Funcs are the functions of an Executor that adapterkit exports. This
// package cannot import idem, so their types are parameters: E is
// *idem.Executor, K idem.Key and A *idem.Attempt.
type Funcs[E, K, A any] struct {
	Store            func(e E) storekit.Store
	Lease, Retention func(e E) time.Duration
	MaxResultSize    func(e E) int
	// EncodeResult and DecodeResult turn a value into its stored form
	// under a store key and back.
	EncodeResult, DecodeResult func(e E, storeKey string, b []byte) ([]byte, error)
	// BeginBatch calls set once for each key, with its index and what
	// Begin returns for it.
	BeginBatch      func(e E, ctx context.Context, keys []K, fingerprints []string, set func(i int, ctx context.Context, a A, err error))
	CommitBatch     func(e E, ctx context.Context, attempts []A, values [][]byte) []error
	CommitBatchWith func(e E, ctx context.Context, attempts []A, values [][]byte, complete func(ctx context.Context, cs []storekit.BatchCompletion) []error) []error
}

var funcs any

// Set records f; idem calls it in its init.
func Set[E, K, A any](f *Funcs[E, K, A]) { funcs = f }

// Get returns the functions Set recorded. It panics if they were recorded
// with other types, which the first program that imports adapterkit shows.
func Get[E, K, A any]() *Funcs[E, K, A] { return funcs.(*Funcs[E, K, A]) }
