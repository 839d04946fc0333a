package sqsconsumer_test

import (
	"context"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/service/sqs/types"

	"github.com/idemgo/idem"
	"github.com/idemgo/idem/consumer"
	sqsconsumer "github.com/idemgo/idem/consumer/sqs"
	"github.com/idemgo/idem/redisstore"
	"github.com/idemgo/idem/testkit/prooftest"
	"github.com/idemgo/idem/testkit/redistest"
	"github.com/idemgo/idem/testkit/sqsfake"
)

// BenchmarkConsume measures messages/s through one Consumer (one receive
// loop) on the in-process SQS fake, with the idempotency layer on a real
// Redis (idem-redis) and on memstore (idem-mem), against the same loop
// without it (plain), at batch sizes 1 and 100. Every message has its own
// key and the handler does nothing, so the numbers are the overhead of the
// loop, the SQS calls and the store. Run it with, for example:
//
//	go test -run '^$' -bench Consume -benchtime 3000x
func BenchmarkConsume(b *testing.B) {
	srv := redistest.Start(b)
	rdb := srv.GoRedis(b)
	for _, batch := range []int{1, 100} {
		for _, mode := range []string{"plain", "idem-mem", "idem-redis"} {
			b.Run(fmt.Sprintf("batch=%d/%s", batch, mode), func(b *testing.B) {
				var exec *idem.Executor
				switch mode {
				case "idem-redis":
					store, err := redisstore.New(rdb, redisstore.WithPrefix(fmt.Sprintf("bench%d:%d:", batch, b.N)))
					if err != nil {
						b.Fatal(err)
					}
					if exec, err = idem.New(store); err != nil {
						b.Fatal(err)
					}
				default:
					exec = prooftest.MemExecutor(b)
				}
				benchConsume(b, exec, batch, mode == "plain")
			})
		}
	}
}

func benchConsume(b *testing.B, exec *idem.Executor, batch int, plain bool) {
	f := startFake(b)
	qURL := f.CreateQueue("bench", sqsfake.QueueOptions{})
	dURL := f.CreateQueue("bench-dlq", sqsfake.QueueOptions{})
	var handled atomic.Int64
	c, err := sqsconsumer.New(f.client(nil), qURL, dURL, exec, func(context.Context, types.Message) error {
		handled.Add(1)
		return nil
	}, consumer.WithBatchSize(batch), sqsconsumer.WithWaitTime(0))
	if err != nil {
		b.Fatal(err)
	}
	if plain {
		sqsconsumer.SetPlain(c)
	}
	for i := range b.N {
		k := fmt.Sprintf("k-%d", i)
		f.Send("bench", k, keyAttr(k), "")
	}
	b.ResetTimer()
	start := time.Now()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); _ = c.Run(ctx) }()
	for f.Ops("bench").Deleted < b.N {
		time.Sleep(time.Millisecond)
	}
	elapsed := time.Since(start)
	b.StopTimer()
	cancel()
	<-done
	if got := handled.Load(); got != int64(b.N) {
		b.Fatalf("handled %d, want %d", got, b.N)
	}
	b.ReportMetric(float64(b.N)/elapsed.Seconds(), "msgs/s")
}
