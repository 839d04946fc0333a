package kafka_test

import (
	"context"
	"fmt"
	"log"
	"log/slog"
	"os"
	"os/signal"
	"time"

	"github.com/idemgo/idem"
	"github.com/idemgo/idem/consumer"
	"github.com/idemgo/idem/consumer/kafka"
	"github.com/idemgo/idem/memstore"
	"github.com/idemgo/idem/redisstore"
	"github.com/redis/go-redis/v9"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
)

// The consumer runs the handler once per order ID, even though the order
// was published twice. kfake stands in for a Kafka cluster; use
// redisstore for a store shared between processes.
func Example() {
	cluster, _ := kfake.NewCluster(kfake.NumBrokers(1), kfake.SeedTopics(1, "orders"))
	defer cluster.Close()
	seeds := kgo.SeedBrokers(cluster.ListenAddrs()...)

	prod, _ := kgo.NewClient(seeds)
	defer prod.Close()
	for _, id := range []string{"order-1", "order-2", "order-1"} {
		prod.ProduceSync(context.Background(), &kgo.Record{Topic: "orders", Value: []byte(id),
			Headers: []kgo.RecordHeader{{Key: kafka.DefaultKeyHeader, Value: []byte(id)}}})
	}

	store, _ := memstore.New()
	exec, _ := idem.New(store)
	done := make(chan struct{}, 3)
	c, err := kafka.New([]kgo.Opt{seeds, kgo.ConsumerGroup("billing"), kgo.ConsumeTopics("orders")},
		exec, func(ctx context.Context, r *kgo.Record) error {
			fence, _ := idem.FenceFrom(ctx) // pass to the side effect
			fmt.Printf("charging %s (fence > 0: %v)\n", r.Value, fence > 0)
			return nil
		})
	if err != nil {
		fmt.Println(err)
		return
	}
	ctx, cancel := context.WithCancel(context.Background())
	go func() {
		for c.Stats().Processed+c.Stats().Replayed < 3 {
			time.Sleep(10 * time.Millisecond)
		}
		cancel()
		done <- struct{}{}
	}()
	if err := c.Run(ctx); err != nil {
		fmt.Println(err)
	}
	<-done
	st := c.Stats()
	fmt.Printf("processed=%d replayed=%d\n", st.Processed, st.Replayed)
	// Output:
	// charging order-1 (fence > 0: true)
	// charging order-2 (fence > 0: true)
	// processed=2 replayed=1
}

// ExampleNew shows a production setup: a Redis store shared by every
// consumer process, the key in a header, the fence passed to the side
// effect. It is compiled, not run: it needs Kafka and Redis.
func ExampleNew() {
	rdb := redis.NewClient(&redis.Options{Addr: "localhost:6379"})
	defer rdb.Close()
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	if err := consume(ctx, rdb); err != nil {
		log.Fatal(err)
	}
}

// consume is the README's usage snippet.
func consume(ctx context.Context, rdb *redis.Client) error {
	store, err := redisstore.New(rdb) // shared by every consumer process
	if err != nil {
		return err
	}
	exec, err := idem.New(store) // lease 30s, retention 24h
	if err != nil {
		return err
	}
	c, err := kafka.New([]kgo.Opt{
		kgo.SeedBrokers("localhost:9092"),
		kgo.ConsumerGroup("billing"),
		kgo.ConsumeTopics("orders"),
	}, exec, func(ctx context.Context, r *kgo.Record) error {
		fence, _ := idem.FenceFrom(ctx)
		// Check the fence in the side effect's own system:
		// UPDATE accounts SET …, fence = $fence WHERE id = $id AND fence < $fence
		return charge(ctx, r.Value, fence)
	},
		kafka.WithKeyHeader("Idempotency-Key"), // the default
		consumer.WithMaxDeliveries(5),          // then dead-letter, key FAILED
		consumer.WithScope("billing/orders"),
		consumer.WithLogger(slog.Default()), // key digests, never raw keys
	)
	if err != nil {
		return err // bad configuration: wraps idem.ErrInvalid
	}
	return c.Run(ctx) // until ctx is done; then a graceful shutdown
}

func charge(context.Context, []byte, int64) error { return nil }

// ExampleKeyHash derives the key from a hash of the stable fields of a JSON
// payload, for producers that send no key of their own.
func ExampleKeyHash() {
	byPayload := kafka.WithKeyFunc(kafka.KeyHash("order_id", "amount")) // not "sent_at"
	_ = byPayload                                                       // pass to kafka.New
}
