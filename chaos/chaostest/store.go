package chaostest

import (
	"testing"
	"time"

	"github.com/idemgo/idem"
	"github.com/idemgo/idem/redisstore"
	"github.com/idemgo/idem/testkit/redistest"
	"github.com/redis/go-redis/v9"
	"github.com/redis/rueidis"
)

// GoRedisStore returns a redisstore with opts on the go-redis client c, and
// closes c when the test ends.
func GoRedisStore(t testing.TB, c redis.UniversalClient, opts ...redisstore.Option) *redisstore.Store {
	t.Helper()
	t.Cleanup(func() { c.Close() })
	s, err := redisstore.New(c, opts...)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// RueidisStore returns a redisstore with opts on a new rueidis client with
// option o, and the client (closed when the test ends).
func RueidisStore(t testing.TB, o rueidis.ClientOption, opts ...redisstore.Option) (*redisstore.Store, rueidis.Client) {
	t.Helper()
	c, err := rueidis.NewClient(o)
	if err != nil {
		t.Fatalf("rueidis client for %v: %v", o.InitAddress, err)
	}
	t.Cleanup(c.Close)
	s, err := redisstore.NewRueidis(c, opts...)
	if err != nil {
		t.Fatal(err)
	}
	return s, c
}

// NewRedisExecutor returns an Executor with the given lease on a
// redisstore of rdb: what the scenarios' child processes, which have no
// testing.T, run on.
func NewRedisExecutor(rdb redis.UniversalClient, lease time.Duration) (*idem.Executor, error) {
	store, err := redisstore.New(rdb)
	if err != nil {
		return nil, err
	}
	return idem.New(store, idem.WithLease(lease))
}

// StartRedisExecutor starts a redis-server for the test and returns a
// go-redis client on it (closed when the test ends) and an Executor with
// the given lease on a redisstore of that client.
func StartRedisExecutor(t testing.TB, lease time.Duration) (*redis.Client, *idem.Executor) {
	t.Helper()
	srv := redistest.Start(t)
	rdb := redis.NewClient(&redis.Options{Addr: srv.Addr()})
	t.Cleanup(func() { rdb.Close() })
	exec, err := NewRedisExecutor(rdb, lease)
	if err != nil {
		t.Fatal(err)
	}
	return rdb, exec
}
