package memstore

import (
	"bytes"
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/idemgo/idem"
)

// Option configures a Store.
type Option func(*Store)

// WithClock sets the store's clock, which plays the part of the Redis
// server's clock: lease expiry, retention and fence seeds are computed from
// it. The default is time.Now.
func WithClock(now func() time.Time) Option { return func(s *Store) { s.now = now } }

// WithCapacity sizes the store for n records up front, so that filling it
// does not grow (and rehash) its map step by step. The default is 0.
func WithCapacity(n int) Option { return func(s *Store) { s.capacity = n } }

// Store is an in-process idem.Store: a map guarded by a mutex. The zero value
// is not usable; call New. It is safe for concurrent use.
type Store struct {
	now      func() time.Time
	capacity int

	mu        sync.Mutex
	records   map[string]*record
	lastFence int64
	writes    int
	watchers  map[string]*watch
}

var (
	_ idem.Store   = (*Store)(nil)
	_ idem.Watcher = (*Store)(nil)
	_ idem.Relayer = (*Store)(nil)
)

type record struct {
	state       idem.State
	fingerprint string
	owner       string
	fence       int64
	attempts    int
	created     int64 // unix µs
	leaseUntil  int64 // unix µs
	expiresAt   int64 // unix µs
	result      []byte
}

// grace is idem.InProgressGrace in µs.
var grace = idem.InProgressGrace.Microseconds()

// New returns an empty Store.
func New(opts ...Option) (*Store, error) {
	s := &Store{now: time.Now, watchers: make(map[string]*watch)}
	for _, o := range opts {
		o(s)
	}
	if s.now == nil {
		return nil, fmt.Errorf("%w: nil clock", idem.ErrInvalid)
	}
	if s.capacity < 0 {
		return nil, fmt.Errorf("%w: negative capacity %d", idem.ErrInvalid, s.capacity)
	}
	s.records = make(map[string]*record, s.capacity)
	return s, nil
}

// Len returns the number of records held, expired ones that were not swept
// yet included.
func (s *Store) Len() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.records)
}

func (s *Store) micros() int64 { return s.now().UnixMicro() }

// lookup returns the live record for key, dropping an expired one. It is
// called with s.mu held.
func (s *Store) lookup(key string, now int64) *record {
	r := s.records[key]
	if r != nil && r.expiresAt <= now {
		delete(s.records, key)
		return nil
	}
	return r
}

// nextFence returns a fence above prev, above every fence handed out before,
// and at least the clock in microseconds (DESIGN.md §1).
func (s *Store) nextFence(prev, now int64) int64 {
	f := max(prev+1, now, s.lastFence+1)
	s.lastFence = f
	return f
}

// sweep drops some expired records; it runs every 256 writes and looks at
// up to 64 records, so memory stays bounded without a background goroutine.
func (s *Store) sweep(now int64) {
	s.writes++
	if s.writes%256 != 0 {
		return
	}
	n := 0
	for k, r := range s.records {
		if r.expiresAt <= now {
			delete(s.records, k)
		}
		if n++; n == 64 {
			return
		}
	}
}

// Acquire implements idem.Store.
func (s *Store) Acquire(ctx context.Context, key string, req idem.AcquireRequest) (idem.Acquisition, error) {
	if err := idem.ValidateStoreKey(key); err != nil {
		return idem.Acquisition{}, err
	}
	if err := req.Validate(); err != nil {
		return idem.Acquisition{}, err
	}
	if err := ctx.Err(); err != nil {
		return idem.Acquisition{}, err
	}
	lease := req.Lease.Microseconds()
	s.mu.Lock()
	defer s.mu.Unlock()
	now := s.micros()
	r := s.lookup(key, now)
	if r == nil {
		s.sweep(now)
		r = &record{
			state:       idem.StateInProgress,
			fingerprint: req.Fingerprint,
			owner:       req.Owner,
			fence:       s.nextFence(0, now),
			attempts:    1,
			created:     now,
			leaseUntil:  now + lease,
			expiresAt:   now + 2*lease + grace,
		}
		s.records[key] = r
		return idem.Acquisition{Outcome: idem.Acquired, Lease: idem.Lease{Owner: r.owner, Fence: r.fence}, Attempts: 1}, nil
	}
	if r.fingerprint != req.Fingerprint {
		return idem.Acquisition{Outcome: idem.Mismatch}, nil
	}
	switch r.state {
	case idem.StateCompleted, idem.StateFailed:
		return idem.Acquisition{Outcome: idem.Replay, State: r.state, Result: r.result, Attempts: r.attempts}, nil
	case idem.StateInProgress:
		if r.owner == req.Owner { // a repeated call whose reply was lost
			return idem.Acquisition{Outcome: idem.Acquired, Lease: idem.Lease{Owner: r.owner, Fence: r.fence}, Attempts: r.attempts}, nil
		}
		if r.leaseUntil > now {
			return idem.Acquisition{Outcome: idem.InProgress, RetryAfter: time.Duration(r.leaseUntil-now) * time.Microsecond, Attempts: r.attempts}, nil
		}
	}
	// RELEASED, or IN_PROGRESS with an expired lease.
	if req.MaxAttempts > 0 && r.attempts >= req.MaxAttempts {
		r.state, r.owner, r.leaseUntil, r.result = idem.StateFailed, "", 0, nil
		r.expiresAt = now + req.Retention.Microseconds()
		return idem.Acquisition{Outcome: idem.Replay, State: idem.StateFailed, Attempts: r.attempts}, nil
	}
	out := idem.Acquisition{Outcome: idem.Acquired}
	if r.state == idem.StateInProgress {
		out.Outcome, out.PreviousOwner = idem.TakenOver, r.owner
	}
	r.state, r.owner = idem.StateInProgress, req.Owner
	r.fence = s.nextFence(r.fence, now)
	r.attempts++
	r.leaseUntil = now + lease
	r.expiresAt = now + 2*lease + grace
	r.result = nil
	out.Lease = idem.Lease{Owner: r.owner, Fence: r.fence}
	out.Attempts = r.attempts
	return out, nil
}

// owned returns r if lease still owns it. It is called with s.mu held.
func owned(r *record, lease idem.Lease) (*record, error) {
	if r == nil {
		return nil, fmt.Errorf("%w: no record", idem.ErrLeaseLost)
	}
	if r.state != idem.StateInProgress || r.owner != lease.Owner || r.fence != lease.Fence {
		return nil, fmt.Errorf("%w: record is %v with fence %d", idem.ErrLeaseLost, r.state, r.fence)
	}
	return r, nil
}

func checkOwner(ctx context.Context, key string, lease idem.Lease) error {
	if err := idem.ValidateStoreKey(key); err != nil {
		return err
	}
	if err := idem.ValidateLease(lease); err != nil {
		return err
	}
	return ctx.Err()
}

// Complete implements idem.Store. The store keeps result without copying it:
// the caller must not modify it afterwards.
func (s *Store) Complete(ctx context.Context, key string, lease idem.Lease, result []byte, retention time.Duration) error {
	if err := checkOwner(ctx, key, lease); err != nil {
		return err
	}
	if err := idem.ValidateDuration("retention", retention); err != nil {
		return err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	now := s.micros()
	r := s.lookup(key, now)
	if r != nil && r.state == idem.StateCompleted && r.fence == lease.Fence && bytes.Equal(r.result, result) {
		return nil // a repeated call whose reply was lost
	}
	r, err := owned(r, lease)
	if err != nil {
		return err
	}
	r.state, r.result, r.leaseUntil = idem.StateCompleted, result, 0
	r.expiresAt = now + retention.Microseconds()
	s.notify(key)
	return nil
}

// RelayCompletion implements idem.Relayer. The store keeps c.Result
// without copying it.
func (s *Store) RelayCompletion(ctx context.Context, key string, c idem.Completion) error {
	if err := idem.ValidateStoreKey(key); err != nil {
		return err
	}
	if err := c.Validate(); err != nil {
		return err
	}
	if err := ctx.Err(); err != nil {
		return err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	now := s.micros()
	r := s.lookup(key, now)
	if r == nil {
		s.sweep(now)
		r = &record{attempts: 1, created: now}
		s.records[key] = r
	} else if r.state == idem.StateCompleted {
		return nil // the first completion stays
	}
	r.state, r.fingerprint, r.owner, r.result, r.leaseUntil = idem.StateCompleted, c.Fingerprint, "", c.Result, 0
	r.fence = max(r.fence, c.Fence)
	s.lastFence = max(s.lastFence, r.fence)
	r.expiresAt = now + c.Retention.Microseconds()
	s.notify(key)
	return nil
}

// Fail implements idem.Store.
func (s *Store) Fail(ctx context.Context, key string, lease idem.Lease, f idem.Failure) (idem.State, error) {
	if err := checkOwner(ctx, key, lease); err != nil {
		return 0, err
	}
	if err := f.Validate(); err != nil {
		return 0, err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	now := s.micros()
	r := s.lookup(key, now)
	if r != nil && (r.state == idem.StateReleased || r.state == idem.StateFailed) && r.fence == lease.Fence {
		return r.state, nil // a repeated call whose reply was lost
	}
	r, err := owned(r, lease)
	if err != nil {
		return 0, err
	}
	r.leaseUntil = 0
	r.expiresAt = now + f.Retention.Microseconds()
	if f.Terminal || (f.MaxAttempts > 0 && r.attempts >= f.MaxAttempts) {
		r.state, r.result = idem.StateFailed, f.Result
	} else {
		r.state, r.result = idem.StateReleased, nil
	}
	s.notify(key)
	return r.state, nil
}

// Extend implements idem.Store.
func (s *Store) Extend(ctx context.Context, key string, lease idem.Lease, d time.Duration) error {
	if err := checkOwner(ctx, key, lease); err != nil {
		return err
	}
	if err := idem.ValidateDuration("lease", d); err != nil {
		return err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	now := s.micros()
	r, err := owned(s.lookup(key, now), lease)
	if err != nil {
		return err
	}
	r.leaseUntil = now + d.Microseconds()
	r.expiresAt = r.leaseUntil + d.Microseconds() + grace
	return nil
}

// Release implements idem.Store.
func (s *Store) Release(ctx context.Context, key string, lease idem.Lease, retention time.Duration) error {
	if err := checkOwner(ctx, key, lease); err != nil {
		return err
	}
	if err := idem.ValidateDuration("retention", retention); err != nil {
		return err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	now := s.micros()
	r := s.lookup(key, now)
	if r != nil && r.state == idem.StateReleased && r.fence == lease.Fence {
		return nil // a repeated call whose reply was lost
	}
	r, err := owned(r, lease)
	if err != nil {
		return err
	}
	r.state, r.leaseUntil, r.result = idem.StateReleased, 0, nil
	r.expiresAt = now + retention.Microseconds()
	s.notify(key)
	return nil
}

// Get implements idem.Store. The returned Result is a copy.
func (s *Store) Get(ctx context.Context, key string) (idem.Record, error) {
	if err := idem.ValidateStoreKey(key); err != nil {
		return idem.Record{}, err
	}
	if err := ctx.Err(); err != nil {
		return idem.Record{}, err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	now := s.micros()
	r := s.lookup(key, now)
	if r == nil {
		return idem.Record{}, idem.ErrNotFound
	}
	rec := idem.Record{
		State:       r.state,
		Fingerprint: r.fingerprint,
		Owner:       r.owner,
		Fence:       r.fence,
		Attempts:    r.attempts,
		Created:     time.UnixMicro(r.created),
		ExpiresAt:   time.UnixMicro(r.expiresAt),
		Now:         time.UnixMicro(now),
		Result:      append([]byte(nil), r.result...),
	}
	if r.state == idem.StateInProgress {
		rec.LeaseUntil = time.UnixMicro(r.leaseUntil)
	}
	return rec, nil
}

// Delete implements idem.Store.
func (s *Store) Delete(ctx context.Context, key string) error {
	if err := idem.ValidateStoreKey(key); err != nil {
		return err
	}
	if err := ctx.Err(); err != nil {
		return err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	delete(s.records, key)
	s.notify(key)
	return nil
}

// notify wakes the watchers of key. It is called with s.mu held.
func (s *Store) notify(key string) {
	if len(s.watchers) == 0 {
		return
	}
	if w, ok := s.watchers[key]; ok {
		close(w.ch)
		delete(s.watchers, key)
	}
}

// watch is the channel the watchers of one key share, and how many they are.
type watch struct {
	ch chan struct{}
	n  int
}

// Watch implements idem.Watcher.
func (s *Store) Watch(ctx context.Context, key string) (<-chan struct{}, func(), error) {
	if err := idem.ValidateStoreKey(key); err != nil {
		return nil, nil, err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	w, ok := s.watchers[key]
	if !ok {
		w = &watch{ch: make(chan struct{})}
		s.watchers[key] = w
	}
	w.n++
	var once sync.Once
	stop := func() {
		once.Do(func() {
			s.mu.Lock()
			defer s.mu.Unlock()
			// The key's watch may have been notified and replaced since.
			if cur, ok := s.watchers[key]; ok && cur == w {
				if w.n--; w.n == 0 {
					delete(s.watchers, key)
				}
			}
		})
	}
	return w.ch, stop, nil
}
