package pggate_test

import (
	"context"
	"strconv"
	"sync/atomic"
	"testing"

	"github.com/idemgo/idem"
	"github.com/idemgo/idem/memstore"
	"github.com/idemgo/idem/postgres/pggate"
	"github.com/idemgo/idem/postgres/pgtest"
	"github.com/idemgo/idem/redisstore"
	"github.com/idemgo/idem/testkit/proccpu"
	"github.com/idemgo/idem/testkit/redistest"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/redis/go-redis/v9"
)

// BenchmarkDo runs Gate.Do for new keys, one INSERT each, with 64 callers
// (32 per GOMAXPROCS on 2 cores), on each store: memstore (the gate's
// Postgres part) and redisstore with go-redis and with rueidis (the hybrid
// gate). It reports the CPU time of this process per key (go-cpu-µs/op,
// getrusage, the benchmark's own goroutines included: the same for every
// store); -benchmem gives the allocations per key of this process (the
// replay cache's tracking connection's included, with go-redis); make
// bench-postgres gives the CPU of every process.
func BenchmarkDo(b *testing.B) {
	pool, url := pgtest.Pool(b)
	cfg, err := pgxpool.ParseConfig(url)
	if err != nil {
		b.Fatal(err)
	}
	cfg.MaxConns = 80
	pool, err = pgxpool.NewWithConfig(b.Context(), cfg)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(pool.Close)
	if _, err := pool.Exec(b.Context(), `CREATE TABLE bench_effects (id bigint NOT NULL)`); err != nil {
		b.Fatal(err)
	}
	srv := redistest.Start(b)
	rdb := redis.NewClient(&redis.Options{Addr: srv.Addr(), PoolSize: 80})
	b.Cleanup(func() { rdb.Close() })
	stores := []struct {
		name  string
		store func() (idem.Store, error)
	}{
		{"memstore", func() (idem.Store, error) { return memstore.New() }},
		{"go-redis", func() (idem.Store, error) { return redisstore.New(rdb) }},
		// Without the replay cache and its own connections (the
		// tracking connection and the readers).
		{"go-redis-no-replay-cache", func() (idem.Store, error) { return redisstore.New(rdb, redisstore.WithReplayCache(false)) }},
		{"rueidis", func() (idem.Store, error) { return redisstore.NewRueidis(srv.Rueidis(b)) }},
	}
	var next atomic.Int64
	for _, s := range stores {
		b.Run(s.name, func(b *testing.B) {
			st, err := s.store()
			if err != nil {
				b.Fatal(err)
			}
			e, err := idem.New(st)
			if err != nil {
				b.Fatal(err)
			}
			g, err := pggate.New(e, pool, pggate.WithRelayInterval(0))
			if err != nil {
				b.Fatal(err)
			}
			defer g.Close()
			if err := g.Migrate(b.Context()); err != nil {
				b.Fatal(err)
			}
			ok := []byte("ok")
			b.SetParallelism(32)
			b.ReportAllocs()
			cpu := proccpu.Self()
			b.RunParallel(func(pb *testing.PB) {
				ctx := context.Background()
				for pb.Next() {
					id := next.Add(1)
					_, err := g.Do(ctx, idem.Key{Scope: "bench", ID: strconv.FormatInt(id, 10)}, "", func(ctx context.Context, tx pgx.Tx) ([]byte, error) {
						_, err := tx.Exec(ctx, `INSERT INTO bench_effects (id) VALUES ($1)`, id)
						return ok, err
					})
					if err != nil {
						b.Error(err)
						return
					}
				}
			})
			b.ReportMetric((proccpu.Self()-cpu)*1e6/float64(b.N), "go-cpu-µs/op")
		})
	}
}
