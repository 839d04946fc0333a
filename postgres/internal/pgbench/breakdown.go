package main

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/redis/go-redis/v9"
)

// timeline records, for one caller, when each round trip of a key began
// and ended: pgx's statements and batches, pool acquisitions and go-redis
// calls (-breakdown). Its hooks are installed only with -breakdown, so the
// measured modes pay nothing for them.
type timeline struct {
	mu sync.Mutex
	on bool
	ev []mark
}

// mark is one event: the start or end of a round trip (or of a key).
type mark struct {
	at    time.Time
	what  string
	start bool
}

func (t *timeline) add(what string, start bool) {
	now := time.Now()
	t.mu.Lock()
	if t.on {
		t.ev = append(t.ev, mark{now, what, start})
	}
	t.mu.Unlock()
}

// firstWords names a statement by its first two words.
func firstWords(sql string) string {
	f := strings.Fields(sql)
	return strings.Join(f[:min(2, len(f))], " ")
}

// begun records the start of a round trip and returns ctx (pgx's tracers).
func (t *timeline) begun(ctx context.Context, what string) context.Context {
	t.add(what, true)
	return ctx
}

// pgx's tracers: statements, batches, prepares and pool acquisitions.
func (t *timeline) TraceQueryStart(ctx context.Context, _ *pgx.Conn, d pgx.TraceQueryStartData) context.Context {
	return t.begun(ctx, "pg "+firstWords(d.SQL))
}
func (t *timeline) TraceQueryEnd(context.Context, *pgx.Conn, pgx.TraceQueryEndData) {
	t.add("pg", false)
}
func (t *timeline) TraceBatchStart(ctx context.Context, _ *pgx.Conn, d pgx.TraceBatchStartData) context.Context {
	var names []string
	for _, q := range d.Batch.QueuedQueries {
		names = append(names, firstWords(q.SQL))
	}
	return t.begun(ctx, "pg batch ["+strings.Join(names, "; ")+"]")
}
func (t *timeline) TraceBatchQuery(context.Context, *pgx.Conn, pgx.TraceBatchQueryData) {}
func (t *timeline) TraceBatchEnd(context.Context, *pgx.Conn, pgx.TraceBatchEndData) {
	t.add("pg batch", false)
}
func (t *timeline) TracePrepareStart(ctx context.Context, _ *pgx.Conn, d pgx.TracePrepareStartData) context.Context {
	return t.begun(ctx, "pg prepare "+firstWords(d.SQL))
}
func (t *timeline) TracePrepareEnd(context.Context, *pgx.Conn, pgx.TracePrepareEndData) {
	t.add("pg prepare", false)
}
func (t *timeline) TraceAcquireStart(ctx context.Context, _ *pgxpool.Pool, _ pgxpool.TraceAcquireStartData) context.Context {
	return t.begun(ctx, "pool acquire")
}
func (t *timeline) TraceAcquireEnd(context.Context, *pgxpool.Pool, pgxpool.TraceAcquireEndData) {
	t.add("pool acquire", false)
}

// go-redis hooks.
func (t *timeline) DialHook(next redis.DialHook) redis.DialHook { return next }

func (t *timeline) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		t.add("redis "+redisName(cmd), true)
		err := next(ctx, cmd)
		t.add("redis", false)
		return err
	}
}

func (t *timeline) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		t.add(fmt.Sprintf("redis pipeline of %d", len(cmds)), true)
		err := next(ctx, cmds)
		t.add("redis", false)
		return err
	}
}

// redisName names a call by its command and number of arguments (which
// tell the scripts apart).
func redisName(cmd redis.Cmder) string {
	return fmt.Sprintf("%s (%d args)", cmd.Name(), len(cmd.Args()))
}

// breakdown runs n keys one after another through o and prints, for the
// most common sequence of round trips a key made, the median time of each
// round trip and of each gap between them (the caller's own work: Go CPU,
// scheduling), and the median of the whole key.
func breakdown(ctx context.Context, tl *timeline, name string, o op, n int, id func() int64) error {
	for range 50 { // warm the connections and their statement caches
		if _, err := o(ctx, id()); err != nil {
			return err
		}
	}
	keys := make([][]mark, 0, n)
	for range n {
		tl.mu.Lock()
		tl.on, tl.ev = true, tl.ev[:0]
		tl.mu.Unlock()
		tl.add("key", true)
		if _, err := o(ctx, id()); err != nil {
			return err
		}
		tl.add("key", false)
		tl.mu.Lock()
		tl.on = false
		keys = append(keys, slices.Clone(tl.ev))
		tl.mu.Unlock()
	}
	// Group the keys by their sequence of events; report the commonest.
	seqs := map[string][][]mark{}
	for _, k := range keys {
		var b strings.Builder
		for _, m := range k {
			fmt.Fprintf(&b, "%s/%v|", m.what, m.start)
		}
		seqs[b.String()] = append(seqs[b.String()], k)
	}
	var common [][]mark
	for _, v := range seqs {
		if len(v) > len(common) {
			common = v
		}
	}
	fmt.Printf("\n%s: %d of %d keys made this sequence (%d sequences)\n\n", name, len(common), n, len(seqs))
	for seq, v := range seqs { // the others, so that an occasional extra round trip shows
		if len(v) != len(common) || &v[0] != &common[0] {
			fmt.Printf("- %d keys: %s\n", len(v), roundTrips(seq))
		}
	}
	fmt.Println("| step | median µs |")
	fmt.Println("|---|---:|")
	first := common[0]
	var sum float64
	for i := 0; i+1 < len(first); i++ {
		d := make([]float64, len(common))
		for j, k := range common {
			d[j] = float64(k[i+1].at.Sub(k[i].at).Nanoseconds()) / 1e3
		}
		slices.Sort(d)
		med := d[len(d)/2]
		sum += med
		a, b := first[i], first[i+1]
		label := "  (between: " + a.what + " → " + b.what + ")"
		if a.start && !b.start {
			label = a.what + " (round trip)"
		}
		fmt.Printf("| %s | %.1f |\n", label, med)
	}
	tot := make([]float64, len(common))
	for j, k := range common {
		tot[j] = float64(k[len(k)-1].at.Sub(k[0].at).Nanoseconds()) / 1e3
	}
	slices.Sort(tot)
	fmt.Printf("| **key, median** (sum of the medians %.1f) | **%.1f** |\n", sum, tot[len(tot)/2])
	return nil
}

// cpuAtOne runs n keys one after another through o and prints the wall
// time and the CPU time of Postgres, redis-server and this process per key.
func cpuAtOne(ctx context.Context, name string, o op, n int, id func() int64, redisPID int) error {
	before := readCPU(redisPID)
	start := time.Now()
	for range n {
		if _, err := o(ctx, id()); err != nil {
			return err
		}
	}
	wall := time.Since(start).Seconds() / float64(n)
	c := readCPU(redisPID).minus(before)
	k := 1e6 / float64(n)
	fmt.Printf("| %s | %.0f | %.0f | %.0f | %.0f | %.0f | %.0f |\n", name, wall*1e6, c.postgres*k, c.redis*k, c.self*k,
		(c.postgres+c.redis+c.self)*k, wall*1e6-(c.postgres+c.redis+c.self)*k)
	return nil
}

// roundTrips lists the round trips of a sequence of events (the starts).
func roundTrips(seq string) string {
	var out []string
	for _, e := range strings.Split(seq, "|") {
		if what, ok := strings.CutSuffix(e, "/true"); ok && what != "key" {
			out = append(out, what)
		}
	}
	return strings.Join(out, ", ")
}
