package chaostest

import (
	"testing"
	"time"

	"github.com/idemgo/idem"
	"github.com/idemgo/idem/internal/redistest"
	"github.com/idemgo/idem/redisstore"
	"github.com/redis/go-redis/v9"
)

// StartRedisExecutor starts a redis-server for the test and returns a
// go-redis client on it (closed when the test ends) and an Executor with
// the given lease on a redisstore of that client.
func StartRedisExecutor(t testing.TB, lease time.Duration) (*redis.Client, *idem.Executor) {
	t.Helper()
	srv := redistest.Start(t)
	rdb := redis.NewClient(&redis.Options{Addr: srv.Addr()})
	t.Cleanup(func() { rdb.Close() })
	store, err := redisstore.New(rdb)
	if err != nil {
		t.Fatal(err)
	}
	exec, err := idem.New(store, idem.WithLease(lease))
	if err != nil {
		t.Fatal(err)
	}
	return rdb, exec
}
