package natsconsumer_test

import (
	"context"
	"fmt"
	"log"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/idemgo/idem"
	"github.com/idemgo/idem/consumer"
	natsconsumer "github.com/idemgo/idem/consumer/nats"
	"github.com/idemgo/idem/memstore"
)

// Example consumes a JetStream stream with one handler execution per
// Nats-Msg-Id, even when a message is published twice outside JetStream's
// duplicate window. It needs a nats-server with JetStream on
// 127.0.0.1:4222; in production the store is a redisstore.Store.
func Example() {
	ctx := context.Background()
	nc, err := nats.Connect("nats://127.0.0.1:4222")
	if err != nil {
		log.Fatal(err)
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		log.Fatal(err)
	}
	// A stream, its dead-letter stream ("dlq.<subject>" by default) and a
	// pull consumer with explicit ack and no server-side MaxDeliver.
	stream := "EXAMPLE_ORDERS_" + fmt.Sprint(time.Now().UnixNano())
	if _, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: stream, Subjects: []string{stream + ".>"}, Duplicates: 100 * time.Millisecond}); err != nil {
		log.Fatal(err)
	}
	defer js.DeleteStream(ctx, stream)
	if _, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: stream + "_DLQ", Subjects: []string{"dlq." + stream + ".>"}}); err != nil {
		log.Fatal(err)
	}
	defer js.DeleteStream(ctx, stream+"_DLQ")
	cons, err := js.CreateOrUpdateConsumer(ctx, stream, jetstream.ConsumerConfig{
		Durable: "billing", AckPolicy: jetstream.AckExplicitPolicy, AckWait: 30 * time.Second, MaxDeliver: -1,
	})
	if err != nil {
		log.Fatal(err)
	}

	store, err := memstore.New()
	if err != nil {
		log.Fatal(err)
	}
	exec, err := idem.New(store)
	if err != nil {
		log.Fatal(err)
	}
	charged := make(chan string, 10)
	c, err := natsconsumer.New(js, cons, exec, func(ctx context.Context, msg jetstream.Msg) error {
		fence, _ := idem.FenceFrom(ctx) // pass it to the side effect's own store
		_ = fence
		charged <- string(msg.Data())
		return nil
	}, consumer.WithScope(stream), consumer.WithMaxDeliveries(5))
	if err != nil {
		log.Fatal(err)
	}

	// The same order published twice, the second time after the server's
	// duplicate window.
	for range 2 {
		m := nats.NewMsg(stream + ".created")
		m.Header.Set(jetstream.MsgIDHeader, "order-42")
		m.Data = []byte("order-42")
		if _, err := js.PublishMsg(ctx, m); err != nil {
			log.Fatal(err)
		}
		time.Sleep(200 * time.Millisecond)
	}

	runCtx, stop := context.WithCancel(ctx)
	done := make(chan error)
	go func() { done <- c.Run(runCtx) }()
	fmt.Println("charged", <-charged)
	for c.Stats().Replayed == 0 {
		time.Sleep(10 * time.Millisecond)
	}
	stop()
	<-done
	st := c.Stats()
	fmt.Printf("processed %d, replayed %d\n", st.Processed, st.Replayed)
	// Output:
	// charged order-42
	// processed 1, replayed 1
}
