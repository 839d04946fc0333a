package boltstore

import (
	"context"
	"sync"

	"github.com/idemgo/idem"
)

// watch is the channel shared by the watchers of one key.
type watch struct {
	ch chan struct{}
	n  int // watchers that have not called stop
}

// Watch implements idem.Watcher within this process: the returned channel
// is closed once Complete, Fail, Release or Delete of key is committed
// after Watch returned, or when the store is closed. stop releases the
// watch; it must be called and may be called more than once.
func (s *Store) Watch(ctx context.Context, key string) (<-chan struct{}, func(), error) {
	if err := idem.ValidateStoreKey(key); err != nil {
		return nil, nil, err
	}
	s.mu.RLock()
	defer s.mu.RUnlock()
	if s.closed {
		return nil, nil, ErrClosed
	}
	s.wmu.Lock()
	defer s.wmu.Unlock()
	w := s.watchers[key]
	if w == nil {
		w = &watch{ch: make(chan struct{})}
		s.watchers[key] = w
	}
	w.n++
	var once sync.Once
	stop := func() {
		once.Do(func() {
			s.wmu.Lock()
			defer s.wmu.Unlock()
			if w.n--; w.n == 0 && s.watchers[key] == w {
				delete(s.watchers, key)
			}
		})
	}
	return w.ch, stop, nil
}

// wake closes the channels of the watchers of keys. The writer calls it
// after the commit that changed them.
func (s *Store) wake(keys []string) {
	if len(keys) == 0 {
		return
	}
	s.wmu.Lock()
	defer s.wmu.Unlock()
	for _, k := range keys {
		if w := s.watchers[k]; w != nil {
			close(w.ch)
			delete(s.watchers, k)
		}
	}
}
