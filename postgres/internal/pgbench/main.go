// Command pgbench measures the commit gate side by side in one run (make
// bench-postgres): the same handler, one INSERT in a transaction, run
// without idem ("bare tx"), with an idempotency-keys row written by hand
// in the same transaction ("hand-written keys row", the fair anchor: what a
// careful team writes without idem), through pggate on redisstore ("hybrid gate",
// with go-redis, the client most users have, and with rueidis)
// and through pggate on pgstore ("pgstore gate"). It prints new keys per
// second at 1 and 64 concurrent callers and replays per second at 64, the
// medians of -runs runs of -duration each, as a Markdown table. The
// anchor's keys come from a counter ("bench/1", "bench/2", …), which its
// B-tree appends nearly in order; "hand-written keys row, UUID keys" keys
// the same row by random UUIDs, as clients send Idempotency-Key.
// "WithReplayCache(false)" runs the hybrid gate on go-redis without the
// replay cache and its connections (the tracking connection and the
// readers; until 3150060 it read an invalidation for every record
// written). "BEGIN alone" runs the gate with a function that asks for the
// transaction's connection first, so that BEGIN takes a round trip of its
// own as it did before the gate sent it with the first statement: the
// change measured side by side.
//
// Two more modes split the hybrid gate into its parts: "gate, in-process
// store" runs the gate on memstore (the gate's Postgres work, the
// completion row, with no store round trip) and "Redis lifecycle" runs
// Executor.Do on redisstore with a function that does nothing (the gate's
// Redis work, without Postgres). For every mode the table also gives the
// time per key at 1 caller and the CPU time per key at 64 callers of the
// Postgres server processes, redis-server and the benchmark's own process
// (Linux /proc), which tell where each mode's time goes, and the WAL bytes
// per key at 64 callers, the gate's relay of that measurement's
// completions included (the server's WAL insert position before and after,
// as pg_stat_wal's wal_bytes counts it, but exact at once; it counts the
// whole server: other databases' writes in the same seconds count too).
//
// With -breakdown N it measures nothing of the above: it runs N keys one
// after another through each mode with pgx's tracer and a go-redis hook
// installed and prints, for each mode, every round trip of a key (Redis
// calls, pool acquisitions, Postgres statements and batches) with the
// median time of each and of the caller's own work between them; then the
// wall and CPU time per key at one caller (Postgres, redis-server and this
// process; wall minus CPU is time when none of them ran), -runs times,
// the modes interleaved.
//
// It starts its own redis-server (no persistence, a free loopback port) and
// makes a schema of its own in IDEM_POSTGRES_URL, dropped at the end.
package main

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"flag"
	"fmt"
	"net"
	"net/url"
	"os"
	"os/exec"
	"runtime"
	"runtime/pprof"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/idemgo/idem"
	"github.com/idemgo/idem/memstore"
	"github.com/idemgo/idem/postgres/pggate"
	"github.com/idemgo/idem/postgres/pgstore"
	"github.com/idemgo/idem/postgres/pgtest"
	"github.com/idemgo/idem/redisstore"
	"github.com/idemgo/idem/testkit/proccpu"
	"github.com/idemgo/idem/testkit/redistest"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/redis/go-redis/v9"
	"github.com/redis/rueidis"
)

func main() {
	duration := flag.Duration("duration", 2*time.Second, "length of one measurement")
	runs := flag.Int("runs", 3, "measurements per cell; the median is printed")
	only := flag.String("modes", "", "comma-separated modes to run (bare,handwritten,handwritten-uuid,memgate,memgate-begin,lifecycle,hybrid,hybrid-begin,hybrid-rueidis,hybrid-no-replay-cache,pgstore,pgstore-quiet); all by default (bare and handwritten always run)")
	cpuprofile := flag.String("cpuprofile", "", "write a CPU profile of the whole run to this file")
	trace := flag.Int("breakdown", 0, "instead of the measurements, time each round trip of this many keys at one caller, mode by mode (go-redis and pgx hooks), and the CPU per key at one caller")
	flag.Parse()
	if *cpuprofile != "" {
		f, err := os.Create(*cpuprofile)
		if err != nil {
			fmt.Fprintln(os.Stderr, "pgbench:", err)
			os.Exit(1)
		}
		pprof.StartCPUProfile(f)
		defer pprof.StopCPUProfile()
	}
	if err := run(*duration, *runs, *only, *trace); err != nil {
		pprof.StopCPUProfile()
		fmt.Fprintln(os.Stderr, "pgbench:", err)
		os.Exit(1)
	}
}

// op runs the handler for one key and reports whether it was a replay.
type op func(ctx context.Context, id int64) (replayed bool, err error)

func insert(ctx context.Context, tx pgx.Tx, id int64) error {
	_, err := tx.Exec(ctx, `INSERT INTO bench_effects (id) VALUES ($1)`, id)
	return err
}

func run(duration time.Duration, runs int, only string, trace int) error {
	ctx := context.Background()
	addr, redisPID, stop, err := startRedis()
	if err != nil {
		return err
	}
	defer stop()
	schemaURL, drop, err := schema(ctx)
	if err != nil {
		return err
	}
	defer drop()
	cfg, err := pgxpool.ParseConfig(schemaURL)
	if err != nil {
		return err
	}
	cfg.MaxConns = 80
	tl := &timeline{}
	if trace > 0 {
		cfg.ConnConfig.Tracer = tl
	}
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return err
	}
	defer pool.Close()
	if _, err := pool.Exec(ctx, `CREATE TABLE bench_effects (id bigint NOT NULL)`); err != nil {
		return err
	}
	// The hand-written idempotency-keys table: the unique key, the
	// request's fingerprint, the stored response and when it was made (for
	// a janitor that deletes by age without an index, as in Brandur Leach's
	// design).
	for _, table := range []string{"bench_idempotency_keys", "bench_idempotency_keys_uuid"} {
		if _, err := pool.Exec(ctx, `CREATE TABLE `+table+` (
  key text PRIMARY KEY, fingerprint bytea NOT NULL, response bytea NOT NULL, created_at timestamptz NOT NULL DEFAULT now())`); err != nil {
			return err
		}
	}
	rdb := redis.NewClient(&redis.Options{Addr: addr, PoolSize: 80})
	defer rdb.Close()
	if trace > 0 {
		rdb.AddHook(tl)
	}

	// bare tx
	bare := func(ctx context.Context, id int64) (bool, error) {
		tx, err := pool.Begin(ctx)
		if err != nil {
			return false, err
		}
		defer tx.Rollback(ctx)
		if err := insert(ctx, tx, id); err != nil {
			return false, err
		}
		return false, tx.Commit(ctx)
	}
	// hand-written keys row: the effect and the key's row in one
	// transaction; the key's unique index decides, and a conflict rolls
	// the effect back and replays the stored response.
	keyRow := func(table string, key func(id int64) string) op {
		return func(ctx context.Context, id int64) (bool, error) {
			key := key(id)
			tx, err := pool.Begin(ctx)
			if err != nil {
				return false, err
			}
			defer tx.Rollback(ctx)
			if err := insert(ctx, tx, id); err != nil {
				return false, err
			}
			_, err = tx.Exec(ctx, `INSERT INTO `+table+` (key, fingerprint, response) VALUES ($1, $2, $3)`, key, []byte{}, []byte("ok"))
			var pe *pgconn.PgError
			if errors.As(err, &pe) && pe.Code == "23505" {
				tx.Rollback(ctx)
				var resp []byte
				return true, pool.QueryRow(ctx, `SELECT response FROM `+table+` WHERE key = $1`, key).Scan(&resp)
			}
			if err != nil {
				return false, err
			}
			return false, tx.Commit(ctx)
		}
	}
	handwritten := keyRow("bench_idempotency_keys", func(id int64) string { return "bench/" + strconv.FormatInt(id, 10) })
	// The same keyed by what clients send as Idempotency-Key, a random
	// UUID (here one derived from the id, so that a replay sends the same):
	// random keys land all over the B-tree, as the gate's digests do, and
	// are 36 characters long.
	handwrittenUUID := keyRow("bench_idempotency_keys_uuid", uuidOf)
	// gatedWith runs the handler through g; alone sends BEGIN in a round trip
	// of its own, as the gate did before it went with the first
	// statement: the function asks for the connection first (pgx.Tx.Conn
	// sends BEGIN alone).
	gatedWith := func(g *pggate.Gate[pgx.Tx], alone bool) op {
		return func(ctx context.Context, id int64) (bool, error) {
			res, err := g.Do(ctx, idem.Key{Scope: "bench", ID: strconv.FormatInt(id, 10)}, "", func(ctx context.Context, tx pgx.Tx) ([]byte, error) {
				if alone {
					tx.Conn()
				}
				return []byte("ok"), insert(ctx, tx, id)
			})
			return res.Replayed, err
		}
	}
	gated := func(g *pggate.Gate[pgx.Tx]) op { return gatedWith(g, false) }
	gatedAlone := func(g *pggate.Gate[pgx.Tx]) op { return gatedWith(g, true) }
	// gateOn returns a gate on an Executor on st, the caller closes it; err
	// is the error of st's constructor, so that gateOn(memstore.New()) reads.
	gateOn := func(st idem.Store, err error) (*pggate.Gate[pgx.Tx], *idem.Executor, error) {
		if err != nil {
			return nil, nil, err
		}
		e, err := idem.New(st)
		if err != nil {
			return nil, nil, err
		}
		// The relay runs where the benchmark says (see relayed), with no
		// delay, so that its work counts in the mode's measurement.
		g, err := pggate.New(e, pool, pggate.WithRelayInterval(0), pggate.WithRelayDelay(0))
		return g, e, err
	}
	rs, err := redisstore.New(rdb)
	if err != nil {
		return err
	}
	defer rs.Close()
	hg, he, err := gateOn(rs, nil)
	if err != nil {
		return err
	}
	defer hg.Close()
	if err := hg.Migrate(ctx); err != nil {
		return err
	}
	// The same without the replay cache (measured apart: its gain is on
	// replays; a new key costs it nothing since it tracks only the keys it
	// reads).
	rsNC, err := redisstore.New(rdb, redisstore.WithReplayCache(false))
	if err != nil {
		return err
	}
	defer rsNC.Close()
	ncg, _, err := gateOn(rsNC, nil)
	if err != nil {
		return err
	}
	defer ncg.Close()
	rc, err := rueidis.NewClient(rueidis.ClientOption{InitAddress: []string{addr}, DisableCache: true})
	if err != nil {
		return err
	}
	defer rc.Close()
	rg, _, err := gateOn(redisstore.NewRueidis(rc))
	if err != nil {
		return err
	}
	defer rg.Close()
	mg, _, err := gateOn(memstore.New())
	if err != nil {
		return err
	}
	defer mg.Close()
	lifecycle := func(ctx context.Context, id int64) (bool, error) {
		res, err := he.Do(ctx, idem.Key{Scope: "lifecycle", ID: strconv.FormatInt(id, 10)}, "", func(context.Context) ([]byte, error) {
			return []byte("ok"), nil
		})
		return res.Replayed, err
	}
	onPgstore := func(notify bool) (*pggate.Gate[pgx.Tx], func(), error) {
		ps, err := pgstore.New(pool, pgstore.WithNotify(notify))
		if err != nil {
			return nil, nil, err
		}
		if err := ps.Migrate(ctx); err != nil {
			return nil, nil, err
		}
		g, _, err := gateOn(ps, nil)
		if err != nil {
			return nil, nil, err
		}
		return g, func() { g.Close(); ps.Close() }, nil
	}
	pg, closePG, err := onPgstore(true)
	if err != nil {
		return err
	}
	defer closePG()
	pgq, closePGQ, err := onPgstore(false)
	if err != nil {
		return err
	}
	defer closePGQ()

	type mode struct {
		flag string
		name string
		op   op
		gate *pggate.Gate[pgx.Tx] // nil without the gate
	}
	var modes []mode
	for _, m := range []mode{{"bare", "bare tx", bare, nil}, {"handwritten", "hand-written keys row", handwritten, nil},
		{"handwritten-uuid", "hand-written keys row, UUID keys", handwrittenUUID, nil}, {"memgate", "gate, in-process store (its Postgres part)", gated(mg), mg},
		{"lifecycle", "Redis lifecycle, no Postgres (the gate's Redis part)", lifecycle, nil}, {"hybrid", "hybrid gate (Redis + Postgres)", gated(hg), hg},
		{"memgate-begin", "gate, in-process store, BEGIN alone", gatedAlone(mg), mg}, {"hybrid-begin", "hybrid gate, BEGIN alone", gatedAlone(hg), hg},
		{"hybrid-rueidis", "hybrid gate, rueidis client", gated(rg), rg},
		{"hybrid-no-replay-cache", "hybrid gate, WithReplayCache(false)", gated(ncg), ncg}, {"pgstore", "pgstore gate (Postgres only)", gated(pg), pg},
		{"pgstore-quiet", "pgstore gate, WithNotify(false)", gated(pgq), pgq}} {
		if only == "" || m.flag == "bare" || m.flag == "handwritten" || slices.Contains(strings.Split(only, ","), m.flag) {
			modes = append(modes, m)
		}
	}
	var next atomic.Int64
	if trace > 0 {
		for _, m := range modes {
			if err := breakdown(ctx, tl, m.name, m.op, trace, func() int64 { return next.Add(1) }); err != nil {
				return fmt.Errorf("%s: %w", m.name, err)
			}
		}
		fmt.Println("\n| mode, 1 caller | wall µs/key | CPU µs/key: Postgres | Redis | Go | total | wall − CPU |")
		fmt.Println("|---|---:|---:|---:|---:|---:|---:|")
		for r := range runs {
			for _, m := range modes {
				if err := cpuAtOne(ctx, fmt.Sprintf("%s (run %d)", m.name, r+1), m.op, trace, func() int64 { return next.Add(1) }, redisPID); err != nil {
					return fmt.Errorf("%s: %w", m.name, err)
				}
			}
		}
		return nil
	}
	type cells struct {
		new1, new64, replay64 float64
		cpu                   cpuTimes // per key at 64 callers
		wal                   float64  // bytes per key at 64 callers
	}
	results := make([]cells, len(modes))
	for r := range runs {
		for i, m := range modes { // interleaved, so drift hits every mode alike
			fmt.Fprintf(os.Stderr, "run %d/%d: %s\n", r+1, runs, m.name)
			n1, err := measure(ctx, m.op, 1, duration, func() int64 { return next.Add(1) }, false)
			if err != nil {
				return fmt.Errorf("%s: %w", m.name, err)
			}
			// The completions of the rows before (another mode's
			// replays, this one's caller) are relayed outside the
			// measurement, into the in-process store.
			if err := relayed(ctx, mg); err != nil {
				return err
			}
			before, walBefore := readCPU(redisPID), walBytes(ctx, pool)
			n64, err := measure(ctx, m.op, 64, duration, func() int64 { return next.Add(1) }, false)
			if err != nil {
				return fmt.Errorf("%s: %w", m.name, err)
			}
			keys := n64 * duration.Seconds()
			// The gate's relay copies each completion into its store once
			// more (a Gate runs it every second): part of a key's cost.
			if m.gate != nil {
				if err := relayed(ctx, m.gate); err != nil {
					return err
				}
			}
			used := readCPU(redisPID).minus(before)
			wal := float64(walBytes(ctx, pool)-walBefore) / keys
			samples[i] = append(samples[i], [7]float64{n1, n64, 0, used.postgres / keys, used.redis / keys, used.self / keys, wal})
			if i == 0 {
				continue
			}
			// Replays: 1000 completed keys, read again by 64 callers.
			base := next.Add(1000) - 1000
			for k := range int64(1000) {
				if _, err := m.op(ctx, base+k); err != nil {
					return err
				}
			}
			var rr atomic.Int64
			rp, err := measure(ctx, m.op, 64, duration, func() int64 { return base + rr.Add(1)%1000 }, true)
			if err != nil {
				return fmt.Errorf("%s replays: %w", m.name, err)
			}
			samples[i][len(samples[i])-1][2] = rp
		}
	}
	for i := range modes {
		results[i] = cells{median(samples[i], 0), median(samples[i], 1), median(samples[i], 2),
			cpuTimes{median(samples[i], 3), median(samples[i], 4), median(samples[i], 5)}, median(samples[i], 6)}
	}
	var version string
	pool.QueryRow(ctx, `SHOW server_version`).Scan(&version)
	fmt.Printf("pggate benchmark: PostgreSQL %s and redis-server on loopback, one INSERT per transaction, GOMAXPROCS %d, medians of %d runs of %v\n\n",
		version, runtime.GOMAXPROCS(0), runs, duration)
	fmt.Println("| mode | new keys/s, 1 caller | µs/key, 1 caller | × hand-written (1) | new keys/s, 64 callers | × bare (64) | × hand-written (64) | replays/s, 64 callers | CPU µs/key at 64: Postgres | Redis | Go | total | WAL B/key at 64 | × hand-written |")
	fmt.Println("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
	hw := results[1] // the hand-written keys row always runs second
	for i, m := range modes {
		rep := "—"
		if i > 0 {
			rep = fmt.Sprintf("%.0f", results[i].replay64)
		}
		r := results[i]
		c := r.cpu
		fmt.Printf("| %s | %.0f | %.0f | %.2f | %.0f | %.2f | %.2f | %s | %.0f | %.0f | %.0f | %.0f | %.0f | %.2f |\n", m.name, r.new1, 1e6/r.new1, r.new1/hw.new1,
			r.new64, r.new64/results[0].new64, r.new64/hw.new64, rep, c.postgres*1e6, c.redis*1e6, c.self*1e6, (c.postgres+c.redis+c.self)*1e6, r.wal, r.wal/hw.wal)
	}
	return nil
}

var samples = map[int][][7]float64{}

func median(s [][7]float64, col int) float64 {
	v := make([]float64, len(s))
	for i := range s {
		v[i] = s[i][col]
	}
	slices.Sort(v)
	return v[len(v)/2]
}

// measure runs o with callers goroutines for d and returns operations per
// second; every operation must (not) be a replay as wantReplay says.
func measure(ctx context.Context, o op, callers int, d time.Duration, id func() int64, wantReplay bool) (float64, error) {
	var done atomic.Int64
	var firstErr error
	var once sync.Once
	deadline := time.Now().Add(d)
	start := time.Now()
	var wg sync.WaitGroup
	for range callers {
		wg.Go(func() {
			for time.Now().Before(deadline) {
				replayed, err := o(ctx, id())
				if err == nil && replayed != wantReplay {
					err = fmt.Errorf("replayed %v, want %v", replayed, wantReplay)
				}
				if err != nil {
					once.Do(func() { firstErr = err })
					return
				}
				done.Add(1)
			}
		})
	}
	wg.Wait()
	return float64(done.Load()) / time.Since(start).Seconds(), firstErr
}

// walBytes is the position up to which the server has inserted WAL, in
// bytes (the whole server, every database). It is exact at once, where
// pg_stat_wal's wal_bytes lags: backends report it at most once a second.
func walBytes(ctx context.Context, pool *pgxpool.Pool) int64 {
	var n int64
	pool.QueryRow(ctx, `SELECT pg_wal_lsn_diff(pg_current_wal_insert_lsn(), '0/0')::bigint`).Scan(&n)
	return n
}

// relayed runs g's relay until it has passed every row.
func relayed(ctx context.Context, g *pggate.Gate[pgx.Tx]) error {
	if _, err := g.Relay(ctx); err != nil {
		return fmt.Errorf("relay: %w", err)
	}
	return nil
}

// startRedis starts redis-server without persistence on a free loopback
// port.
func startRedis() (addr string, pid int, stop func(), err error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", 0, nil, err
	}
	port := l.Addr().(*net.TCPAddr).Port
	l.Close()
	cmd := exec.Command("redis-server", "--port", strconv.Itoa(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no")
	if err := cmd.Start(); err != nil {
		return "", 0, nil, fmt.Errorf("redis-server: %w", err)
	}
	addr = "127.0.0.1:" + strconv.Itoa(port)
	stop = func() { cmd.Process.Kill(); cmd.Wait() }
	for i := 0; ; i++ {
		// Ours, not a server that took the port meanwhile.
		if redistest.Probe(addr, cmd.Process.Pid) == nil {
			return addr, cmd.Process.Pid, stop, nil
		}
		if i == 100 {
			stop()
			return "", 0, nil, fmt.Errorf("redis-server on %s did not answer", addr)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// schema makes a schema of its own and returns a URL that uses it.
func schema(ctx context.Context) (string, func(), error) {
	base := pgtest.BaseURL()
	conn, err := pgx.Connect(ctx, base)
	if err != nil {
		return "", nil, fmt.Errorf("Postgres at %s: %w", base, err)
	}
	name := fmt.Sprintf("idem_bench_%d", time.Now().UnixNano())
	if _, err := conn.Exec(ctx, "CREATE SCHEMA "+name); err != nil {
		conn.Close(ctx)
		return "", nil, err
	}
	drop := func() {
		conn.Exec(context.Background(), "DROP SCHEMA "+name+" CASCADE")
		conn.Close(context.Background())
	}
	u, err := url.Parse(base)
	if err != nil {
		drop()
		return "", nil, err
	}
	q := u.Query()
	q.Set("search_path", name)
	u.RawQuery = q.Encode()
	return u.String(), drop, nil
}

// cpuTimes are CPU seconds of the Postgres server's processes, of
// redis-server and of this process.
type cpuTimes struct{ postgres, redis, self float64 }

func (a cpuTimes) minus(b cpuTimes) cpuTimes {
	return cpuTimes{a.postgres - b.postgres, a.redis - b.redis, a.self - b.self}
}

// readCPU reads the CPU time used so far by every process named postgres,
// by the process redisPID and by this process, from /proc (zero where
// there is no /proc).
func readCPU(redisPID int) cpuTimes {
	var t cpuTimes
	dirs, _ := os.ReadDir("/proc")
	for _, d := range dirs {
		pid, err := strconv.Atoi(d.Name())
		if err != nil {
			continue
		}
		comm, secs, ok := proccpu.Read(pid)
		switch {
		case !ok:
		case pid == redisPID:
			t.redis = secs
		case pid == os.Getpid():
			t.self = secs
		case comm == "postgres":
			t.postgres += secs
		}
	}
	return t
}

// uuidOf is a version 4 UUID, in its text form, derived from id: a random
// one for every id, the same for the same id.
func uuidOf(id int64) string {
	h := sha256.Sum256(strconv.AppendInt(nil, id, 10))
	h[6] = h[6]&0x0f | 0x40
	h[8] = h[8]&0x3f | 0x80
	x := hex.EncodeToString(h[:16])
	return x[:8] + "-" + x[8:12] + "-" + x[12:16] + "-" + x[16:20] + "-" + x[20:]
}
