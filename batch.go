package idem

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/idemgo/idem/observe"
	"github.com/idemgo/idem/storekit"
)

// beginBatch is Begin for many keys at once (adapterkit.BeginBatch): it
// calls set once per key with the key's index and what Begin returns for
// it.
func (e *Executor) beginBatch(ctx context.Context, keys []Key, fingerprints []string, set func(i int, ctx context.Context, a *Attempt, err error)) {
	if len(fingerprints) != len(keys) {
		for i := range keys {
			set(i, ctx, nil, invalidf("%d keys and %d fingerprints", len(keys), len(fingerprints)))
		}
		return
	}
	bs, ok := storekit.StoreAs[storekit.BatchStore](e.store)
	if !ok {
		for i, k := range keys {
			c, a, err := e.begin(ctx, k, fingerprints[i])
			set(i, c, a, err)
		}
		return
	}
	skeys := make([]string, 0, len(keys))
	reqs := make([]storekit.AcquireRequest, 0, len(keys))
	idx := make([]int, 0, len(keys))
	for i, k := range keys {
		if err := k.Validate(); err != nil {
			set(i, ctx, nil, err)
			continue
		}
		if len(fingerprints[i]) > storekit.MaxFingerprintLen {
			set(i, ctx, nil, invalidf("fingerprint is %d bytes, over the limit of %d", len(fingerprints[i]), storekit.MaxFingerprintLen))
			continue
		}
		skey, owner := e.keyAndOwner(k)
		skeys = append(skeys, skey)
		reqs = append(reqs, storekit.AcquireRequest{Fingerprint: fingerprints[i], Owner: owner, Lease: e.lease, Retention: e.retention, MaxAttempts: e.maxAttempts})
		idx = append(idx, i)
	}
	if len(skeys) == 0 {
		return
	}
	// Repeat the acquisitions whose outcome is unknown, as Begin does.
	var acqs []storekit.Acquisition
	sent := time.Now()
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
	var store time.Duration
	if e.observer != nil {
		store = time.Since(sent)
	}
	for j, i := range idx {
		if errs[j] != nil {
			err := fmt.Errorf("idem: acquire: %w", errs[j])
			set(i, ctx, nil, err)
			if e.observer != nil {
				e.observeBegin(ctx, keys[i].scopeKind(), sent, store, err)
			}
			continue
		}
		c, a, err := e.begun(ctx, skeys[j], keys[i], reqs[j].Fingerprint, acqs[j], sent, store)
		set(i, c, a, err)
	}
}

// commitBatch is Commit for many attempts at once (adapterkit.CommitBatch):
// on a storekit.BatchStore the completions go in one pipeline, those of
// attempts with an effect too on a storekit.EffectBatchStore.
func (e *Executor) commitBatch(ctx context.Context, attempts []*Attempt, values [][]byte) []error {
	bs, ok := storekit.StoreAs[storekit.BatchStore](e.store)
	if !ok {
		errs := make([]error, len(attempts))
		if len(values) != len(attempts) {
			for i := range errs {
				errs[i] = invalidf("%d attempts and %d values", len(attempts), len(values))
			}
			return errs
		}
		for i, a := range attempts {
			if a != nil {
				errs[i] = a.Commit(ctx, values[i])
			}
		}
		return errs
	}
	// CompleteBatch applies no effects: a batch with effects goes to the
	// storekit.EffectBatchStore (the innermost store, as CompleteEffect does),
	// or else each attempt with an effect is committed alone.
	var alone []int
	if len(values) == len(attempts) {
		for i, a := range attempts {
			if a != nil && a.hasEffect() {
				alone = append(alone, i)
			}
		}
	}
	if ebs, ok := storekit.StoreAs[storekit.EffectBatchStore](e.store); ok && len(alone) > 0 {
		return e.commitBatchWith(ctx, attempts, values, func(ctx context.Context, cs []storekit.BatchCompletion) []error {
			keys, leases, blobs := completionArgs(cs)
			effects := make([]*Effect, len(cs))
			for k, c := range cs {
				effects[k] = c.Effect
			}
			return ebs.CompleteEffectBatch(ctx, keys, leases, blobs, e.retention, effects)
		})
	}
	batch := attempts
	if len(alone) > 0 {
		batch = slices.Clone(attempts)
		for _, i := range alone {
			batch[i] = nil
		}
	}
	errs := e.commitBatchWith(ctx, batch, values, func(ctx context.Context, cs []storekit.BatchCompletion) []error {
		keys, leases, blobs := completionArgs(cs)
		return bs.CompleteBatch(ctx, keys, leases, blobs, e.retention)
	})
	for _, i := range alone {
		errs[i] = attempts[i].Commit(ctx, values[i])
	}
	return errs
}

// completionArgs returns the keys, leases and results of cs, the arguments
// of storekit.BatchStore.CompleteBatch.
func completionArgs(cs []storekit.BatchCompletion) (keys []string, leases []Lease, blobs [][]byte) {
	keys = make([]string, len(cs))
	leases = make([]Lease, len(cs))
	blobs = make([][]byte, len(cs))
	for k, c := range cs {
		keys[k], leases[k], blobs[k] = c.Key, c.Lease, c.Result
	}
	return keys, leases, blobs
}

// commitBatchWith is commitBatch with the store call made by complete
// (adapterkit.CommitBatchWith, where complete's contract is).
func (e *Executor) commitBatchWith(ctx context.Context, attempts []*Attempt, values [][]byte, complete func(ctx context.Context, cs []storekit.BatchCompletion) []error) []error {
	errs := make([]error, len(attempts))
	if len(values) != len(attempts) || complete == nil {
		for i := range errs {
			errs[i] = invalidf("%d attempts and %d values, or a nil store call", len(attempts), len(values))
		}
		return errs
	}
	cs := make([]storekit.BatchCompletion, 0, len(attempts))
	for i, a := range attempts {
		if a == nil || a.replayed {
			continue
		}
		if len(values[i]) > e.codec.maxSize {
			errs[i] = a.Commit(ctx, values[i]) // fails the key, one call
			continue
		}
		blob, err := e.codec.encode(a.key, values[i])
		if err != nil {
			errs[i] = err
			continue
		}
		if err := a.end(); err != nil {
			errs[i] = err
			a.endFailed(ctx, err)
			continue
		}
		if a.effect != nil {
			if err := a.setPartialResult(); err != nil {
				errs[i] = err
				a.cancel(nil)
				a.observeEnd(ctx, observe.NotRecorded, nil, err)
				continue
			}
		}
		cs = append(cs, storekit.BatchCompletion{Index: i, Key: a.key, Lease: a.lease, Result: blob, Retention: e.retention, Effect: a.effect})
	}
	if len(cs) == 0 {
		return errs
	}
	// Repeat the completions whose outcome is unknown, as Commit does.
	sent := time.Now()
	cerrs := repeatUnknown(ctx, e.lease, func(js []int) []error {
		if js == nil {
			return complete(ctx, cs)
		}
		return complete(ctx, subset(cs, js))
	})
	var store time.Duration
	if e.observer != nil {
		store = time.Since(sent)
	}
	for j, c := range cs {
		a := attempts[c.Index]
		a.cancel(nil)
		if a.obs != nil {
			a.obs.storeTime += store
		}
		switch err := cerrs[j]; {
		case errors.Is(err, ErrEffect):
			errs[c.Index] = a.effectFailed(ctx, err)
		case err != nil:
			errs[c.Index] = fmt.Errorf("idem: complete: %w", err)
			a.observeEnd(ctx, observe.Executed, err, errs[c.Index])
		default:
			a.observeEnd(ctx, observe.Executed, nil, nil)
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
