package redisstore_test

import (
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/idemgo/idem"
	"github.com/idemgo/idem/redisstore"
	"github.com/idemgo/idem/testkit/redistest"
)

// subscribers returns the IDs of the server's client connections
// subscribed to a channel (CLIENT LIST's sub or ssub above 0, whatever the
// protocol version: CLIENT LIST TYPE pubsub misses RESP3 ones).
func subscribers(t *testing.T, srv *redistest.Server) []string {
	t.Helper()
	list, err := srv.Command("CLIENT", "LIST")
	if err != nil {
		t.Fatal(err)
	}
	var ids []string
	for _, line := range strings.Split(list, "\n") {
		var id string
		subscribed, tracking := false, false
		for _, f := range strings.Fields(line) {
			if v, ok := strings.CutPrefix(f, "id="); ok {
				id = v
			}
			if (strings.HasPrefix(f, "sub=") || strings.HasPrefix(f, "ssub=")) && !strings.HasSuffix(f, "=0") {
				subscribed = true
			}
			if f == "name=idem-tracking" { // the replay cache's (internal/goredis/tracking.go)
				tracking = true
			}
		}
		if subscribed && !tracking {
			ids = append(ids, id)
		}
	}
	return ids
}

// pubsubClients returns the number of subscribed connections.
func pubsubClients(t *testing.T, srv *redistest.Server) int { return len(subscribers(t, srv)) }

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
// standalone store (go-redis, rueidis, valkey-go) at once: the server sees one pub/sub
// connection, every watch is woken by a publish on its own channel only,
// and once the last watch stops the connection is gone.
func TestWatchesShareOneConnection(t *testing.T) {
	t.Parallel()
	onEachStandaloneClient(t, testWatchesShareOneConnection)
}

// onEachStandaloneClient runs test once per standalone client of clients,
// in a subtest, on a redis-server of its own.
func onEachStandaloneClient(t *testing.T, test func(t *testing.T, srv *redistest.Server, s *redisstore.Store)) {
	for _, name := range []string{"standalone/go-redis", "standalone/rueidis", "standalone/valkey"} {
		t.Run(name, func(t *testing.T) {
			srv := redistest.Start(t)
			for _, c := range clients(t, srv, nil) {
				if c.name == name {
					test(t, srv, c.newStore(t))
					return
				}
			}
			t.Fatalf("no client %s", name)
		})
	}
}

func testWatchesShareOneConnection(t *testing.T, srv *redistest.Server, s *redisstore.Store) {
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
	onEachStandaloneClient(t, testWatchCyclesNeverMissAPublish)
}

func testWatchCyclesNeverMissAPublish(t *testing.T, srv *redistest.Server, s *redisstore.Store) {
	rdb := goRedisClient(t, srv.Addr())
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
	onEachStandaloneClient(t, testWatchConnectionKilled)
}

func testWatchConnectionKilled(t *testing.T, srv *redistest.Server, s *redisstore.Store) {
	var chans []<-chan struct{}
	for i := range 5 {
		ch, stop, err := s.Watch(t.Context(), idem.Key{ID: fmt.Sprint("k", i)}.Digest())
		if err != nil {
			t.Fatal(err)
		}
		defer stop()
		chans = append(chans, ch)
	}
	killSubscribers(t, srv, true)
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

// killSubscribers kills the server's subscribed connections and returns
// how many; with must, it fails the test if there was none.
func killSubscribers(t *testing.T, srv *redistest.Server, must bool) int {
	t.Helper()
	ids := subscribers(t, srv)
	for _, id := range ids {
		if _, err := srv.Command("CLIENT", "KILL", "ID", id); err != nil {
			t.Fatal(err)
		}
	}
	if must && len(ids) == 0 {
		t.Fatal("no subscribed connection to kill")
	}
	return len(ids)
}

// TestWatchConnectionKilledCluster: on a Cluster each watch has its own
// connection; killing them wakes every watch, for both clients.
func TestWatchConnectionKilledCluster(t *testing.T) {
	t.Parallel()
	cluster := redistest.StartCluster(t, 3)
	for _, cl := range clients(t, nil, cluster) {
		t.Run(cl.name, func(t *testing.T) {
			s := cl.newStore(t)
			var chans []<-chan struct{}
			for i := range 5 {
				ch, stop, err := s.Watch(t.Context(), idem.Key{ID: fmt.Sprint(cl.name, i)}.Digest())
				if err != nil {
					t.Fatal(err)
				}
				defer stop()
				chans = append(chans, ch)
			}
			killed := 0
			for _, n := range cluster.Nodes() {
				killed += killSubscribers(t, n, false)
			}
			if killed != len(chans) {
				t.Fatalf("killed %d subscribed connections, want one per watch (%d)", killed, len(chans))
			}
			for i, ch := range chans {
				select {
				case <-ch:
				case <-time.After(5 * time.Second):
					t.Fatalf("watch %d not woken when its connection was killed", i)
				}
			}
		})
	}
}
