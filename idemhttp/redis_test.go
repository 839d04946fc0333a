package idemhttp_test

import (
	"testing"

	"github.com/idemgo/idem/idemhttp"

	"github.com/idemgo/idem"
	"github.com/idemgo/idem/internal/redistest"
	"github.com/idemgo/idem/redisstore"
	"github.com/redis/go-redis/v9"
)

// TestRedis runs the whole suite against a real redis-server.
func TestRedis(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t)
	runSuite(t, func(t *testing.T) idem.Store {
		c := srv.GoRedis(t)
		s, err := redisstore.New(c, redisstore.WithPrefix("t"+t.Name()+":"))
		if err != nil {
			t.Fatal(err)
		}
		return s
	})
}

// TestRedisDown kills redis-server: requests get 503 (fail closed) or, with
// fail-open, reach the handler; after a restart the middleware works again.
func TestRedisDown(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t)
	c := redis.NewClient(&redis.Options{Addr: srv.Addr(), MaxRetries: -1})
	t.Cleanup(func() { c.Close() })
	s, err := redisstore.New(c)
	if err != nil {
		t.Fatal(err)
	}
	var cnt counter
	h := newMiddleware(t, newExecutor(t, s)).Handler(&cnt)
	if res := post(h, "a", "x"); res.status != 201 {
		t.Fatalf("got %d", res.status)
	}
	srv.Kill(t)
	res := post(h, "b", "x")
	checkProblem(t, res, 503, idemhttp.TypeStoreUnavailable)
	open := newMiddleware(t, newExecutor(t, s), idemhttp.WithFailOpen(true)).Handler(&cnt)
	if res := post(open, "b", "x"); res.status != 201 {
		t.Errorf("fail open: got %d", res.status)
	}
	srv.Restart(t)
	// The server kept nothing on disk: the key runs again, and its retry
	// replays.
	if res := post(h, "c", "x"); res.status != 201 {
		t.Fatalf("after restart: got %d, want 201", res.status)
	}
	if res := post(h, "c", "x"); res.header.Get(idemhttp.ReplayedHeader) != "true" {
		t.Fatalf("retry after restart: got %d %q, want a replay", res.status, res.body)
	}
}
