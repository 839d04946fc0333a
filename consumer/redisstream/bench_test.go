package redisstream

import (
	"context"
	"errors"
	"strconv"
	"testing"
	"time"

	"github.com/idemgo/idem"
	"github.com/idemgo/idem/consumer"
	"github.com/idemgo/idem/redisstore"
	"github.com/idemgo/idem/redisstore/redisinfo"
	"github.com/idemgo/idem/testkit/proccpu"
	"github.com/idemgo/idem/testkit/redistest"
	"github.com/redis/go-redis/v9"
)

// BenchmarkConsumer measures messages per second through one consumer, end
// to end (XREADGROUP, acquire, handler, complete and XACK), with the
// idempotency layer ("dedup", on go-redis and on rueidis), with the same
// loop without it ("plain"), and with the same loop doing the least Redis
// work any deduplication with one record per key needs ("floor", see
// floorBatch), at batch sizes 1 and 100, on a real redis-server. The stream
// is filled with b.N entries with distinct keys before the timer starts.
// Run:
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
	rc := srv.Rueidis(b)
	rstore, err := redisstore.NewRueidis(rc, redisstore.WithHashTag("bench"), redisstore.WithNotify(false))
	if err != nil {
		b.Fatal(err)
	}
	run := 0
	for _, batch := range []int{1, 100} {
		for _, mode := range []string{"plain", "floor", "dedup", "dedup-rueidis"} {
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
				c, err := New(rdb, stream, "g", "c", executorOn(st, idem.WithLease(10*time.Second)), nopHandler, consumer.WithBatchSize(batch), WithBlock(10*time.Millisecond))
				if err != nil {
					b.Fatal(err)
				}
				switch mode {
				case "plain":
					c.baseline = c.plainBatch
				case "floor":
					c.baseline = c.floorBatch
				}
				rctx, cancel := context.WithCancel(ctx)
				done := make(chan error, 1)
				redisCPU := func() float64 {
					v, err := redisinfo.CPU(srv.Do(b, "INFO", "cpu"))
					if err != nil {
						b.Fatal(err)
					}
					return v
				}
				redis0, self0 := redisCPU(), proccpu.Self()
				b.ResetTimer()
				start := time.Now()
				go func() {
					done <- runWith(rctx, c, func(context.Context, redis.XMessage) error { return nil })
				}()
				for c.Stats().Processed+c.baselineAcked.Load() < int64(b.N) {
					time.Sleep(time.Millisecond)
				}
				elapsed := time.Since(start)
				redisUsed, selfUsed := redisCPU()-redis0, proccpu.Self()-self0
				b.StopTimer()
				cancel()
				if err := <-done; err != nil {
					b.Fatal(err)
				}
				b.ReportMetric(float64(b.N)/elapsed.Seconds(), "msgs/s")
				// Where a message's time goes: Redis runs commands and
				// scripts on one thread, so 1e6 / redis-µs/msg bounds the
				// rate of a mode whatever the consumer does.
				b.ReportMetric(redisUsed/float64(b.N)*1e6, "redis-µs/msg")
				b.ReportMetric(selfUsed/float64(b.N)*1e6, "go-µs/msg")
			})
		}
	}
}

// handleAll runs h on msgs and returns the IDs of those it succeeded on.
func (c *Consumer) handleAll(ctx context.Context, msgs []redis.XMessage, h Handler) []string {
	ids := make([]string, 0, len(msgs))
	for _, m := range msgs {
		if h(ctx, m) == nil {
			ids = append(ids, m.ID)
		}
	}
	return ids
}

// plainBatch is process without idempotency: run the handlers; its tail
// acknowledges the successful entries with one XACK.
func (c *Consumer) plainBatch(ctx context.Context, msgs []redis.XMessage, h Handler) func() {
	ids := c.handleAll(ctx, msgs, h)
	return func() {
		if len(ids) == 0 {
			return
		}
		if err := c.rdb.XAck(context.WithoutCancel(ctx), c.stream, c.group, ids...).Err(); err != nil {
			c.proc.ReportError("acknowledging", err)
			return
		}
		c.baselineAcked.Add(int64(len(ids)))
	}
}

// floorBatch does, per batch, the least Redis work that deduplication with
// one record per key and its own expiry (docs/design.md#records-and-keys)
// needs, with no Lua and no client-side state: one pipeline of SET … NX PX,
// one per entry, before the handlers (an acquire must write a record, and
// that write can be its check); its tail sends one pipeline of SET … PX, one
// per entry, and the XACK (a complete must write the result). It reads no
// reply and checks no owner or fence, so it deduplicates nothing correctly:
// it bounds from below what a correct deduplication costs in the same loop.
func (c *Consumer) floorBatch(ctx context.Context, msgs []redis.XMessage, h Handler) func() {
	ctx = context.WithoutCancel(ctx)
	keys := make([]string, len(msgs))
	for i, m := range msgs {
		keys[i] = "{bench}floor:" + c.keyFn(m)
	}
	_, err := c.rdb.Pipelined(ctx, func(p redis.Pipeliner) error {
		for _, k := range keys {
			p.SetArgs(ctx, k, "p", redis.SetArgs{Mode: "NX", TTL: 20 * time.Second})
		}
		return nil
	})
	if err != nil && !errors.Is(err, redis.Nil) {
		c.proc.ReportError("floor acquire", err)
		return func() {}
	}
	ids := c.handleAll(ctx, msgs, h)
	return func() {
		_, err := c.rdb.Pipelined(ctx, func(p redis.Pipeliner) error {
			for _, k := range keys {
				p.Set(ctx, k, "c", 24*time.Hour)
			}
			if len(ids) > 0 {
				p.XAck(ctx, c.stream, c.group, ids...)
			}
			return nil
		})
		if err != nil {
			c.proc.ReportError("acknowledging", err)
			return
		}
		c.baselineAcked.Add(int64(len(ids)))
	}
}
