package storekit

import (
	"context"
	"time"
)

// Store holds one record per key and performs the state transitions of the
// idempotency state machine atomically. Implementations must be safe for
// concurrent use by multiple goroutines and, for shared stores such as
// redisstore, by multiple processes.
//
// Keys passed to a Store are digests made by idem.Key.Digest: stores never see raw
// user keys. Time (lease expiry, retention) is the store's own clock, never
// the caller's.
//
// Every mutating method except Acquire and Delete succeeds only while the
// caller is still the owner: the record must be IN_PROGRESS with the same
// owner token and fence, otherwise the method returns ErrLeaseLost. Expiry of
// the lease alone does not make them fail; only a takeover (or a deletion)
// does.
//
// Every method may be retried after its reply was lost (a timeout, a broken
// connection): Acquire repeated with the same owner token returns Acquired
// with the fence it handed out; Complete repeated with the same lease and
// result, Fail and Release repeated with the same lease succeed again. So a
// retry never executes anything twice. (A repeated Acquire reports
// Acquired even if the first call took the key over, and does not extend the
// lease.)
//
// An error other than ErrLeaseLost, ErrNotFound and ErrInvalid (a network
// error, a timeout, a server error) leaves the outcome unknown: the
// transition may or may not have happened. Repeating the call resolves it.
//
// An IN_PROGRESS record is kept one lease plus InProgressGrace after its
// lease ends, so that an owner whose lease expired without a takeover can
// still complete; after that it is dropped (a crashed owner's record does not
// linger). COMPLETED, RELEASED and FAILED records are kept for the retention
// given with the call that moved them there.
//
// The package storetest holds the conformance suite that every Store must
// pass.
type Store interface {
	// Acquire tries to take the key. It returns exactly one outcome:
	// Acquired, TakenOver, InProgress, Replay or Mismatch. A record whose
	// attempts reached req.MaxAttempts (when > 0) is not handed out again:
	// it becomes FAILED and Acquire returns Replay.
	Acquire(ctx context.Context, key string, req AcquireRequest) (Acquisition, error)

	// Complete stores result and moves the record to COMPLETED; it expires
	// after retention.
	Complete(ctx context.Context, key string, lease Lease, result []byte, retention time.Duration) error

	// Fail ends the caller's attempt. A terminal failure, or a retryable one
	// once the record's attempts reached f.MaxAttempts (when > 0), moves the
	// record to FAILED with f.Result stored; otherwise the record is
	// RELEASED and the next Acquire gets it at once. Fail returns the state
	// the record moved to.
	Fail(ctx context.Context, key string, lease Lease, f Failure) (State, error)

	// Extend sets the lease to end d after the store's current time.
	Extend(ctx context.Context, key string, lease Lease, d time.Duration) error

	// Release gives the key back without storing anything: the record is
	// RELEASED and the next Acquire gets it at once. Unlike Fail it never
	// moves the record to FAILED. The released record (its fence, attempts
	// and fingerprint) is kept for retention.
	Release(ctx context.Context, key string, lease Lease, retention time.Duration) error

	// Get returns the record, or ErrNotFound.
	Get(ctx context.Context, key string) (Record, error)

	// Delete removes the record whatever its state, forcing the key back to
	// absent. An in-flight owner's later Complete returns ErrLeaseLost.
	// Deleting an absent key is not an error.
	Delete(ctx context.Context, key string) error
}

// Lease identifies one acquisition of a key: the owner token chosen by the
// caller and the fencing token chosen by the store.
type Lease struct {
	// Owner is the caller's token, unique per acquisition.
	Owner string
	// Fence strictly increases with every acquisition of a key, also across
	// deletions (it is seeded from the store's clock in microseconds). Pass
	// it to side effects so that they can reject stale owners.
	Fence int64
}

// AcquireRequest holds the arguments of Store.Acquire.
type AcquireRequest struct {
	// Fingerprint identifies the request's payload. An existing record with
	// another fingerprint yields Mismatch.
	Fingerprint string
	// Owner is the caller's token for this acquisition.
	Owner string
	// Lease is how long the caller holds the key before another caller may
	// take it over. It must be at least one millisecond.
	Lease time.Duration
	// Retention is how long a record that Acquire moves to FAILED (attempts
	// exhausted) is kept. It must be at least Lease.
	Retention time.Duration
	// MaxAttempts, when positive, is the number of acquisitions after which
	// a key that is released or whose lease expired becomes FAILED.
	MaxAttempts int
}

// Failure holds the arguments of Store.Fail.
type Failure struct {
	// Result is stored when the record becomes FAILED and replayed to later
	// callers.
	Result []byte
	// Terminal moves the record to FAILED whatever its attempts.
	Terminal bool
	// Retention is how long the record is kept after this call.
	Retention time.Duration
	// MaxAttempts, when positive, moves the record to FAILED once its
	// attempts reached it.
	MaxAttempts int
}

// Outcome is the result kind of Store.Acquire.
type Outcome uint8

// The outcomes of Store.Acquire (docs/design.md#the-state-machine).
const (
	// Acquired: the key was absent or RELEASED; the caller owns it now.
	Acquired Outcome = iota + 1
	// TakenOver: the previous owner's lease had expired; the caller owns
	// the key now and Acquisition.PreviousOwner names the previous owner.
	TakenOver
	// InProgress: another caller holds an unexpired lease.
	InProgress
	// Replay: the record is COMPLETED or FAILED with the same fingerprint;
	// Acquisition.State and Acquisition.Result hold it.
	Replay
	// Mismatch: the record exists with a different fingerprint.
	Mismatch
)

var outcomeNames = [...]string{"invalid", "acquired", "taken-over", "in-progress", "replay", "mismatch"}

func (o Outcome) String() string {
	if int(o) < len(outcomeNames) {
		return outcomeNames[o]
	}
	return "invalid"
}

// Acquisition is the result of Store.Acquire.
type Acquisition struct {
	Outcome Outcome
	// Lease is set for Acquired and TakenOver.
	Lease Lease
	// PreviousOwner is set for TakenOver.
	PreviousOwner string
	// RetryAfter is the time left on the owner's lease, for InProgress.
	RetryAfter time.Duration
	// State is StateCompleted or StateFailed, for Replay.
	State State
	// Result is the stored result, for Replay. The caller must not modify
	// it.
	Result []byte
	// Attempts is the number of acquisitions of the record so far,
	// including this one when the key was acquired.
	Attempts int
}

// State is the state of a record.
type State uint8

// The states of a record (docs/design.md#the-state-machine). An absent
// record has no state.
const (
	StateInProgress State = iota + 1
	StateCompleted
	StateReleased
	StateFailed
)

var stateNames = [...]string{"invalid", "IN_PROGRESS", "COMPLETED", "RELEASED", "FAILED"}

func (s State) String() string {
	if int(s) < len(stateNames) {
		return stateNames[s]
	}
	return "invalid"
}

// Record is a snapshot of a key's record, as returned by Store.Get.
type Record struct {
	State       State
	Fingerprint string
	// Owner is the last owner's token. Stores may drop it once the record
	// left IN_PROGRESS.
	Owner    string
	Fence    int64
	Attempts int
	// Created is when the record was first acquired (store clock).
	Created time.Time
	// LeaseUntil is when the current lease ends (store clock), for
	// IN_PROGRESS records.
	LeaseUntil time.Time
	// ExpiresAt is when the store drops the record (store clock); zero if
	// unknown.
	ExpiresAt time.Time
	// Now is the store's clock when the record was read, so that callers can
	// compute the time left on a lease without trusting their own clock.
	Now time.Time
	// Result is the stored result blob (COMPLETED and FAILED records).
	Result []byte
}

// InProgressGrace is how long, beyond one more lease, a store keeps an
// IN_PROGRESS record whose lease ended.
const InProgressGrace = 2 * time.Second

// Limits on what reaches a store.
const (
	// DigestLen is the length of the store keys that the Executor passes
	// to a Store (idem.Key.Digest).
	DigestLen = 22
	// MaxKeyLen is the maximum length in bytes of idem.Key.ID.
	MaxKeyLen = 255
	// MaxFingerprintLen is the maximum length in bytes of a fingerprint.
	MaxFingerprintLen = 128
	// MaxOwnerLen is the maximum length in bytes of an owner token.
	MaxOwnerLen = 128
	// MaxStoreKeyLen is the maximum length of the key passed to a Store.
	MaxStoreKeyLen = 255
)

// ValidateStoreKey reports whether key may be passed to a Store. Stores call
// it (and the other Validate functions) before anything reaches their
// backend.
func ValidateStoreKey(key string) error {
	if key == "" {
		return invalidf("empty store key")
	}
	if len(key) > MaxStoreKeyLen {
		return invalidf("store key is %d bytes, over the limit of %d", len(key), MaxStoreKeyLen)
	}
	return nil
}

// ValidateLease reports whether a lease may be passed to a Store.
func ValidateLease(l Lease) error {
	if l.Owner == "" {
		return invalidf("empty owner")
	}
	if len(l.Owner) > MaxOwnerLen {
		return invalidf("owner is %d bytes, over the limit of %d", len(l.Owner), MaxOwnerLen)
	}
	if l.Fence <= 0 {
		return invalidf("fence %d is not positive", l.Fence)
	}
	return nil
}

// Validate reports whether the request may be passed to Store.Acquire.
func (r AcquireRequest) Validate() error {
	if len(r.Fingerprint) > MaxFingerprintLen {
		return invalidf("fingerprint is %d bytes, over the limit of %d", len(r.Fingerprint), MaxFingerprintLen)
	}
	if r.Owner == "" {
		return invalidf("empty owner")
	}
	if len(r.Owner) > MaxOwnerLen {
		return invalidf("owner is %d bytes, over the limit of %d", len(r.Owner), MaxOwnerLen)
	}
	if r.Lease < time.Millisecond {
		return invalidf("lease %v is shorter than 1ms", r.Lease)
	}
	if r.Retention < r.Lease {
		return invalidf("retention %v is shorter than the lease %v", r.Retention, r.Lease)
	}
	if r.MaxAttempts < 0 {
		return invalidf("max attempts %d is negative", r.MaxAttempts)
	}
	return nil
}

// Validate reports whether the failure may be passed to Store.Fail.
func (f Failure) Validate() error {
	if f.Retention < time.Millisecond {
		return invalidf("retention %v is shorter than 1ms", f.Retention)
	}
	if f.MaxAttempts < 0 {
		return invalidf("max attempts %d is negative", f.MaxAttempts)
	}
	return nil
}

// ValidateDuration reports whether d may be passed to a Store as a lease or
// retention: at least one millisecond, the resolution stores keep.
func ValidateDuration(what string, d time.Duration) error {
	if d < time.Millisecond {
		return invalidf("%s %v is shorter than 1ms", what, d)
	}
	return nil
}

// StatsStore is implemented by stores that can tell, cheaply enough to be
// asked at every metrics scrape, how many records they hold and how much
// memory they use: memstore and boltstore count every record, redisstore
// a bounded sample (with SCAN, never KEYS) and reads INFO memory. It is
// found beneath wrappers with StoreAs. Stats must be safe for concurrent
// use.
type StatsStore interface {
	Stats(ctx context.Context) (Stats, error)
}

// Stats is what a StatsStore tells about itself.
type Stats struct {
	// Records counts the live records by state (indexed by State; index 0
	// is unused).
	Records [StateFailed + 1]int64
	// Sampled is set when Records counts a sample of the records, not all
	// of them (redisstore stops at a bound).
	Sampled bool
	// OldestInProgress is the age, by the store's clock, of the oldest
	// IN_PROGRESS record counted, since it was first acquired; zero if
	// none.
	OldestInProgress time.Duration
	// MemoryUsed and MemoryLimit are the memory the store uses and may
	// use, in bytes: for Redis, used_memory and maxmemory of the node
	// closest to its limit. Zero when unknown, or for MemoryLimit when
	// there is no limit.
	MemoryUsed, MemoryLimit int64
}

// Count counts a record in state st, first acquired at created, read at
// now (both by the store's clock).
func (s *Stats) Count(st State, created, now time.Time) {
	if st == 0 || st > StateFailed {
		return
	}
	s.Records[st]++
	if st == StateInProgress {
		s.OldestInProgress = max(s.OldestInProgress, now.Sub(created))
	}
}
