package redisstream

import (
	"context"
	"strconv"
	"testing"
	"time"

	"github.com/idemgo/idem"
	"github.com/idemgo/idem/internal/redistest"
	"github.com/idemgo/idem/redisstore"
	"github.com/redis/go-redis/v9"
	"github.com/redis/rueidis"
)

// BenchmarkConsumer measures messages per second through one consumer, end
// to end (XREADGROUP, acquire, handler, complete and XACK), with the
// idempotency layer ("dedup") and with the same loop without it ("plain"),
// at batch sizes 1 and 100, on a real redis-server. The stream is filled
// with b.N entries with distinct keys before the timer starts. Run:
//
//	go test -run '^$' -bench Consumer -benchtime 20000x ./consumer/redisstream/
func BenchmarkConsumer(b *testing.B) {
	srv := redistest.Start(b)
	rdb := redis.NewClient(&redis.Options{Addr: srv.Addr(), PoolSize: 128})
	b.Cleanup(func() { rdb.Close() })
	store, err := redisstore.New(rdb, redisstore.WithHashTag("bench"), redisstore.WithNotify(false))
	if err != nil {
		b.Fatal(err)
	}
	rc, err := rueidis.NewClient(rueidis.ClientOption{InitAddress: []string{srv.Addr()}, DisableCache: true})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(rc.Close)
	rstore, err := redisstore.NewRueidis(rc, redisstore.WithHashTag("bench"), redisstore.WithNotify(false))
	if err != nil {
		b.Fatal(err)
	}
	run := 0
	for _, batch := range []int{1, 100} {
		for _, mode := range []string{"plain", "dedup", "dedup-rueidis"} {
			b.Run(mode+"/batch="+strconv.Itoa(batch), func(b *testing.B) {
				run++
				ctx := b.Context()
				stream := "{bench}:s" + strconv.Itoa(run)
				if err := rdb.XGroupCreateMkStream(ctx, stream, "g", "0").Err(); err != nil {
					b.Fatal(err)
				}
				for lo := 0; lo < b.N; lo += 1000 {
					_, err := rdb.Pipelined(ctx, func(p redis.Pipeliner) error {
						for i := lo; i < min(lo+1000, b.N); i++ {
							p.XAdd(ctx, &redis.XAddArgs{Stream: stream, Values: []any{"key", strconv.Itoa(run) + "-" + strconv.Itoa(i), "body", "payload"}})
						}
						return nil
					})
					if err != nil {
						b.Fatal(err)
					}
				}
				st := store
				if mode == "dedup-rueidis" {
					st = rstore
				}
				c, err := New(rdb, st, stream, "g", "c", WithBatchSize(batch), WithBlock(10*time.Millisecond),
					WithExecutorOptions(idem.WithLease(10*time.Second)))
				if err != nil {
					b.Fatal(err)
				}
				c.plain = mode == "plain"
				rctx, cancel := context.WithCancel(ctx)
				done := make(chan error, 1)
				b.ResetTimer()
				start := time.Now()
				go func() {
					done <- c.Run(rctx, func(context.Context, redis.XMessage) error { return nil })
				}()
				for c.Stats().Processed < int64(b.N) {
					time.Sleep(time.Millisecond)
				}
				elapsed := time.Since(start)
				b.StopTimer()
				cancel()
				if err := <-done; err != nil {
					b.Fatal(err)
				}
				b.ReportMetric(float64(b.N)/elapsed.Seconds(), "msgs/s")
			})
		}
	}
}
