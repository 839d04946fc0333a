package pggate_test

import (
	"context"
	"fmt"
	"log"

	"github.com/idemgo/idem"
	"github.com/idemgo/idem/postgres/pggate"
	"github.com/idemgo/idem/redisstore"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/redis/go-redis/v9"
)

// Example charges a payment once per idempotency key: the payment row and
// the completion row commit in one transaction, so a retry never charges
// twice, even if Redis lost the record. It needs Redis and PostgreSQL, so
// it is compiled but not run.
func Example() {
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, "postgres://postgres@127.0.0.1:5432/test")
	if err != nil {
		log.Fatal(err)
	}
	store, err := redisstore.New(redis.NewClient(&redis.Options{Addr: "127.0.0.1:6379"}))
	if err != nil {
		log.Fatal(err)
	}
	exec, err := idem.New(store)
	if err != nil {
		log.Fatal(err)
	}
	gate, err := pggate.New(exec, pool) // runs the relay and the janitor
	if err != nil {
		log.Fatal(err)
	}
	defer gate.Close()
	if err := gate.Migrate(ctx); err != nil { // or apply pggate/schema.sql
		log.Fatal(err)
	}

	key := idem.Key{Scope: "payments", ID: "order-42"}
	res, err := gate.Do(ctx, key, "amount=1000", func(ctx context.Context, tx pgx.Tx) ([]byte, error) {
		_, err := tx.Exec(ctx, `INSERT INTO payments (order_id, amount) VALUES ($1, $2)`, "order-42", 1000)
		return []byte(`{"status":"paid"}`), err
	})
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println(string(res.Value), res.Replayed)
}
