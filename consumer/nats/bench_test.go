package natsconsumer_test

import (
	"context"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/redis/go-redis/v9"

	"github.com/idemgo/idem"
	"github.com/idemgo/idem/consumer"
	natsconsumer "github.com/idemgo/idem/consumer/nats"
	"github.com/idemgo/idem/memstore"
	"github.com/idemgo/idem/redisstore"
	"github.com/idemgo/idem/testkit/redistest"
)

// BenchmarkConsume measures messages/s through one consumer loop, side by
// side: the same Fetch loop without idempotency (handler, then Ack), and
// the adapter with a memstore and with a real Redis store (one Run loop,
// and four Run loops on one Consumer), at batch 1 and 100. Every message has a distinct key (the cost of first deliveries, not
// of replays). Run with:
//
//	go test -run '^$' -bench Consume -benchtime 5000x
func BenchmarkConsume(b *testing.B) {
	srv := redistest.Start(b)
	rc := redis.NewClient(&redis.Options{Addr: srv.Addr()})
	b.Cleanup(func() { _ = rc.Close() })
	rstore, err := redisstore.New(rc)
	if err != nil {
		b.Fatal(err)
	}
	for _, batch := range []int{1, 100} {
		for _, mode := range []string{"plain", "idem-memstore", "idem-redis", "idem-redis-4loops"} {
			b.Run("batch="+strconv.Itoa(batch)+"/"+mode, func(b *testing.B) {
				var store idem.Store = rstore
				if mode == "idem-memstore" {
					ms, err := memstore.New()
					if err != nil {
						b.Fatal(err)
					}
					store = ms
				}
				loops := 1
				if mode == "idem-redis-4loops" {
					loops = 4
				}
				benchConsume(b, batch, mode == "plain", store, loops)
			})
		}
	}
}

// benchConsume consumes b.N messages with batch size batch; the adapter runs
// loops Run goroutines.
func benchConsume(b *testing.B, batch int, plain bool, store idem.Store, loops int) {
	_, js := connect(b)
	s := newStream(b, js, nil)
	cons := s.consumer(b, nil)
	for i := range b.N {
		m := nats.NewMsg(s.name + ".bench")
		m.Header.Set(jetstream.MsgIDHeader, "m-"+strconv.Itoa(i))
		m.Data = []byte("payload")
		if _, err := js.PublishMsgAsync(m); err != nil {
			b.Fatal(err)
		}
	}
	select {
	case <-js.PublishAsyncComplete():
	case <-time.After(time.Minute):
		b.Fatal("publishes not acknowledged")
	}

	var handled atomic.Int64
	all := make(chan struct{})
	h := func(ctx context.Context, m jetstream.Msg) error {
		if handled.Add(1) == int64(b.N) {
			close(all)
		}
		return nil
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var run func(context.Context) error
	if plain {
		run = func(ctx context.Context) error {
			for ctx.Err() == nil {
				mb, err := cons.Fetch(batch, jetstream.FetchMaxWait(200*time.Millisecond))
				if err != nil {
					continue
				}
				for m := range mb.Messages() {
					if h(ctx, m) == nil {
						_ = m.Ack()
					}
				}
			}
			return nil
		}
	} else {
		exec, err := idem.New(store)
		if err != nil {
			b.Fatal(err)
		}
		c, err := natsconsumer.New(js, cons, exec, h, consumer.WithScope(s.name), consumer.WithBatchSize(batch), natsconsumer.WithFetchMaxWait(200*time.Millisecond))
		if err != nil {
			b.Fatal(err)
		}
		run = func(ctx context.Context) error {
			var wg sync.WaitGroup
			for range loops {
				wg.Go(func() { _ = c.Run(ctx) })
			}
			wg.Wait()
			return nil
		}
	}
	b.ResetTimer()
	start := time.Now()
	done := make(chan struct{})
	go func() { defer close(done); _ = run(ctx) }()
	select {
	case <-all:
	case <-time.After(5 * time.Minute):
		b.Fatal("not all messages handled after 5 minutes")
	}
	elapsed := time.Since(start)
	b.StopTimer()
	cancel()
	<-done
	b.ReportMetric(float64(b.N)/elapsed.Seconds(), "msgs/s")
}
