package redisstore_test

import (
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/idemgo/idem"
	"github.com/idemgo/idem/internal/redistest"
	"github.com/idemgo/idem/redisstore"
)

// pubsubClients returns the number of the server's client connections in
// pub/sub mode.
func pubsubClients(t *testing.T, srv *redistest.Server) int {
	t.Helper()
	list, err := srv.Command("CLIENT", "LIST", "TYPE", "pubsub")
	if err != nil {
		t.Fatal(err)
	}
	return strings.Count(list, "id=")
}

// waitFor polls cond (a server-side count) until it holds, for at most 10s.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("not reached in 10s: %s", what)
		}
		time.Sleep(5 * time.Millisecond) // poll the server's view
	}
}

// TestWatchesShareOneConnection holds 50 watches, on 25 channels, of one
// go-redis store at once: the server sees one pub/sub connection, every
// watch is woken by a publish on its own channel only, and once the last
// watch stops the connection is gone.
func TestWatchesShareOneConnection(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t)
	s, err := redisstore.New(goRedisClient(t, srv.Addr()))
	if err != nil {
		t.Fatal(err)
	}
	type watch struct {
		key     string
		changed <-chan struct{}
		stop    func()
	}
	var watches []watch
	for i := range 50 {
		key := idem.Key{ID: fmt.Sprint("k", i%25)}.Digest()
		ch, stop, err := s.Watch(t.Context(), key)
		if err != nil {
			t.Fatal(err)
		}
		watches = append(watches, watch{key, ch, stop})
	}
	if n := pubsubClients(t, srv); n != 1 {
		t.Fatalf("%d pub/sub connections for 50 watches, want 1", n)
	}
	// Publish on the first 10 channels only.
	for i := range 10 {
		if _, err := srv.Command("PUBLISH", s.Key(idem.Key{ID: fmt.Sprint("k", i)}.Digest())+":w", "c"); err != nil {
			t.Fatal(err)
		}
	}
	for i, w := range watches {
		if i%25 < 10 {
			select {
			case <-w.changed:
			case <-time.After(5 * time.Second):
				t.Fatalf("watch %d not woken by the publish on its channel", i)
			}
		}
	}
	for i, w := range watches {
		if i%25 >= 10 {
			select {
			case <-w.changed:
				t.Fatalf("watch %d woken, but nothing was published on its channel", i)
			default:
			}
		}
		w.stop()
	}
	waitFor(t, "no pub/sub connection once every watch stopped", func() bool { return pubsubClients(t, srv) == 0 })
}

// TestWatchCyclesNeverMissAPublish watches, publishes and stops one
// channel many times from several goroutines: a watch that returned is
// subscribed, so the publish that follows always wakes it, even while other
// watches of the channel unsubscribe and subscribe again.
func TestWatchCyclesNeverMissAPublish(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t)
	rdb := goRedisClient(t, srv.Addr())
	s, err := redisstore.New(rdb)
	if err != nil {
		t.Fatal(err)
	}
	key := idem.Key{ID: "cycled"}.Digest()
	var wg sync.WaitGroup
	for g := range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range 100 {
				ch, stop, err := s.Watch(t.Context(), key)
				if err != nil {
					t.Error(err)
					return
				}
				if err := rdb.Publish(t.Context(), s.Key(key)+":w", "c").Err(); err != nil {
					t.Error(err)
					return
				}
				select {
				case <-ch:
				case <-time.After(5 * time.Second):
					t.Errorf("goroutine %d, cycle %d: a publish after Watch returned did not wake it", g, i)
				}
				stop()
			}
		}()
	}
	wg.Wait()
	waitFor(t, "no pub/sub connection once every watch stopped", func() bool { return pubsubClients(t, srv) == 0 })
}

// TestWatchConnectionKilled kills the shared subscriber connection: every
// watch is woken (its caller reads the record again), and the next watch
// opens a new connection that works.
func TestWatchConnectionKilled(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t)
	s, err := redisstore.New(goRedisClient(t, srv.Addr()))
	if err != nil {
		t.Fatal(err)
	}
	var chans []<-chan struct{}
	for i := range 5 {
		ch, stop, err := s.Watch(t.Context(), idem.Key{ID: fmt.Sprint("k", i)}.Digest())
		if err != nil {
			t.Fatal(err)
		}
		defer stop()
		chans = append(chans, ch)
	}
	if _, err := srv.Command("CLIENT", "KILL", "TYPE", "pubsub"); err != nil {
		t.Fatal(err)
	}
	for i, ch := range chans {
		select {
		case <-ch:
		case <-time.After(5 * time.Second):
			t.Fatalf("watch %d not woken when its connection was killed", i)
		}
	}
	key := idem.Key{ID: "after"}.Digest()
	ch, stop, err := s.Watch(t.Context(), key)
	if err != nil {
		t.Fatal(err)
	}
	defer stop()
	if _, err := srv.Command("PUBLISH", s.Key(key)+":w", "c"); err != nil {
		t.Fatal(err)
	}
	select {
	case <-ch:
	case <-time.After(5 * time.Second):
		t.Fatal("a watch on the new connection was not woken")
	}
}
