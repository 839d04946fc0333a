package main

import (
	"context"
	"fmt"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/idemgo/idem/consumer"
	"github.com/idemgo/idem/consumer/redisstream"
	"github.com/idemgo/idem/testkit/redistest"
	"github.com/redis/go-redis/v9"
)

// TestOrders runs two consumers on a stream of 100 orders, each sent three
// times, and one order over the stock: the stock, the count and the events
// reflect each order once, and the order over the stock changed nothing and
// was dead-lettered.
func TestOrders(t *testing.T) {
	srv := redistest.Start(t)
	rdb := srv.GoRedis(t)
	ctx := t.Context()
	if err := rdb.HSet(ctx, "{shop}:stock", "apple", 1000, "pear", 5).Err(); err != nil {
		t.Fatal(err)
	}
	const orders = 100
	for range 3 {
		for i := range orders {
			if err := rdb.XAdd(ctx, &redis.XAddArgs{Stream: stream, Values: []string{"key", "order-" + strconv.Itoa(i), "sku", "apple", "qty", "2"}}).Err(); err != nil {
				t.Fatal(err)
			}
		}
	}
	if err := rdb.XAdd(ctx, &redis.XAddArgs{Stream: stream, Values: []string{"key", "too-many", "sku", "pear", "qty", "6"}}).Err(); err != nil {
		t.Fatal(err)
	}

	runCtx, cancel := context.WithCancel(ctx)
	var wg sync.WaitGroup
	for i := range 2 {
		c, err := newConsumer(rdb, fmt.Sprintf("c%d", i), redisstream.WithBlock(20*time.Millisecond), consumer.WithBatchSize(32),
			// A copy read while the other consumer still runs its order
			// is in progress there: it stays pending and is claimed again
			// after the claim idle time (by default the 30s lease), then
			// replayed.
			redisstream.WithClaimIdle(300*time.Millisecond))
		if err != nil {
			t.Fatal(err)
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := c.Run(runCtx); err != nil {
				t.Error(err)
			}
		}()
	}
	deadline := time.Now().Add(30 * time.Second)
	for {
		n, _ := rdb.XLen(ctx, "{shop}:orders:dlq").Result()
		p, _ := rdb.XPending(ctx, stream, group).Result()
		if n == 1 && p != nil && p.Count == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("not done in time: dead letters %d, pending %+v", n, p)
		}
		time.Sleep(20 * time.Millisecond)
	}
	cancel()
	wg.Wait()

	stock, _ := rdb.HGetAll(ctx, "{shop}:stock").Result()
	if stock["apple"] != strconv.Itoa(1000-2*orders) || stock["pear"] != "5" {
		t.Errorf("stock: got %v, want apple %d and pear 5", stock, 1000-2*orders)
	}
	if n, _ := rdb.Get(ctx, "{shop}:orders:placed").Int(); n != orders {
		t.Errorf("orders placed: got %d, want %d", n, orders)
	}
	events, _ := rdb.XRange(ctx, "{shop}:events", "-", "+").Result()
	seen := map[any]bool{}
	for _, e := range events {
		if seen[e.Values["order"]] {
			t.Errorf("order %v has two events", e.Values["order"])
		}
		seen[e.Values["order"]] = true
	}
	if len(seen) != orders {
		t.Errorf("events: got %d orders, want %d", len(seen), orders)
	}
	if n, _ := rdb.Exists(ctx, "{shop}:order:too-many").Result(); n != 0 {
		t.Error("the order over the stock was written")
	}
}
