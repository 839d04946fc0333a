package watchset

import (
	"sync"
	"testing"
)

func closed(ch <-chan struct{}) bool {
	select {
	case <-ch:
		return true
	default:
		return false
	}
}

// TestWakeAndStop: the watchers of a key share its channel; Wake closes it
// and forgets it, so a later watch gets a new one; stop releases a watch
// once however often it is called, and the last stop forgets the key; a
// stopped watch's channel is not closed by a later Wake.
func TestWakeAndStop(t *testing.T) {
	var s Set
	s.Wake("k") // nothing watched
	a, stopA := s.Add("k")
	b, stopB := s.Add("k")
	other, stopOther := s.Add("other")
	defer stopOther()
	if a != b {
		t.Fatal("two watches of one key have different channels")
	}
	if s.Len() != 2 {
		t.Fatalf("Len %d, want 2", s.Len())
	}
	s.Wake("k")
	if !closed(a) || closed(other) {
		t.Fatalf("after Wake(k): k closed %v, other closed %v", closed(a), closed(other))
	}
	c, stopC := s.Add("k")
	if closed(c) {
		t.Fatal("a watch added after Wake got the woken channel")
	}
	// Stopping the woken watches does not release the new one.
	stopA()
	stopB()
	stopB()
	if s.Len() != 2 {
		t.Fatalf("Len %d after stopping woken watches, want 2", s.Len())
	}
	d, stopD := s.Add("k")
	stopC()
	stopC()
	if s.Len() != 2 {
		t.Fatalf("Len %d after one of two stops, want 2", s.Len())
	}
	stopD()
	if s.Len() != 1 {
		t.Fatalf("Len %d after every stop of k, want 1", s.Len())
	}
	s.Wake("k")
	if closed(d) {
		t.Fatal("a stopped watch's channel was closed by a later Wake")
	}
}

// TestClose: Close wakes every watch, and a watch added after it is woken
// at once.
func TestClose(t *testing.T) {
	var s Set
	a, stopA := s.Add("a")
	defer stopA()
	s.Close()
	if !closed(a) || !s.Closed() || s.Len() != 0 {
		t.Fatalf("after Close: woken %v, Closed %v, Len %d", closed(a), s.Closed(), s.Len())
	}
	b, stopB := s.Add("b")
	stopB()
	if !closed(b) {
		t.Fatal("a watch added after Close is not woken")
	}
}

// TestConcurrent: watches, stops and wakes from many goroutines keep the
// count right (run with -race).
func TestConcurrent(t *testing.T) {
	var s Set
	var wg sync.WaitGroup
	for i := range 8 {
		wg.Go(func() {
			for j := range 1000 {
				key := string(rune('a' + (i+j)%4))
				_, stop := s.Add(key)
				if j%3 == 0 {
					s.Wake(key)
				}
				stop()
			}
		})
	}
	wg.Wait()
	if s.Len() != 0 {
		t.Fatalf("Len %d after every stop, want 0", s.Len())
	}
}
