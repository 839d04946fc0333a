package idem_test

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idemgo/idem"
	"github.com/idemgo/idem/memstore"
)

// countingWatcher is memstore counting its Watch calls.
type countingWatcher struct {
	*memstore.Store
	watches atomic.Int32
}

func (s *countingWatcher) Watch(ctx context.Context, key string) (<-chan struct{}, func(), error) {
	s.watches.Add(1)
	return s.Store.Watch(ctx, key)
}

// Await uses the Watcher beneath a wrapper that unwraps to it, rather than
// polling.
func TestAwaitWatchesThroughWrapper(t *testing.T) {
	m, err := memstore.New()
	if err != nil {
		t.Fatal(err)
	}
	s := &countingWatcher{Store: m}
	exec, err := idem.New(unwrapping{wrapped{s}})
	if err != nil {
		t.Fatal(err)
	}
	key := idem.Key{ID: "k"}
	_, a, err := exec.Begin(t.Context(), key, "")
	if err != nil {
		t.Fatal(err)
	}
	awaited := make(chan error, 1)
	go func() { awaited <- exec.Await(t.Context(), key) }()
	deadline := time.Now().Add(10 * time.Second)
	for s.watches.Load() == 0 {
		if time.Now().After(deadline) {
			t.Fatal("Await never called Watch on the store beneath the wrapper")
		}
		time.Sleep(time.Millisecond)
	}
	if err := a.Commit(t.Context(), []byte("v")); err != nil {
		t.Fatal(err)
	}
	if err := <-awaited; err != nil {
		t.Fatalf("Await: %v", err)
	}
}
