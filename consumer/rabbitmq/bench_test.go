package rabbitmq

import (
	"context"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idemgo/idem"
	"github.com/idemgo/idem/consumer"
	"github.com/idemgo/idem/redisstore"
	"github.com/idemgo/idem/testkit/prooftest"
	"github.com/idemgo/idem/testkit/redistest"
	amqp "github.com/rabbitmq/amqp091-go"
)

// BenchmarkConsume measures messages/s through one Consumer from a queue
// that already holds b.N messages with distinct keys, with the idempotency
// layer (Redis store on a local redis-server) and without it (the same
// loop, batching, acks and all, with the handler called directly), at
// batch sizes 1 and 100, processing 1 or 4 batches at once
// (WithConcurrency). Run it with a fixed count, for example
//
//	go test -run '^$' -bench Consume -benchtime 20000x
func BenchmarkConsume(b *testing.B) {
	srv := redistest.Start(b, "--save", "", "--appendonly", "no")
	rdb := srv.GoRedis(b)
	store, err := redisstore.New(rdb)
	if err != nil {
		b.Fatal(err)
	}
	exec, err := idem.New(store)
	if err != nil {
		b.Fatal(err)
	}
	for _, batch := range []int{1, 100} {
		for _, conc := range []int{1, 4} {
			for _, dedup := range []bool{false, true} {
				name := "batch=" + strconv.Itoa(batch) + "/conc=" + strconv.Itoa(conc) + "/idem=off"
				if dedup {
					name = name[:len(name)-3] + "on"
				}
				b.Run(name, func(b *testing.B) { benchConsume(b, exec, batch, conc, dedup) })
			}
		}
	}
}

func benchConsume(b *testing.B, exec *idem.Executor, batch, conc int, dedup bool) {
	q := testQueue(b)
	pub := newPublisher(b, q)
	msgs := make([]amqp.Publishing, 0, 1000)
	run := strconv.FormatInt(time.Now().UnixNano(), 36)
	for i := range b.N {
		msgs = append(msgs, amqp.Publishing{MessageId: run + "-" + strconv.Itoa(i), Body: []byte("payload")})
		if len(msgs) == cap(msgs) || i == b.N-1 {
			pub.publish(q, msgs...)
			msgs = msgs[:0]
		}
	}
	done := make(chan struct{})
	var seen atomic.Int64
	c, err := New(amqpURL(), q, exec, func(context.Context, *amqp.Delivery) error { return nil },
		consumer.WithScope(q), consumer.WithBatchSize(batch), WithPrefetch(max(2*batch*conc, 32)), consumer.WithConcurrency(conc))
	if err != nil {
		b.Fatal(err)
	}
	c.settled = func(*amqp.Delivery, consumer.Result, bool) {
		if seen.Add(1) == int64(b.N) {
			close(done)
		}
	}
	if !dedup {
		c.proc = nil
	}
	b.ResetTimer()
	begin := time.Now()
	stop := prooftest.Start(b, c.Run)
	select {
	case <-done:
	case <-time.After(5 * time.Minute):
		b.Fatalf("timed out: %+v", c.Stats())
	}
	elapsed := time.Since(begin)
	b.StopTimer()
	stop()
	if st := c.Stats(); st.Processed != int64(b.N) {
		b.Fatalf("got %+v, want %d processed", st, b.N)
	}
	b.ReportMetric(float64(b.N)/elapsed.Seconds(), "msgs/s")
	b.ReportMetric(float64(b.N)/float64(c.batches.Load()), "msgs/batch")
}
