package kafka_test

import (
	"context"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idemgo/idem"
	"github.com/idemgo/idem/consumer"
	"github.com/idemgo/idem/consumer/kafka"
	"github.com/idemgo/idem/redisstore"
	"github.com/idemgo/idem/testkit/prooftest"
	"github.com/idemgo/idem/testkit/redistest"
	"github.com/redis/go-redis/v9"
	"github.com/twmb/franz-go/pkg/kgo"
)

// BenchmarkConsume measures records/s through a consumer group on kfake:
// the Consumer with a real Redis store and with memstore, against the same
// poll loop without the idempotency layer (plain), at 1 and 100 records
// per poll. b.N records with distinct keys are produced first (not timed);
// the clock runs until the handler saw all of them.
//
//	go test -run '^$' -bench Consume -benchtime 20000x
func BenchmarkConsume(b *testing.B) {
	srv := redistest.Start(b)
	for _, batch := range []int{1, 100} {
		for _, mode := range []string{"plain", "idem-memstore", "idem-redis"} {
			b.Run(mode+"/batch="+strconv.Itoa(batch), func(b *testing.B) {
				addrs := startCluster(b, 4, "bench")
				prod := producer(b, addrs)
				rs := make([]*kgo.Record, 0, 1000)
				for i := range b.N {
					rs = append(rs, &kgo.Record{Topic: "bench", Partition: int32(i % 4), Key: []byte("k" + strconv.Itoa(i)), Headers: keyHeader("k" + strconv.Itoa(i))})
					if len(rs) == cap(rs) || i == b.N-1 {
						produce(b, prod, rs...)
						rs = rs[:0]
					}
				}
				var seen atomic.Int64
				h := func(context.Context, *kgo.Record) error { seen.Add(1); return nil }
				kopts := groupOpts(addrs, "bench", "bench")
				ctx, cancel := context.WithCancel(context.Background())
				var wg sync.WaitGroup
				b.ResetTimer()
				start := time.Now()
				switch mode {
				case "plain":
					wg.Go(func() { plainRun(ctx, b, kopts, batch, h) })
				default:
					var exec *idem.Executor
					if mode == "idem-redis" {
						rc := redis.NewClient(&redis.Options{Addr: srv.Addr()})
						defer rc.Close()
						st, err := redisstore.New(rc, redisstore.WithPrefix("bench"+strconv.Itoa(b.N)+strconv.Itoa(batch)+":"))
						if err != nil {
							b.Fatal(err)
						}
						if exec, err = idem.New(st); err != nil {
							b.Fatal(err)
						}
					} else {
						exec = prooftest.MemExecutor(b)
					}
					c, err := kafka.New(kopts, exec, h, consumer.WithBatchSize(batch))
					if err != nil {
						b.Fatal(err)
					}
					wg.Go(func() { _ = c.Run(ctx) })
				}
				for seen.Load() < int64(b.N) {
					time.Sleep(time.Millisecond)
				}
				elapsed := time.Since(start)
				b.StopTimer()
				cancel()
				wg.Wait()
				b.ReportMetric(float64(b.N)/elapsed.Seconds(), "msgs/s")
			})
		}
	}
}

// plainRun is the Consumer's loop without the idempotency layer: poll,
// handle each partition's records in order in batches (partitions
// concurrently), mark after each batch, poll again.
func plainRun(ctx context.Context, b *testing.B, kopts []kgo.Opt, batch int, h kafka.Handler) {
	cl, err := kgo.NewClient(append(kopts, kgo.AutoCommitMarks())...)
	if err != nil {
		b.Error(err)
		return
	}
	defer cl.Close()
	for ctx.Err() == nil {
		fs := cl.PollRecords(ctx, batch*kafka.DefaultConcurrency)
		var wg sync.WaitGroup
		fs.EachPartition(func(p kgo.FetchTopicPartition) {
			if len(p.Records) == 0 {
				return
			}
			wg.Go(func() {
				for recs := p.Records; len(recs) > 0; {
					n := min(len(recs), batch)
					for _, r := range recs[:n] {
						_ = h(ctx, r)
					}
					cl.MarkCommitRecords(recs[n-1])
					recs = recs[n:]
				}
			})
		})
		wg.Wait()
	}
}
