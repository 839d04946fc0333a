package redisstore_test

import (
	"context"
	"fmt"

	"github.com/idemgo/idem"
	"github.com/idemgo/idem/redisstore"
	"github.com/redis/go-redis/v9"
)

// An order takes its units from the stock and appends an event, exactly
// once per order ID: the writes are a registered effect that the
// completion applies atomically with the COMPLETED record. A retry after a
// crash, a lost reply or a stale owner never applies them twice; an order
// over the stock changes nothing.
func ExampleWithEffect() {
	ctx := context.Background()
	rdb := redis.NewClient(&redis.Options{Addr: "127.0.0.1:6379"})
	store, err := redisstore.New(rdb,
		redisstore.WithHashTag("shop"), // records and effect keys in one Cluster slot
		redisstore.WithEffect("reserve", `
local n = tonumber(ARGV[2])
local stock = tonumber(redis.call('HGET', KEYS[1], ARGV[1]) or '0')
if not n or n <= 0 or stock < n then return redis.error_reply('out of stock') end
redis.call('HINCRBY', KEYS[1], ARGV[1], -n)
redis.call('XADD', KEYS[2], '*', 'sku', ARGV[1], 'qty', n, 'fence', FENCE)`))
	if err != nil {
		panic(err)
	}
	exec, err := idem.New(store)
	if err != nil {
		panic(err)
	}
	_, err = exec.Do(ctx, idem.Key{Scope: "reserve", ID: "order-17"}, "", func(ctx context.Context) ([]byte, error) {
		// Checks and calls to other systems go here; the Redis writes go
		// in the effect, applied with the completion.
		return []byte("reserved"), idem.SetEffect(ctx, idem.Effect{
			Name: "reserve",
			Keys: []string{"{shop}stock", "{shop}events"},
			Args: []string{"apple", "3"},
		})
	})
	fmt.Println(err) // a *storekit.EffectError when out of stock
}

// Functions mode runs the same transitions as a Redis Functions library,
// loaded at first use.
func ExampleWithFunctions() {
	rdb := redis.NewClient(&redis.Options{Addr: "127.0.0.1:6379"})
	store, err := redisstore.New(rdb, redisstore.WithFunctions())
	if err != nil {
		panic(err)
	}
	exec, err := idem.New(store)
	if err != nil {
		panic(err)
	}
	_ = exec
	fmt.Println(redisstore.LibraryName()) // idem_<version>, in FUNCTION LIST
}
