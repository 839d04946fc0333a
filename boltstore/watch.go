package boltstore

import (
	"context"

	"github.com/idemgo/idem/storekit"
)

// Watch implements storekit.Watcher within this process: the returned channel
// is closed once Complete, Fail, Release or Delete of key is committed
// after Watch returned, or when the store is closed. stop releases the
// watch; it must be called and may be called more than once.
func (s *Store) Watch(ctx context.Context, key string) (<-chan struct{}, func(), error) {
	if err := storekit.ValidateStoreKey(key); err != nil {
		return nil, nil, err
	}
	s.mu.RLock()
	defer s.mu.RUnlock()
	if s.closed {
		return nil, nil, ErrClosed
	}
	ch, stop := s.watchers.Add(key)
	return ch, stop, nil
}

// wake closes the channels of the watchers of keys. The writer calls it
// after the commit that changed them.
func (s *Store) wake(keys []string) { s.watchers.Wake(keys...) }
