// Package watchset is the registry of in-process watches shared by the
// stores that wake their own waiters (memstore, boltstore, pgstore): the
// watchers of one key share one channel, closed by the next Wake of the key
// (and then forgotten, so that a later watch gets a new channel), or by
// Close.
//
// It is public, beside storekit, so that a store in another module
// (postgres/pgstore) or outside the repository shares it.
package watchset

import (
	"sync"
	"sync/atomic"
)

// Set is the watches of a store. The zero Set is empty and ready to use.
type Set struct {
	live atomic.Int64 // keys watched, for Wake's fast path

	mu     sync.Mutex
	m      map[string]*watch
	closed bool
}

// watch is the channel the watchers of one key share, and how many they are.
type watch struct {
	ch chan struct{}
	n  int
}

// closedCh is returned by Add after Close.
var closedCh = func() chan struct{} { c := make(chan struct{}); close(c); return c }()

// Add registers a watch of key. The returned channel is closed by the next
// Wake of key or by Close; after Close it is closed already. stop releases
// the watch; it must be called, and may be called more than once.
func (s *Set) Add(key string) (<-chan struct{}, func()) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return closedCh, func() {}
	}
	if s.m == nil {
		s.m = make(map[string]*watch)
	}
	w := s.m[key]
	if w == nil {
		w = &watch{ch: make(chan struct{})}
		s.m[key] = w
		s.live.Add(1)
	}
	w.n++
	var once sync.Once
	return w.ch, func() {
		once.Do(func() {
			s.mu.Lock()
			defer s.mu.Unlock()
			// The key's watch may have been woken, and replaced, since.
			if s.m[key] == w {
				if w.n--; w.n == 0 {
					delete(s.m, key)
					s.live.Add(-1)
				}
			}
		})
	}
}

// Wake closes the channels of the watchers of keys. It costs one atomic
// load when nothing is watched.
func (s *Set) Wake(keys ...string) {
	if len(keys) == 0 || s.live.Load() == 0 {
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, k := range keys {
		if w := s.m[k]; w != nil {
			close(w.ch)
			delete(s.m, k)
			s.live.Add(-1)
		}
	}
}

// Close wakes every watch; later Adds get a closed channel.
func (s *Set) Close() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.closed = true
	for k, w := range s.m {
		close(w.ch)
		delete(s.m, k)
	}
	s.live.Store(0)
}

// Closed reports whether Close was called.
func (s *Set) Closed() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.closed
}

// Len returns the number of keys watched.
func (s *Set) Len() int { return int(s.live.Load()) }
