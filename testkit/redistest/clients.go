package redistest

import (
	"testing"

	"github.com/redis/go-redis/v9"
	"github.com/redis/rueidis"
)

// GoRedis returns a go-redis client of s with default options, closed when
// the test ends.
func (s *Server) GoRedis(t testing.TB) *redis.Client {
	t.Helper()
	c := redis.NewClient(&redis.Options{Addr: s.Addr()})
	t.Cleanup(func() { c.Close() })
	return c
}

// Rueidis returns a rueidis client of s without client-side caching,
// closed when the test ends.
func (s *Server) Rueidis(t testing.TB) rueidis.Client {
	t.Helper()
	c, err := rueidis.NewClient(rueidis.ClientOption{InitAddress: []string{s.Addr()}, DisableCache: true})
	if err != nil {
		t.Fatalf("redistest: rueidis client for %s: %v", s.Addr(), err)
	}
	t.Cleanup(c.Close)
	return c
}
