package rabbitmq_test

import (
	"context"
	"fmt"
	"log"
	"strconv"
	"time"

	"github.com/idemgo/idem"
	"github.com/idemgo/idem/consumer"
	"github.com/idemgo/idem/consumer/rabbitmq"
	"github.com/idemgo/idem/memstore"
	amqp "github.com/rabbitmq/amqp091-go"
)

// The example runs against the RabbitMQ on 127.0.0.1:5672 and keeps its
// idempotency records in memory (memstore); in production use redisstore,
// shared by every consumer.
func Example() {
	const url = "amqp://guest:guest@127.0.0.1:5672/"
	queue := "idem-example-orders-" + strconv.FormatInt(time.Now().UnixNano(), 36)

	store, err := memstore.New()
	if err != nil {
		log.Fatal(err)
	}
	exec, err := idem.New(store)
	if err != nil {
		log.Fatal(err)
	}
	c, err := rabbitmq.New(url, queue, exec, func(ctx context.Context, d *amqp.Delivery) error {
		fence, _ := idem.FenceFrom(ctx) // pass it to the side effect
		_ = fence
		fmt.Printf("charging %s\n", d.MessageId)
		return nil
	}, consumer.WithScope(queue), consumer.WithMaxDeliveries(5), consumer.WithBatchSize(1))
	if err != nil {
		log.Fatal(err)
	}

	// A producer that sent order-1 twice.
	conn, err := amqp.Dial(url)
	if err != nil {
		log.Fatal(err)
	}
	defer conn.Close()
	ch, err := conn.Channel()
	if err != nil {
		log.Fatal(err)
	}
	defer cleanup(ch, queue)
	if _, err := ch.QueueDeclare(queue, true, false, false, false, nil); err != nil {
		log.Fatal(err)
	}
	for _, id := range []string{"order-1", "order-1", "order-2"} {
		err := ch.PublishWithContext(context.Background(), "", queue, false, false,
			amqp.Publishing{MessageId: id, Body: []byte("{}")})
		if err != nil {
			log.Fatal(err)
		}
	}

	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error)
	go func() { done <- c.Run(ctx) }()
	for st := c.Stats(); st.Processed+st.Replayed < 3; st = c.Stats() {
		time.Sleep(10 * time.Millisecond)
	}
	cancel() // graceful shutdown
	if err := <-done; err != nil {
		log.Fatal(err)
	}
	st := c.Stats()
	fmt.Printf("processed %d, replayed %d\n", st.Processed, st.Replayed)
	// Output:
	// charging order-1
	// charging order-2
	// processed 2, replayed 1
}

func cleanup(ch *amqp.Channel, queue string) {
	for _, q := range []string{queue, queue + ".retry", queue + ".dlq"} {
		_, _ = ch.QueueDelete(q, false, false, false)
	}
}
