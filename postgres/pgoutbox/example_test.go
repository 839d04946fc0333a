package pgoutbox_test

import (
	"context"
	"log"

	"github.com/idemgo/idem"
	"github.com/idemgo/idem/consumer/redisstream"
	"github.com/idemgo/idem/postgres/pggate"
	"github.com/idemgo/idem/postgres/pgoutbox"
	"github.com/idemgo/idem/redisstore"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/redis/go-redis/v9"
)

// Example marks an order paid and publishes "order paid" in the same
// transaction, through the commit gate, then runs the relay that sends it
// to a Redis stream. It needs Redis and PostgreSQL, so it is compiled but
// not run.
func Example() {
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, "postgres://postgres@127.0.0.1:5432/test")
	if err != nil {
		log.Fatal(err)
	}
	rdb := redis.NewClient(&redis.Options{Addr: "127.0.0.1:6379"})
	store, err := redisstore.New(rdb)
	if err != nil {
		log.Fatal(err)
	}
	exec, err := idem.New(store)
	if err != nil {
		log.Fatal(err)
	}
	gate, err := pggate.New(exec, pool)
	if err != nil {
		log.Fatal(err)
	}
	defer gate.Close()
	if err := pgoutbox.Migrate(ctx, pool); err != nil { // or apply pgoutbox/schema.sql
		log.Fatal(err)
	}

	order := "order-42"
	_, err = gate.Do(ctx, idem.Key{Scope: "checkout", ID: order}, "amount=1000", func(ctx context.Context, tx pgx.Tx) ([]byte, error) {
		if _, err := tx.Exec(ctx, `UPDATE orders SET paid = true WHERE id = $1`, order); err != nil {
			return nil, err
		}
		// Sent if and only if this transaction commits, once per key.
		event := []byte(`{"order":"order-42","status":"paid"}`)
		err := pgoutbox.Publish(ctx, tx, "orders", order+":paid", event, map[string]string{"type": "order.paid"})
		return []byte(`{"status":"paid"}`), err
	})
	if err != nil {
		log.Fatal(err)
	}

	// The relay, here in the same process; `idem relay --postgres URL
	// --outbox redis-stream://127.0.0.1:6379/orders` runs it on its own.
	sender, err := redisstream.NewSender(rdb, "orders")
	if err != nil {
		log.Fatal(err)
	}
	relay, err := pgoutbox.New(pool, map[string]pgoutbox.Sender{"orders": sender})
	if err != nil {
		log.Fatal(err)
	}
	if err := relay.Run(ctx); err != nil {
		log.Fatal(err)
	}
}
