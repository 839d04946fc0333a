// Command orders consumes orders from a Redis Stream and applies each one
// exactly once, crash-safe: it takes the ordered units from the stock,
// writes the order, counts it and appends an "order placed" event, as one
// Redis-side effect (redisstore.WithEffect) that runs in the same atomic
// call as the completion of the order's idempotency record and the XACK of
// its stream entry. A consumer that crashes or stalls at any point, a
// redelivered entry, a duplicate order in the stream: none of them can
// take the stock twice or append a second event.
//
//	go run ./examples/orders -redis 127.0.0.1:6379
//
//	redis-cli HSET '{shop}:stock' apple 10
//	redis-cli XADD '{shop}:orders' '*' key order-1 sku apple qty 3
//	redis-cli XADD '{shop}:orders' '*' key order-1 sku apple qty 3   # a duplicate
//	redis-cli HGET '{shop}:stock' apple                             # 7
//	redis-cli XRANGE '{shop}:events' - +                            # one event
//
// All keys share the hash tag {shop}, so that on a Redis Cluster the
// records, the stream and the effect's keys live in one slot (a Cluster
// runs one script on one slot). An order for more than the stock is
// refused by the effect, before it writes anything; the consumer then
// dead-letters the entry to {shop}:orders:dlq.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"syscall"

	"github.com/idemgo/idem"
	"github.com/idemgo/idem/consumer/redisstream"
	"github.com/idemgo/idem/redisstore"
	"github.com/redis/go-redis/v9"
)

// The keys of the shop: every one carries the hash tag {shop}.
const (
	tag    = "shop"
	stream = "{shop}:orders"
	group  = "shop"
)

// placeOrder is the effect: it takes an order's units from the stock,
// writes the order, counts it and appends an event. It checks everything
// before its first write: Redis does not undo a script that fails half
// way, so a refused order must leave no trace.
//
//	KEYS[1]  the stock, a hash: sku -> units
//	KEYS[2]  the order, a hash
//	KEYS[3]  the number of orders placed
//	KEYS[4]  the stream of events
//	ARGV[1]  order ID, ARGV[2] sku, ARGV[3] units
const placeOrder = `
local qty = tonumber(ARGV[3])
if not qty or qty <= 0 or qty ~= math.floor(qty) then
  return redis.error_reply('bad quantity ' .. tostring(ARGV[3]))
end
local want = {{KEYS[1], 'hash'}, {KEYS[2], 'hash'}, {KEYS[3], 'string'}, {KEYS[4], 'stream'}}
for _, kt in ipairs(want) do
  local t = redis.call('TYPE', kt[1]).ok
  if t ~= 'none' and t ~= kt[2] then
    return redis.error_reply(kt[1] .. ' is a ' .. t .. ', not a ' .. kt[2])
  end
end
local stock = tonumber(redis.call('HGET', KEYS[1], ARGV[2]) or '0')
if stock < qty then
  return redis.error_reply('out of stock: ' .. ARGV[2] .. ' has ' .. stock .. ', the order wants ' .. qty)
end
redis.call('HINCRBY', KEYS[1], ARGV[2], -qty)
redis.call('HSET', KEYS[2], 'sku', ARGV[2], 'qty', qty, 'fence', FENCE)
redis.call('INCR', KEYS[3])
redis.call('XADD', KEYS[4], '*', 'order', ARGV[1], 'sku', ARGV[2], 'qty', qty)
`

func main() {
	addr := flag.String("redis", "127.0.0.1:6379", "Redis address")
	name := flag.String("name", "orders-1", "consumer name, one per process")
	flag.Parse()
	logger := slog.New(slog.NewTextHandler(os.Stderr, nil))

	rdb := redis.NewClient(&redis.Options{Addr: *addr})
	defer rdb.Close()
	c, err := newConsumer(rdb, *name)
	if err != nil {
		logger.Error("creating the consumer", "error", err)
		os.Exit(1)
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	logger.Info("consuming", "stream", stream, "group", group, "consumer", *name)
	if err := c.Run(ctx); err != nil {
		logger.Error("consumer stopped", "error", err)
		os.Exit(1)
	}
	logger.Info("stopped", "stats", fmt.Sprintf("%+v", c.Stats()))
}

// newConsumer returns a consumer of the orders stream whose store applies
// the placeOrder effect with each completion. Out of stock is a terminal
// failure: the order's key becomes FAILED and its entry is dead-lettered.
func newConsumer(rdb redis.UniversalClient, name string, opts ...redisstream.Option) (*redisstream.Consumer, error) {
	store, err := redisstore.New(rdb,
		redisstore.WithHashTag(tag),
		redisstore.WithEffect("place_order", placeOrder))
	if err != nil {
		return nil, err
	}
	terminal := func(err error) bool { return errors.Is(err, idem.ErrEffect) || idem.IsTerminal(err) }
	exec, err := idem.New(store, idem.WithFailurePolicy(terminal))
	if err != nil {
		return nil, err
	}
	return redisstream.New(rdb, stream, group, name, exec, handle, opts...)
}

// handle is the consumer's handler: it checks the entry and attaches the
// effect; the consumer applies it with the completion and the XACK.
func handle(ctx context.Context, msg redis.XMessage) error {
	id, _ := msg.Values["key"].(string)
	sku, _ := msg.Values["sku"].(string)
	qty, _ := msg.Values["qty"].(string)
	if sku == "" || qty == "" {
		return idem.Terminal(fmt.Errorf("order %q has no sku or qty", id))
	}
	return idem.SetEffect(ctx, idem.Effect{
		Name: "place_order",
		Keys: []string{"{shop}:stock", "{shop}:order:" + id, "{shop}:orders:placed", "{shop}:events"},
		Args: []string{id, sku, qty},
	})
}
