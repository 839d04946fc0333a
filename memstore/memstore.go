package memstore

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/idemgo/idem"
	"github.com/idemgo/idem/storekit"
	"github.com/idemgo/idem/storekit/statemachine"
	"github.com/idemgo/idem/storekit/watchset"
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

// Store is an in-process storekit.Store: a map guarded by a mutex. The zero value
// is not usable; call New. It is safe for concurrent use.
type Store struct {
	now      func() time.Time
	capacity int

	mu        sync.Mutex
	records   map[string]*statemachine.Record
	lastFence int64
	writes    int
	watchers  watchset.Set
}

var (
	_ storekit.Store      = (*Store)(nil)
	_ storekit.Watcher    = (*Store)(nil)
	_ storekit.Relayer    = (*Store)(nil)
	_ storekit.StatsStore = (*Store)(nil)
)

// New returns an empty Store.
func New(opts ...Option) (*Store, error) {
	s := &Store{now: time.Now}
	for _, o := range opts {
		o(s)
	}
	if s.now == nil {
		return nil, fmt.Errorf("%w: nil clock", idem.ErrInvalid)
	}
	if s.capacity < 0 {
		return nil, fmt.Errorf("%w: negative capacity %d", idem.ErrInvalid, s.capacity)
	}
	s.records = make(map[string]*statemachine.Record, s.capacity)
	return s, nil
}

// Len returns the number of records held, expired ones that were not swept
// yet included.
func (s *Store) Len() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.records)
}

// Stats implements storekit.StatsStore: it counts every live record, holding
// the store's lock meanwhile (about 10ns per record). Memory is not
// reported.
func (s *Store) Stats(ctx context.Context) (storekit.Stats, error) {
	var st storekit.Stats
	s.mu.Lock()
	defer s.mu.Unlock()
	now := s.micros()
	for _, r := range s.records {
		if r.ExpiresAt > now {
			st.Count(r.State, time.UnixMicro(r.Created), time.UnixMicro(now))
		}
	}
	return st, nil
}

func (s *Store) micros() int64 { return s.now().UnixMicro() }

// lookup returns the live record for key, dropping an expired one. It is
// called with s.mu held.
func (s *Store) lookup(key string, now int64) *statemachine.Record {
	r := s.records[key]
	if r != nil && r.ExpiresAt <= now {
		delete(s.records, key)
		return nil
	}
	return r
}

// put stores next as key's record, in place of cur (nil for a new record),
// and keeps the last fence handed out. It is called with s.mu held.
func (s *Store) put(key string, cur *statemachine.Record, next statemachine.Record, now int64) {
	s.lastFence = max(s.lastFence, next.Fence)
	if cur != nil {
		*cur = next
		return
	}
	s.sweep(now)
	// A copy declared here: taking next's address would move the parameter
	// to the heap on every call, the in-place updates too.
	rec := next
	s.records[key] = &rec
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
		if r.ExpiresAt <= now {
			delete(s.records, k)
		}
		if n++; n == 64 {
			return
		}
	}
}

// Acquire implements storekit.Store.
func (s *Store) Acquire(ctx context.Context, key string, req storekit.AcquireRequest) (storekit.Acquisition, error) {
	if err := statemachine.CheckAcquire(ctx, key, req); err != nil {
		return storekit.Acquisition{}, err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	now := s.micros()
	r := s.lookup(key, now)
	next, changed, out := statemachine.Acquire(r, req, now, s.lastFence)
	if changed {
		s.put(key, r, next, now)
	}
	return out, nil
}

// Complete implements storekit.Store. The store keeps result without copying it:
// the caller must not modify it afterwards.
func (s *Store) Complete(ctx context.Context, key string, lease storekit.Lease, result []byte, retention time.Duration) error {
	if err := statemachine.CheckOwned(ctx, key, lease, "retention", retention); err != nil {
		return err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	now := s.micros()
	r := s.lookup(key, now)
	next, changed, err := statemachine.Complete(r, lease, result, retention, now)
	if changed {
		s.put(key, r, next, now)
		s.notify(key)
	}
	return err
}

// RelayCompletion implements storekit.Relayer. The store keeps c.Result
// without copying it.
func (s *Store) RelayCompletion(ctx context.Context, key string, c storekit.Completion) error {
	if err := statemachine.CheckRelay(ctx, key, c); err != nil {
		return err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	now := s.micros()
	r := s.lookup(key, now)
	if next, changed := statemachine.Relay(r, c, now); changed {
		s.put(key, r, next, now)
		s.notify(key)
	}
	return nil
}

// Fail implements storekit.Store.
func (s *Store) Fail(ctx context.Context, key string, lease storekit.Lease, f storekit.Failure) (storekit.State, error) {
	if err := statemachine.CheckOwned(ctx, key, lease, "", 0); err != nil {
		return 0, err
	}
	if err := f.Validate(); err != nil {
		return 0, err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	now := s.micros()
	r := s.lookup(key, now)
	next, changed, state, err := statemachine.Fail(r, lease, f, now)
	if changed {
		s.put(key, r, next, now)
		s.notify(key)
	}
	return state, err
}

// Extend implements storekit.Store.
func (s *Store) Extend(ctx context.Context, key string, lease storekit.Lease, d time.Duration) error {
	if err := statemachine.CheckOwned(ctx, key, lease, "lease", d); err != nil {
		return err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	now := s.micros()
	r := s.lookup(key, now)
	next, err := statemachine.Extend(r, lease, d, now)
	if err != nil {
		return err
	}
	s.put(key, r, next, now)
	return nil
}

// Release implements storekit.Store.
func (s *Store) Release(ctx context.Context, key string, lease storekit.Lease, retention time.Duration) error {
	if err := statemachine.CheckOwned(ctx, key, lease, "retention", retention); err != nil {
		return err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	now := s.micros()
	r := s.lookup(key, now)
	next, changed, err := statemachine.Release(r, lease, retention, now)
	if changed {
		s.put(key, r, next, now)
		s.notify(key)
	}
	return err
}

// Get implements storekit.Store. The returned Result is a copy.
func (s *Store) Get(ctx context.Context, key string) (storekit.Record, error) {
	if err := storekit.ValidateStoreKey(key); err != nil {
		return storekit.Record{}, err
	}
	if err := ctx.Err(); err != nil {
		return storekit.Record{}, err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	now := s.micros()
	r := s.lookup(key, now)
	if r == nil {
		return storekit.Record{}, storekit.ErrNotFound
	}
	return r.Public(now), nil
}

// Delete implements storekit.Store.
func (s *Store) Delete(ctx context.Context, key string) error {
	if err := storekit.ValidateStoreKey(key); err != nil {
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
func (s *Store) notify(key string) { s.watchers.Wake(key) }

// Watch implements storekit.Watcher. It registers the watch with s.mu held, so
// that a change committed after Watch returned wakes it.
func (s *Store) Watch(ctx context.Context, key string) (<-chan struct{}, func(), error) {
	if err := storekit.ValidateStoreKey(key); err != nil {
		return nil, nil, err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	ch, stop := s.watchers.Add(key)
	return ch, stop, nil
}
