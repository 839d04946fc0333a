package pgsteps

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"os/signal"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/idemgo/idem"
	"github.com/idemgo/idem/chaos/chaostest"
	"github.com/idemgo/idem/consumer/redisstream"
	"github.com/idemgo/idem/postgres/pggate"
	"github.com/idemgo/idem/postgres/pgoutbox"
	"github.com/idemgo/idem/postgres/pgtest"
	"github.com/idemgo/idem/redisstore"
	"github.com/idemgo/idem/storekit"
	"github.com/idemgo/idem/testkit/redistest"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/redis/go-redis/v9"
)

// lease is the owners' lease, short so that a dead owner's request is
// taken over quickly.
const lease = time.Second

const waitTimeout = 60 * time.Second

func TestMain(m *testing.M) {
	if role := chaostest.Role(); role != "" {
		os.Exit(runChild(role))
	}
	os.Exit(m.Run())
}

// boundaries are the points at which the owner is killed: inside the
// order's transaction, after it committed, after the processor answered
// the charge (the reply is lost with the process), inside the last step's
// transaction, and after it committed, before the store heard of it.
var boundaries = []string{"order-in-tx", "order-committed", "charge-answered", "paid-in-tx", "paid-committed"}

// processor is a card processor that honours Idempotency-Key and counts
// the charges it made per order.
type processor struct {
	mu      sync.Mutex
	byKey   map[string]string
	charges map[string]int
}

func (p *processor) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	body, _ := io.ReadAll(r.Body)
	order, key := string(body), r.Header.Get("Idempotency-Key")
	p.mu.Lock()
	defer p.mu.Unlock()
	id, seen := p.byKey[key]
	if !seen {
		id = fmt.Sprintf("ch_%d", len(p.byKey)+1)
		p.charges[order]++
		p.byKey[key] = id
	}
	io.WriteString(w, id)
}

func charge(ctx context.Context, url, key, order string) (string, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, url, strings.NewReader(order))
	if err != nil {
		return "", err
	}
	req.Header.Set("Idempotency-Key", key)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return "", err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return string(b), err
}

// at is called at every boundary; the child stops itself at the one under
// test.
type at func(boundary string)

func flow(url string, at at) *pggate.Flow[pgx.Tx] {
	return &pggate.Flow[pgx.Tx]{Name: "checkout", Steps: []pggate.Step[pgx.Tx]{
		pggate.Local("order", func(ctx context.Context, tx pgx.Tx, s *pggate.State) error {
			if _, err := tx.Exec(ctx, `INSERT INTO orders (id) VALUES ($1)`, string(s.Input)); err != nil {
				return err
			}
			at("order-in-tx")
			return nil
		}),
		pggate.Foreign[pgx.Tx]("charge", func(ctx context.Context, key string, s *pggate.State) error {
			at("order-committed")
			id, err := charge(ctx, url, key, string(s.Input))
			if err != nil {
				return err
			}
			at("charge-answered")
			s.Set("charge", []byte(id))
			return nil
		}),
		pggate.Local("paid", func(ctx context.Context, tx pgx.Tx, s *pggate.State) error {
			order, ch := string(s.Input), string(s.Get("charge"))
			if _, err := tx.Exec(ctx, `INSERT INTO charges (order_id, charge) VALUES ($1, $2)`, order, ch); err != nil {
				return err
			}
			if err := pgoutbox.Publish(ctx, tx, "orders", "order-paid/"+order, []byte(ch), nil); err != nil {
				return err
			}
			s.Result = []byte("paid " + ch)
			at("paid-in-tx")
			return nil
		}),
	}}
}

// naive is the control: the same checkout without recovery points. The
// order commits on its own, the charge is sent with a key of this attempt,
// and a retry runs everything again.
func naive(ctx context.Context, pool *pgxpool.Pool, url, order string, at at) error {
	otx, err := pool.Begin(ctx)
	if err != nil {
		return err
	}
	defer otx.Rollback(ctx)
	if _, err := otx.Exec(ctx, `INSERT INTO orders (id) VALUES ($1)`, order); err != nil {
		return err
	}
	at("order-in-tx")
	if err := otx.Commit(ctx); err != nil {
		return err
	}
	at("order-committed")
	var b [8]byte
	rand.Read(b[:])
	ch, err := charge(ctx, url, order+"/"+hex.EncodeToString(b[:]), order)
	if err != nil {
		return err
	}
	at("charge-answered")
	tx, err := pool.Begin(ctx)
	if err != nil {
		return err
	}
	defer tx.Rollback(ctx)
	if _, err := tx.Exec(ctx, `INSERT INTO charges (order_id, charge) VALUES ($1, $2)`, order, ch); err != nil {
		return err
	}
	if err := pgoutbox.Publish(ctx, tx, "orders", "order-paid/"+order, []byte(ch), nil); err != nil {
		return err
	}
	at("paid-in-tx")
	if err := tx.Commit(ctx); err != nil {
		return err
	}
	at("paid-committed")
	return nil
}

// stalling wraps the store so that the completion after the last commit
// passes the boundary "paid-committed" first.
type stalling struct {
	idem.Store
	at at
}

func (s stalling) Unwrap() idem.Store { return s.Store }

func (s stalling) RelayCompletion(ctx context.Context, key string, c storekit.Completion) error {
	s.at("paid-committed")
	return s.Store.(storekit.Relayer).RelayCompletion(ctx, key, c)
}

func build(rdb *redis.Client, pool *pgxpool.Pool, at at) (*pggate.Gate[pgx.Tx], error) {
	rs, err := redisstore.New(rdb)
	if err != nil {
		return nil, err
	}
	var s idem.Store = rs
	if at != nil {
		s = stalling{rs, at}
	}
	e, err := idem.New(s, idem.WithLease(lease))
	if err != nil {
		return nil, err
	}
	return pggate.New(e, pool, pggate.WithRelayInterval(0), pggate.WithRelayDelay(0), pggate.WithCompleteInterval(0))
}

var resume = make(chan os.Signal, 1)

// runChild runs one checkout (CHILD_ORDER) as CHILD_MODE (gate or
// control) and stops itself at CHILD_AT, where the parent kills it.
func runChild(string) int {
	signal.Notify(resume, syscall.SIGUSR1)
	ctx := context.Background()
	rdb := redis.NewClient(&redis.Options{Addr: os.Getenv("CHILD_REDIS")})
	defer rdb.Close()
	pool, err := pgxpool.New(ctx, os.Getenv("CHILD_PG"))
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	defer pool.Close()
	stopAt, order := os.Getenv("CHILD_AT"), os.Getenv("CHILD_ORDER")
	at := func(b string) {
		if b == stopAt {
			chaostest.Say("at %s", b)
			syscall.Kill(os.Getpid(), syscall.SIGSTOP)
			<-resume
		}
	}
	if os.Getenv("CHILD_MODE") == "control" {
		err = naive(ctx, pool, os.Getenv("CHILD_PROC"), order, at)
	} else {
		var g *pggate.Gate[pgx.Tx]
		if g, err = build(rdb, pool, at); err == nil {
			defer g.Close()
			_, err = g.Run(ctx, idem.Key{Scope: "checkout", ID: order}, "fp", flow(os.Getenv("CHILD_PROC"), at), []byte(order))
		}
	}
	chaostest.Say("outcome err=%v", err)
	return 0
}

// TestStepsKilledAtEveryBoundary kills the owner of a checkout at every
// phase boundary; then, for half of the orders, the completer finishes
// what it left (and is checked to leave nothing unfinished), for the
// other half the client retries; the client then always retries until it
// gets the result. Gate: 1 charge at the processor, 1 order, 1 charge row
// and 1 "order paid" message per order. Control: the orders killed after
// their order committed get a second order, and those killed after the
// charge a second charge.
func TestStepsKilledAtEveryBoundary(t *testing.T) {
	perBoundary := chaostest.Size(2, 10)
	for _, m := range []string{"gate", "control"} {
		t.Run(m, func(t *testing.T) {
			srv := redistest.Start(t)
			rdb := srv.GoRedis(t)
			pool, url := pgtest.Pool(t)
			proc := &processor{byKey: map[string]string{}, charges: map[string]int{}}
			ps := httptest.NewServer(proc)
			t.Cleanup(ps.Close)
			g, err := build(rdb, pool, nil)
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { g.Close() })
			if err := g.Migrate(t.Context()); err != nil {
				t.Fatal(err)
			}
			if err := pgoutbox.Migrate(t.Context(), pool); err != nil {
				t.Fatal(err)
			}
			if _, err := pool.Exec(t.Context(), `CREATE TABLE orders (id text NOT NULL); CREATE TABLE charges (order_id text NOT NULL, charge text NOT NULL)`); err != nil {
				t.Fatal(err)
			}
			f := flow(ps.URL, func(string) {})
			if err := g.Register(f); err != nil {
				t.Fatal(err)
			}
			var c chaostest.Counters
			var orders []string
			completed, stuck := 0, 0
			for _, b := range boundaries {
				for i := range perBoundary {
					order := fmt.Sprintf("%s-%d", b, i)
					orders = append(orders, order)
					c.Attempted.Add(1)
					c.Executed.Add(1)
					p := chaostest.StartChild(t, "owner", "CHILD_REDIS="+srv.Addr(), "CHILD_PG="+url, "CHILD_MODE="+m,
						"CHILD_PROC="+ps.URL, "CHILD_ORDER="+order, "CHILD_AT="+b)
					p.Expect("at "+b, waitTimeout)
					p.Kill()
					key := idem.Key{Scope: "checkout", ID: order}
					if m == "gate" && i%2 == 0 {
						completed += finishByCompleter(t, g, pool, key)
						var n int
						pool.QueryRow(t.Context(), `SELECT count(*) FROM idem_completions WHERE digest = $1 AND progress IS NOT NULL`, key.Digest()).Scan(&n)
						stuck += n
					}
					// The client retries until it gets the result.
					deadline := time.Now().Add(waitTimeout)
					for {
						c.Attempted.Add(1)
						var err error
						if m == "control" {
							c.Executed.Add(1)
							err = naive(t.Context(), pool, ps.URL, order, func(string) {})
						} else {
							var res idem.Result
							res, err = g.Run(t.Context(), key, "fp", f, []byte(order))
							if err == nil && !res.Replayed {
								c.Executed.Add(1)
							}
						}
						if err == nil {
							c.Acknowledged.Add(1)
							break
						}
						if time.Now().After(deadline) {
							t.Fatalf("%s: no result within %v: %v", order, waitTimeout, err)
						}
						if !errors.Is(err, idem.ErrInProgress) {
							t.Logf("%s: retry: %v", order, err)
						}
						time.Sleep(100 * time.Millisecond) // the dead owner's lease runs out
					}
				}
			}
			processed, sends := downstream(t, rdb, pool, m)
			var doubleOrders, doubleCharges, doubleRows, doubleMsgs, doubleProcessed, missing int
			for _, o := range orders {
				var no, nc, nm int
				pool.QueryRow(t.Context(), `SELECT (SELECT count(*) FROM orders WHERE id = $1), (SELECT count(*) FROM charges WHERE order_id = $1),
  (SELECT count(*) FROM idem_outbox WHERE key = 'order-paid/' || $1)`, o).Scan(&no, &nc, &nm)
				proc.mu.Lock()
				np := proc.charges[o]
				proc.mu.Unlock()
				if no == 0 || nc == 0 || nm == 0 || np == 0 || processed["order-paid/"+o] == 0 {
					missing++
				}
				doubleProcessed += max(processed["order-paid/"+o]-1, 0)
				doubleOrders += max(no-1, 0)
				doubleRows += max(nc-1, 0)
				doubleMsgs += max(nm-1, 0)
				doubleCharges += max(np-1, 0)
			}
			c.Effects.Store(int64(len(orders)))
			c.Duplicated.Store(int64(doubleCharges + doubleOrders))
			c.Lost.Store(int64(missing))
			name := "checkout steps, owner killed at every boundary (gate)"
			if m == "control" {
				name = "checkout steps, owner killed at every boundary (control, no recovery points)"
			}
			chaostest.Report(t, name, "make chaos RUN=Steps", &c, map[string]string{
				"orders": strconv.Itoa(len(orders)), "boundaries": strconv.Itoa(len(boundaries)),
				"extra_charges_at_processor": strconv.Itoa(doubleCharges), "extra_orders": strconv.Itoa(doubleOrders),
				"extra_charge_rows": strconv.Itoa(doubleRows), "extra_messages": strconv.Itoa(doubleMsgs),
				"finished_by_completer": strconv.Itoa(completed), "stuck_after_completer": strconv.Itoa(stuck),
				"stream_entries": strconv.Itoa(sends), "extra_processed_downstream": strconv.Itoa(doubleProcessed),
			})
			switch {
			case m == "gate" && (doubleCharges+doubleOrders+doubleRows+doubleMsgs+doubleProcessed+missing+stuck != 0):
				t.Errorf("gate: extra charges %d, orders %d, charge rows %d, messages %d, processed downstream %d; %d orders missing an effect, %d stuck after the completer; want 0 each",
					doubleCharges, doubleOrders, doubleRows, doubleMsgs, doubleProcessed, missing, stuck)
			case m == "control" && (doubleCharges == 0 || doubleOrders == 0 || doubleProcessed == 0):
				t.Errorf("control: extra charges %d, orders %d, processed downstream %d; want some of each (the duplicates the steps and the consumer's key prevent)", doubleCharges, doubleOrders, doubleProcessed)
			}
		})
	}
}

// finishByCompleter runs the completer until the request of key is no
// longer unfinished (a dead owner's claim runs out after the lease), then
// the relay (a request whose last step committed before the store heard
// of it); it returns how many requests the completer finished.
func finishByCompleter(t *testing.T, g *pggate.Gate[pgx.Tx], pool *pgxpool.Pool, key idem.Key) int {
	t.Helper()
	deadline := time.Now().Add(waitTimeout)
	finished := 0
	for {
		fin, _, err := g.Complete(t.Context())
		if err != nil {
			t.Logf("completer: %v", err)
		}
		finished += fin
		var n int
		if err := pool.QueryRow(t.Context(), `SELECT count(*) FROM idem_completions WHERE digest = $1 AND progress IS NOT NULL`, key.Digest()).Scan(&n); err != nil {
			t.Fatal(err)
		}
		if n == 0 {
			if _, err := g.Relay(t.Context()); err != nil {
				t.Fatal(err)
			}
			return finished
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: still unfinished after %v of the completer", key.ID, waitTimeout)
		}
		time.Sleep(100 * time.Millisecond) // the dead owner's claim runs out
	}
}

// lossy is a Sender whose broker confirmation is lost for the first send
// of every other message: the entry is in the stream, the relay does not
// know and sends it again (at least once).
type lossy struct {
	inner pgoutbox.Sender
	mu    sync.Mutex
	seen  map[string]bool
	n     int
	sent  int
}

func (l *lossy) Send(ctx context.Context, key string, payload []byte, headers map[string]string) error {
	if err := l.inner.Send(ctx, key, payload, headers); err != nil {
		return err
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	l.sent++
	if !l.seen[key] {
		l.seen[key] = true
		if l.n++; l.n%2 == 0 {
			return errors.New("confirmation lost")
		}
	}
	return nil
}

// downstream relays the outbox to a Redis stream through lossy, then
// processes every entry of the stream as a consumer does: in mode gate
// through an idem Executor keyed by the message's key (the consumer's
// deduplication), in the control each entry as it comes. It returns how
// many times each key was processed and how many entries the stream got.
func downstream(t *testing.T, rdb *redis.Client, pool *pgxpool.Pool, m string) (map[string]int, int) {
	t.Helper()
	s, err := redisstream.NewSender(rdb, "orders")
	if err != nil {
		t.Fatal(err)
	}
	l := &lossy{inner: s, seen: map[string]bool{}}
	relay, err := pgoutbox.New(pool, map[string]pgoutbox.Sender{"orders": l}, pgoutbox.WithBackoff(10*time.Millisecond, 50*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(waitTimeout)
	for {
		if _, err := relay.Send(t.Context()); err != nil {
			t.Logf("relay: %v", err)
		}
		var unsent int
		if err := pool.QueryRow(t.Context(), `SELECT count(*) FROM idem_outbox WHERE sent_at IS NULL`).Scan(&unsent); err != nil {
			t.Fatal(err)
		}
		if unsent == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d outbox rows unsent after %v", unsent, waitTimeout)
		}
		time.Sleep(20 * time.Millisecond) // the failed rows' backoff
	}
	rs, err := redisstore.New(rdb)
	if err != nil {
		t.Fatal(err)
	}
	exec, err := idem.New(rs)
	if err != nil {
		t.Fatal(err)
	}
	entries, err := rdb.XRange(t.Context(), "orders", "-", "+").Result()
	if err != nil {
		t.Fatal(err)
	}
	processed := map[string]int{}
	for _, e := range entries {
		key, _ := e.Values[redisstream.DefaultKeyField].(string)
		if m == "control" {
			processed[key]++
			continue
		}
		if _, err := exec.Do(t.Context(), idem.Key{Scope: "downstream", ID: key}, "", func(context.Context) ([]byte, error) {
			processed[key]++
			return []byte("ok"), nil
		}); err != nil {
			t.Fatal(err)
		}
	}
	return processed, len(entries)
}
