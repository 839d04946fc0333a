package idem

import (
	"context"
	"fmt"
	"time"
)

// BatchStore is implemented by stores that acquire and complete many keys in
// about one round trip (redisstore pipelines the scripts). Executor's
// BeginBatch and CommitBatch use it when the store has it and fall back to
// one call per key otherwise. Each key keeps its own outcome and error, with
// the meaning of Acquire's and Complete's.
type BatchStore interface {
	AcquireBatch(ctx context.Context, keys []string, reqs []AcquireRequest) ([]Acquisition, []error)
	CompleteBatch(ctx context.Context, keys []string, leases []Lease, results [][]byte, retention time.Duration) []error
}

// Began is the outcome of one key of BeginBatch: what Begin returns.
type Began struct {
	Ctx     context.Context
	Attempt *Attempt
	Err     error
}

// BeginBatch is Begin for many keys at once: on a BatchStore the
// acquisitions go in one pipeline. Each key gets the outcome Begin would
// give it; a key that appears twice is acquired once, the second gets an
// *InProgressError. fingerprints must have one entry per key. As Begin, it
// repeats the acquisitions whose outcome is unknown a few times within
// about 70ms.
func (e *Executor) BeginBatch(ctx context.Context, keys []Key, fingerprints []string) []Began {
	out := make([]Began, len(keys))
	if len(fingerprints) != len(keys) {
		for i := range out {
			out[i] = Began{Ctx: ctx, Err: invalidf("%d keys and %d fingerprints", len(keys), len(fingerprints))}
		}
		return out
	}
	bs, ok := e.store.(BatchStore)
	if !ok {
		for i, k := range keys {
			c, a, err := e.Begin(ctx, k, fingerprints[i])
			out[i] = Began{c, a, err}
		}
		return out
	}
	skeys := make([]string, 0, len(keys))
	reqs := make([]AcquireRequest, 0, len(keys))
	idx := make([]int, 0, len(keys))
	for i, k := range keys {
		if err := k.Validate(); err != nil {
			out[i] = Began{Ctx: ctx, Err: err}
			continue
		}
		if len(fingerprints[i]) > MaxFingerprintLen {
			out[i] = Began{Ctx: ctx, Err: invalidf("fingerprint is %d bytes, over the limit of %d", len(fingerprints[i]), MaxFingerprintLen)}
			continue
		}
		skey, owner := e.keyAndOwner(k)
		skeys = append(skeys, skey)
		reqs = append(reqs, AcquireRequest{Fingerprint: fingerprints[i], Owner: owner, Lease: e.lease, Retention: e.retention, MaxAttempts: e.maxAttempts})
		idx = append(idx, i)
	}
	if len(skeys) == 0 {
		return out
	}
	// Repeat the acquisitions whose outcome is unknown, as Begin does.
	var acqs []Acquisition
	r := acquireRepeats()
	errs := r.batch(ctx, func(js []int) []error {
		if js == nil {
			var errs []error
			acqs, errs = bs.AcquireBatch(ctx, skeys, reqs)
			return errs
		}
		got, errs := bs.AcquireBatch(ctx, subset(skeys, js), subset(reqs, js))
		for k, j := range js {
			acqs[j] = got[k]
		}
		return errs
	})
	for j, i := range idx {
		if errs[j] != nil {
			out[i] = Began{Ctx: ctx, Err: fmt.Errorf("idem: acquire: %w", errs[j])}
			continue
		}
		c, a, err := e.begun(ctx, skeys[j], acqs[j])
		out[i] = Began{c, a, err}
	}
	return out
}

// CommitBatch is Commit for many attempts at once: on a BatchStore the
// completions go in one pipeline. It returns one error per attempt, with
// Commit's meaning; a nil or replayed attempt gets nil. values must have
// one entry per attempt; the store does not keep them.
func (e *Executor) CommitBatch(ctx context.Context, attempts []*Attempt, values [][]byte) []error {
	errs := make([]error, len(attempts))
	if len(values) != len(attempts) {
		for i := range errs {
			errs[i] = invalidf("%d attempts and %d values", len(attempts), len(values))
		}
		return errs
	}
	bs, ok := e.store.(BatchStore)
	if !ok {
		for i, a := range attempts {
			if a != nil {
				errs[i] = a.Commit(ctx, values[i])
			}
		}
		return errs
	}
	keys := make([]string, 0, len(attempts))
	leases := make([]Lease, 0, len(attempts))
	blobs := make([][]byte, 0, len(attempts))
	idx := make([]int, 0, len(attempts))
	for i, a := range attempts {
		if a == nil || a.replayed {
			continue
		}
		if _, effect := a.Effect(); effect || len(values[i]) > e.codec.maxSize {
			// An effect needs its own call; an oversized value fails the
			// key.
			errs[i] = a.Commit(ctx, values[i])
			continue
		}
		blob, err := e.codec.encode(a.key, values[i])
		if err != nil {
			errs[i] = err
			continue
		}
		if err := a.end(); err != nil {
			errs[i] = err
			continue
		}
		keys = append(keys, a.key)
		leases = append(leases, a.lease)
		blobs = append(blobs, blob)
		idx = append(idx, i)
	}
	if len(keys) == 0 {
		return errs
	}
	// Repeat the completions whose outcome is unknown, as Commit does.
	cerrs := RepeatUnknown(ctx, e.lease, func(js []int) []error {
		if js == nil {
			return bs.CompleteBatch(ctx, keys, leases, blobs, e.retention)
		}
		return bs.CompleteBatch(ctx, subset(keys, js), subset(leases, js), subset(blobs, js), e.retention)
	})
	for j, i := range idx {
		attempts[i].cancel(nil)
		if cerrs[j] != nil {
			errs[i] = fmt.Errorf("idem: complete: %w", cerrs[j])
		}
	}
	return errs
}

// subset returns the elements of s at the indices idx, in that order.
func subset[T any](s []T, idx []int) []T {
	out := make([]T, len(idx))
	for k, i := range idx {
		out[k] = s[i]
	}
	return out
}
