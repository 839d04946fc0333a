package pggate_test

import (
	"context"
	"fmt"
	"log"
	"net/http"

	"github.com/idemgo/idem"
	"github.com/idemgo/idem/consumer/redisstream"
	"github.com/idemgo/idem/idemhttp"
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

// ExampleGate_Handle runs a Redis Streams consumer whose handler charges
// each payment once per message key, through the gate: any adapter's
// handler (NATS, RabbitMQ, Kafka, SQS) calls Handle the same way, with the
// context it was given. It is compiled but not run.
func ExampleGate_Handle() {
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
	c, err := redisstream.New(rdb, "payments", "billing", "worker-1", exec,
		func(ctx context.Context, msg redis.XMessage) error {
			return gate.Handle(ctx, func(ctx context.Context, tx pgx.Tx) error {
				_, err := tx.Exec(ctx, `INSERT INTO payments (order_id, amount) VALUES ($1, $2)`, msg.Values["order"], msg.Values["amount"])
				return err
			})
		})
	if err != nil {
		log.Fatal(err)
	}
	if err := c.Run(ctx); err != nil {
		log.Fatal(err)
	}
}

// ExampleGate_HTTP serves an API whose handler charges a payment and
// answers 201: the payment row and the stored response commit in one
// transaction. It is compiled but not run.
func ExampleGate_HTTP() {
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
	gate, err := pggate.New(exec, pool)
	if err != nil {
		log.Fatal(err)
	}
	defer gate.Close()
	// A 5xx rolls the transaction back and releases the key.
	mw, err := idemhttp.New(exec, idemhttp.WithPolicy(idemhttp.ReleaseServerErrors))
	if err != nil {
		log.Fatal(err)
	}
	http.Handle("POST /payments", mw.Handler(gate.HTTP(func(w http.ResponseWriter, r *http.Request, tx pgx.Tx) {
		if _, err := tx.Exec(r.Context(), `INSERT INTO payments (order_id, amount) VALUES ($1, $2)`, r.FormValue("order"), r.FormValue("amount")); err != nil {
			http.Error(w, "payment failed", http.StatusInternalServerError)
			return
		}
		w.WriteHeader(http.StatusCreated)
		fmt.Fprint(w, `{"status":"paid"}`)
	})))
	log.Fatal(http.ListenAndServe("127.0.0.1:8080", nil))
}
