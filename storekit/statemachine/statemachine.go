// Package statemachine holds the transitions of a key's record
// (docs/design.md#the-state-machine) as pure functions, shared by the
// in-process stores (memstore, boltstore) so that the rules live in one
// place; each store keeps only its storage. The Redis (Lua) and PostgreSQL
// (SQL) stores make the same transitions in their own languages; storetest
// checks them all.
//
// Every function takes the live record (nil when the key has none, or only
// an expired one), the request and the store's clock in Unix microseconds,
// and returns the record to store and whether it changed. A function never
// modifies its input; the returned record shares the input's and the
// request's result bytes.
//
// It is public, beside storekit, so that a store in another module
// (postgres/pgstore) or outside the repository follows the same rules.
package statemachine

import (
	"bytes"
	"context"
	"fmt"
	"time"

	"github.com/idemgo/idem/storekit"
)

// Record is a key's record. Times are Unix microseconds of the store's clock.
type Record struct {
	State       storekit.State
	Fingerprint string
	Owner       string
	Fence       int64
	Attempts    int
	Created     int64
	LeaseUntil  int64
	ExpiresAt   int64
	Result      []byte
}

// Grace is storekit.InProgressGrace in µs: how long, beyond one more lease, an
// IN_PROGRESS record whose lease ended is kept.
var Grace = storekit.InProgressGrace.Microseconds()

// Public returns r as a storekit.Record read at now, with a copy of the result.
func (r *Record) Public(now int64) storekit.Record {
	rec := storekit.Record{
		State:       r.State,
		Fingerprint: r.Fingerprint,
		Owner:       r.Owner,
		Fence:       r.Fence,
		Attempts:    r.Attempts,
		Created:     time.UnixMicro(r.Created),
		ExpiresAt:   time.UnixMicro(r.ExpiresAt),
		Now:         time.UnixMicro(now),
		Result:      append([]byte(nil), r.Result...),
	}
	if r.State == storekit.StateInProgress {
		rec.LeaseUntil = time.UnixMicro(r.LeaseUntil)
	}
	return rec
}

// NextFence returns a fence above prev, above lastFence (the last fence the
// store handed out) and at least now (docs/design.md#the-state-machine). The
// store records the fence of every record it writes as its new last fence
// (see Acquire).
func NextFence(prev, lastFence, now int64) int64 {
	return max(prev+1, now, lastFence+1)
}

// Settled returns the outcome of an Acquire of the live record cur that
// changes nothing, if it is one: Mismatch, Replay, InProgress, or Acquired
// for a repeated call by the owner. A Replay's Result aliases cur's.
func Settled(cur *Record, req storekit.AcquireRequest, now int64) (storekit.Acquisition, bool) {
	if cur == nil {
		return storekit.Acquisition{}, false
	}
	if cur.Fingerprint != req.Fingerprint {
		return storekit.Acquisition{Outcome: storekit.Mismatch}, true
	}
	switch cur.State {
	case storekit.StateCompleted, storekit.StateFailed:
		return storekit.Acquisition{Outcome: storekit.Replay, State: cur.State, Result: cur.Result, Attempts: cur.Attempts}, true
	case storekit.StateInProgress:
		if cur.Owner == req.Owner { // a repeated call whose reply was lost
			return storekit.Acquisition{Outcome: storekit.Acquired, Lease: storekit.Lease{Owner: cur.Owner, Fence: cur.Fence}, Attempts: cur.Attempts}, true
		}
		if cur.LeaseUntil > now {
			return storekit.Acquisition{Outcome: storekit.InProgress, RetryAfter: time.Duration(cur.LeaseUntil-now) * time.Microsecond, Attempts: cur.Attempts}, true
		}
	}
	return storekit.Acquisition{}, false
}

// Acquire is the transition of storekit.Store.Acquire. lastFence is the last
// fence the store handed out; when changed, the store keeps
// max(lastFence, next.Fence) as its new last fence. req must be valid.
func Acquire(cur *Record, req storekit.AcquireRequest, now, lastFence int64) (next Record, changed bool, out storekit.Acquisition) {
	lease := req.Lease.Microseconds()
	if cur == nil {
		next = Record{
			State:       storekit.StateInProgress,
			Fingerprint: req.Fingerprint,
			Owner:       req.Owner,
			Fence:       NextFence(0, lastFence, now),
			Attempts:    1,
			Created:     now,
			LeaseUntil:  now + lease,
			ExpiresAt:   now + 2*lease + Grace,
		}
		return next, true, storekit.Acquisition{Outcome: storekit.Acquired, Lease: storekit.Lease{Owner: next.Owner, Fence: next.Fence}, Attempts: 1}
	}
	if a, ok := Settled(cur, req, now); ok {
		return Record{}, false, a
	}
	// RELEASED, or IN_PROGRESS with an expired lease.
	next = *cur
	if req.MaxAttempts > 0 && cur.Attempts >= req.MaxAttempts {
		next.State, next.Owner, next.LeaseUntil, next.Result = storekit.StateFailed, "", 0, nil
		next.ExpiresAt = now + req.Retention.Microseconds()
		return next, true, storekit.Acquisition{Outcome: storekit.Replay, State: storekit.StateFailed, Attempts: next.Attempts}
	}
	out = storekit.Acquisition{Outcome: storekit.Acquired}
	if cur.State == storekit.StateInProgress {
		out.Outcome, out.PreviousOwner = storekit.TakenOver, cur.Owner
	}
	next.State, next.Owner = storekit.StateInProgress, req.Owner
	next.Fence = NextFence(cur.Fence, lastFence, now)
	next.Attempts++
	next.LeaseUntil = now + lease
	next.ExpiresAt = now + 2*lease + Grace
	next.Result = nil
	out.Lease = storekit.Lease{Owner: next.Owner, Fence: next.Fence}
	out.Attempts = next.Attempts
	return next, true, out
}

// Owned returns nil if lease still owns cur, and an error wrapping
// storekit.ErrLeaseLost otherwise.
func Owned(cur *Record, lease storekit.Lease) error {
	if cur == nil {
		return fmt.Errorf("%w: no record", storekit.ErrLeaseLost)
	}
	if cur.State != storekit.StateInProgress || cur.Owner != lease.Owner || cur.Fence != lease.Fence {
		return fmt.Errorf("%w: record is %v with fence %d", storekit.ErrLeaseLost, cur.State, cur.Fence)
	}
	return nil
}

// Complete is the transition of storekit.Store.Complete. A repeated call whose
// reply was lost changes nothing and returns no error. The watchers of the
// key are woken when it changed.
func Complete(cur *Record, lease storekit.Lease, result []byte, retention time.Duration, now int64) (next Record, changed bool, err error) {
	if cur != nil && cur.State == storekit.StateCompleted && cur.Fence == lease.Fence && bytes.Equal(cur.Result, result) {
		return Record{}, false, nil // a repeated call whose reply was lost
	}
	if err := Owned(cur, lease); err != nil {
		return Record{}, false, err
	}
	next = *cur
	next.State, next.Result, next.LeaseUntil = storekit.StateCompleted, result, 0
	next.ExpiresAt = now + retention.Microseconds()
	return next, true, nil
}

// Relay is the transition of storekit.Relayer.RelayCompletion: the record
// becomes COMPLETED with c's fingerprint, fence (or its own, if higher) and
// result, unless it is COMPLETED already (the first completion stays). When
// changed, the store keeps max(lastFence, next.Fence) as its last fence and
// wakes the key's watchers. c must be valid.
func Relay(cur *Record, c storekit.Completion, now int64) (next Record, changed bool) {
	if cur == nil {
		next = Record{Attempts: 1, Created: now}
	} else if cur.State == storekit.StateCompleted {
		return Record{}, false // the first completion stays
	} else {
		next = *cur
	}
	next.State, next.Fingerprint, next.Owner, next.Result, next.LeaseUntil = storekit.StateCompleted, c.Fingerprint, "", c.Result, 0
	next.Fence = max(next.Fence, c.Fence)
	next.ExpiresAt = now + c.Retention.Microseconds()
	return next, true
}

// Fail is the transition of storekit.Store.Fail; state is the record's state
// after it (RELEASED or FAILED). A repeated call whose reply was lost
// changes nothing and returns the state it left. The watchers of the key are
// woken when it changed.
func Fail(cur *Record, lease storekit.Lease, f storekit.Failure, now int64) (next Record, changed bool, state storekit.State, err error) {
	if cur != nil && (cur.State == storekit.StateReleased || cur.State == storekit.StateFailed) && cur.Fence == lease.Fence {
		return Record{}, false, cur.State, nil // a repeated call whose reply was lost
	}
	if err := Owned(cur, lease); err != nil {
		return Record{}, false, 0, err
	}
	next = *cur
	next.LeaseUntil = 0
	next.ExpiresAt = now + f.Retention.Microseconds()
	if f.Terminal || (f.MaxAttempts > 0 && cur.Attempts >= f.MaxAttempts) {
		next.State, next.Result = storekit.StateFailed, f.Result
	} else {
		next.State, next.Result = storekit.StateReleased, nil
	}
	return next, true, next.State, nil
}

// Extend is the transition of storekit.Store.Extend: the lease ends d after now.
// It wakes no watcher.
func Extend(cur *Record, lease storekit.Lease, d time.Duration, now int64) (next Record, err error) {
	if err := Owned(cur, lease); err != nil {
		return Record{}, err
	}
	next = *cur
	next.LeaseUntil = now + d.Microseconds()
	next.ExpiresAt = next.LeaseUntil + d.Microseconds() + Grace
	return next, nil
}

// Release is the transition of storekit.Store.Release. A repeated call whose
// reply was lost changes nothing and returns no error. The watchers of the
// key are woken when it changed.
func Release(cur *Record, lease storekit.Lease, retention time.Duration, now int64) (next Record, changed bool, err error) {
	if cur != nil && cur.State == storekit.StateReleased && cur.Fence == lease.Fence {
		return Record{}, false, nil // a repeated call whose reply was lost
	}
	if err := Owned(cur, lease); err != nil {
		return Record{}, false, err
	}
	next = *cur
	next.State, next.LeaseUntil, next.Result = storekit.StateReleased, 0, nil
	next.ExpiresAt = now + retention.Microseconds()
	return next, true, nil
}

// CheckLease validates the key and the lease of a call made under a lease.
func CheckLease(key string, lease storekit.Lease) error {
	if err := storekit.ValidateStoreKey(key); err != nil {
		return err
	}
	return storekit.ValidateLease(lease)
}

// CheckOwned validates the arguments of a call made under a lease
// (Complete, Fail, Extend, Release): the key, the lease, then ctx, then the
// duration d named what, unless what is empty.
func CheckOwned(ctx context.Context, key string, lease storekit.Lease, what string, d time.Duration) error {
	if err := CheckLease(key, lease); err != nil {
		return err
	}
	if err := ctx.Err(); err != nil {
		return err
	}
	if what == "" {
		return nil
	}
	return storekit.ValidateDuration(what, d)
}

// CheckAcquire validates the arguments of Acquire: the key, the request,
// then ctx.
func CheckAcquire(ctx context.Context, key string, req storekit.AcquireRequest) error {
	if err := storekit.ValidateStoreKey(key); err != nil {
		return err
	}
	if err := req.Validate(); err != nil {
		return err
	}
	return ctx.Err()
}

// CheckRelay validates the arguments of RelayCompletion: the key, the
// completion, then ctx.
func CheckRelay(ctx context.Context, key string, c storekit.Completion) error {
	if err := storekit.ValidateStoreKey(key); err != nil {
		return err
	}
	if err := c.Validate(); err != nil {
		return err
	}
	return ctx.Err()
}

// ParseState returns the state that code stands for in the records the
// Redis and PostgreSQL stores keep (docs/design.md#records-and-keys): p
// IN_PROGRESS, c COMPLETED, r RELEASED, f FAILED.
func ParseState(code string) (storekit.State, bool) {
	switch code {
	case "p":
		return storekit.StateInProgress, true
	case "c":
		return storekit.StateCompleted, true
	case "r":
		return storekit.StateReleased, true
	case "f":
		return storekit.StateFailed, true
	}
	return 0, false
}
