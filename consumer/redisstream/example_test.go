package redisstream_test

import (
	"context"
	"fmt"
	"log"
	"os"
	"os/signal"
	"time"

	"github.com/idemgo/idem"
	"github.com/idemgo/idem/consumer"
	"github.com/idemgo/idem/consumer/redisstream"
	"github.com/idemgo/idem/redisstore"
	"github.com/redis/go-redis/v9"
)

// The consumer needs a Redis server (it reads a stream and acks in the
// store's scripts), so this example is compiled but not run by go test;
// TestProcessReplayAndNoKey runs the same code against a real server.
func Example() {
	rdb := redis.NewClient(&redis.Options{Addr: "127.0.0.1:6379"})
	defer rdb.Close()

	// Records and streams share the hash tag "orders", so that completing
	// a key and acknowledging its entry is one script, also on a Cluster.
	store, err := redisstore.New(rdb, redisstore.WithHashTag("orders"))
	if err != nil {
		log.Fatal(err)
	}
	exec, err := idem.New(store, idem.WithLease(time.Minute))
	if err != nil {
		log.Fatal(err)
	}
	c, err := redisstream.New(rdb, "{orders}:created", "billing", "billing-1", exec,
		func(ctx context.Context, msg redis.XMessage) error {
			fence, _ := idem.FenceFrom(ctx)
			// Charge the order once; the fence lets the database refuse a
			// stale owner: UPDATE … WHERE fence < $1.
			fmt.Println("charging", msg.Values["order_id"], "fence", fence)
			return nil
		},
		redisstream.WithKeyFunc(redisstream.KeyField("order_id")),
		consumer.WithMaxDeliveries(5),
	)
	if err != nil {
		log.Fatal(err)
	}

	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	if err := c.Run(ctx); err != nil {
		log.Fatal(err)
	}
	fmt.Printf("%+v\n", c.Stats())
}
