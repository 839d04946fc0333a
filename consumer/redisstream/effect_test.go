package redisstream

import (
	"context"
	"strconv"
	"testing"
	"time"

	"github.com/idemgo/idem"
	"github.com/idemgo/idem/consumer"
	"github.com/idemgo/idem/redisstore"
	"github.com/idemgo/idem/storekit"
	"github.com/redis/go-redis/v9"
)

// TestEffectCompletedAndAckedInOneCall: each handler attaches an effect
// (count the key once, refuse "bad"); the effect, the completion and the
// XACK happen in one call: duplicates apply nothing, the refused effect
// leaves its entry unacknowledged and its key released, then, at the
// maximum of deliveries, its key FAILED and the entry dead-lettered.
func TestEffectCompletedAndAckedInOneCall(t *testing.T) {
	for _, functions := range []bool{false, true} {
		t.Run(map[bool]string{false: "scripts", true: "functions"}[functions], func(t *testing.T) {
			rdb := standalone(t)
			opts := []redisstore.Option{redisstore.WithHashTag("t"), redisstore.WithEffect("count", `
if ARGV[1] == 'bad' then return redis.error_reply('refused') end
redis.call('HINCRBY', KEYS[1], ARGV[1], 1)`)}
			if functions {
				opts = append(opts, redisstore.WithFunctions())
			}
			store, err := redisstore.New(rdb, opts...)
			if err != nil {
				t.Fatal(err)
			}
			e := &env{t: t, rdb: rdb, store: store, stream: "{t}:orders", group: "g", lease: time.Second}
			const keys = 50
			for i := range 3 * keys {
				e.add("key", "k"+strconv.Itoa(i%keys))
			}
			e.add("key", "bad")
			counts := store.EffectKey(idem.Key{}, "counts")
			c := e.consumer("c1", consumer.WithMaxDeliveries(2), WithClaimIdle(30*time.Millisecond), consumer.WithBatchSize(16))
			err = e.run(c, func(ctx context.Context, m redis.XMessage) error {
				return idem.SetEffect(ctx, idem.Effect{Name: "count", Keys: []string{counts}, Args: []string{m.Values["key"].(string)}})
			}, func() bool { s := c.Stats(); return s.Processed+s.Replayed == 3*keys && s.DeadLettered == 1 })
			if err != nil {
				t.Fatal(err)
			}
			got, err := rdb.HGetAll(t.Context(), counts).Result()
			if err != nil {
				t.Fatal(err)
			}
			if len(got) != keys {
				t.Fatalf("got %d keys counted, want %d", len(got), keys)
			}
			for k, n := range got {
				if n != "1" {
					t.Fatalf("key %s counted %s times, want 1", k, n)
				}
			}
			if s := c.Stats(); s.Processed != keys {
				t.Fatalf("stats %+v, want %d processed", s, keys)
			}
			if p := e.pending(); p != 0 {
				t.Fatalf("pending %d, want 0", p)
			}
			rec, err := store.Get(t.Context(), idem.Key{Scope: e.stream, ID: "bad"}.Digest())
			if err != nil || rec.State != storekit.StateFailed {
				t.Fatalf("record of the refused entry: %v %v, want FAILED", rec.State, err)
			}
		})
	}
}
