package memstore

import (
	"context"
	"testing"
	"time"

	"github.com/idemgo/idem/storekit"
)

func TestWatchStopForgetsTheKey(t *testing.T) {
	s, _ := New()
	ctx := context.Background()
	_, stop1, _ := s.Watch(ctx, "k")
	ch2, stop2, _ := s.Watch(ctx, "k")
	stop1()
	stop1() // idempotent
	if n := s.watchers.Len(); n != 1 {
		t.Fatalf("watchers after one of two stops: got %d, want 1", n)
	}
	stop2()
	if n := s.watchers.Len(); n != 0 {
		t.Fatalf("watchers after every stop: got %d, want 0", n)
	}
	// A notification still reaches a live watcher.
	ch3, stop3, _ := s.Watch(ctx, "k")
	defer stop3()
	a, err := s.Acquire(ctx, "k", storekit.AcquireRequest{Owner: "o", Lease: time.Minute, Retention: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Complete(ctx, "k", a.Lease, []byte("r"), time.Hour); err != nil {
		t.Fatal(err)
	}
	select {
	case <-ch3:
	default:
		t.Fatal("a live watcher was not notified")
	}
	select {
	case <-ch2:
		t.Fatal("a stopped watcher's channel was closed by a later notification")
	default:
	}
}
