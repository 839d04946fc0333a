package redisstore_test

import (
	"testing"

	"github.com/idemgo/idem"
	"github.com/idemgo/idem/redisstore"
	"github.com/idemgo/idem/storetest"
	"github.com/redis/go-redis/v9"
	"github.com/redis/rueidis"
)

func TestQuickGoRedis(t *testing.T) {
	c := redis.NewClient(&redis.Options{Addr: "127.0.0.1:6379"})
	t.Cleanup(func() { c.Close() })
	storetest.Run(t, func(t *testing.T) idem.Store {
		s, err := redisstore.New(c)
		if err != nil {
			t.Fatal(err)
		}
		return s
	})
}

func TestQuickRueidis(t *testing.T) {
	c, err := rueidis.NewClient(rueidis.ClientOption{InitAddress: []string{"127.0.0.1:6379"}, DisableCache: true})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Close)
	storetest.Run(t, func(t *testing.T) idem.Store {
		s, err := redisstore.NewRueidis(c)
		if err != nil {
			t.Fatal(err)
		}
		return s
	})
}
