package redisstore_test

import (
	"context"
	"net"
	"testing"
	"time"

	"github.com/idemgo/idem/redisstore"
	"github.com/redis/rueidis"
	"github.com/valkey-io/valkey-go"
)

// ruOptions is what the tests set on a client of the rueidis family.
type ruOptions struct {
	addrs          []string
	master         string // a Sentinel master set: addrs are the Sentinels
	cache          bool   // client-side caching on (off: DisableCache)
	user, password string
	dialTimeout    time.Duration
}

// ruClient is a client library of the rueidis family: rueidis
// (NewRueidis) and valkey-go (NewValkey), a fork of rueidis with the same
// API, whose store backend is generated from rueidis's
// (internal/genvalkey). The tests that run on rueidis run on both.
type ruClient struct {
	name string
	// open returns a store on a new client with o (closed when the test
	// ends), a GET through that client, and the constructor's error.
	open func(t testing.TB, o ruOptions, opts ...redisstore.Option) (*redisstore.Store, func(ctx context.Context, key string) (string, error), error)
}

// store returns a store on a new client with o and the constructor's
// error.
func (c ruClient) store(t testing.TB, o ruOptions, opts ...redisstore.Option) (*redisstore.Store, error) {
	t.Helper()
	s, _, err := c.open(t, o, opts...)
	return s, err
}

var ruClients = []ruClient{{"rueidis", openRueidis}, {"valkey", openValkey}}

func openRueidis(t testing.TB, o ruOptions, opts ...redisstore.Option) (*redisstore.Store, func(context.Context, string) (string, error), error) {
	t.Helper()
	c, err := rueidis.NewClient(rueidis.ClientOption{
		InitAddress: o.addrs, DisableCache: !o.cache, Username: o.user, Password: o.password,
		Sentinel: rueidis.SentinelOption{MasterSet: o.master}, Dialer: net.Dialer{Timeout: o.dialTimeout},
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Close)
	s, err := redisstore.NewRueidis(c, opts...)
	return s, func(ctx context.Context, key string) (string, error) {
		return c.Do(ctx, c.B().Get().Key(key).Build()).ToString()
	}, err
}

func openValkey(t testing.TB, o ruOptions, opts ...redisstore.Option) (*redisstore.Store, func(context.Context, string) (string, error), error) {
	t.Helper()
	c, err := valkey.NewClient(valkey.ClientOption{
		InitAddress: o.addrs, DisableCache: !o.cache, Username: o.user, Password: o.password,
		Sentinel: valkey.SentinelOption{MasterSet: o.master}, Dialer: net.Dialer{Timeout: o.dialTimeout},
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Close)
	s, err := redisstore.NewValkey(c, opts...)
	return s, func(ctx context.Context, key string) (string, error) {
		return c.Do(ctx, c.B().Get().Key(key).Build()).ToString()
	}, err
}

// ruClientNamed returns the client of the rueidis family named name.
func ruClientNamed(name string) (ruClient, bool) {
	for _, c := range ruClients {
		if c.name == name {
			return c, true
		}
	}
	return ruClient{}, false
}

// mustStore is c.store, failing the test on an error.
func (c ruClient) mustStore(t testing.TB, o ruOptions, opts ...redisstore.Option) *redisstore.Store {
	t.Helper()
	s, err := c.store(t, o, opts...)
	if err != nil {
		t.Fatal(err)
	}
	return s
}
