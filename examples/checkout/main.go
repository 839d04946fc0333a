// Command checkout is an order checkout in three steps through idem's
// commit gate (pggate.Gate.Run): create the order, charge the card at a
// payment processor, record the charge and publish "order paid" through
// the transactional outbox (pgoutbox). Each local step commits with its
// recovery point, the charge carries a key derived from the request's, so
// a retry resumes where the last one stopped and never charges twice, even
// when the processor charged but its reply was lost.
//
//	go run . -postgres postgres://postgres@127.0.0.1:5432/test                        # pgstore: Postgres only
//	go run . -postgres postgres://postgres@127.0.0.1:5432/test -redis 127.0.0.1:6379  # hybrid
package main

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"

	"github.com/idemgo/idem"
	"github.com/idemgo/idem/postgres/pggate"
	"github.com/idemgo/idem/postgres/pgoutbox"
	"github.com/idemgo/idem/postgres/pgstore"
	"github.com/idemgo/idem/redisstore"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/redis/go-redis/v9"
)

func main() {
	pgURL := flag.String("postgres", "postgres://postgres@127.0.0.1:5432/test?sslmode=disable", "PostgreSQL URL")
	redisAddr := flag.String("redis", "", "Redis address for the hybrid mode (empty: pgstore, Postgres only)")
	orders := flag.Int("orders", 30, "orders to check out")
	flag.Parse()
	if err := run(context.Background(), os.Stdout, *pgURL, *redisAddr, *orders); err != nil {
		fmt.Fprintln(os.Stderr, "checkout:", err)
		os.Exit(1)
	}
}

// order is the request's body, the flow's input.
type order struct {
	ID     string `json:"id"`
	Amount int64  `json:"amount"`
}

// flow is the checkout: the order, the charge, the charge recorded with
// the "order paid" message. url is the processor's.
func flow(url string) *pggate.Flow[pgx.Tx] {
	return &pggate.Flow[pgx.Tx]{Name: "checkout", Steps: []pggate.Step[pgx.Tx]{
		pggate.Local("order", func(ctx context.Context, tx pgx.Tx, s *pggate.State) error {
			var o order
			if err := json.Unmarshal(s.Input, &o); err != nil {
				return idem.Terminal(err)
			}
			_, err := tx.Exec(ctx, `INSERT INTO checkout_orders (id, amount, status) VALUES ($1, $2, 'pending')`, o.ID, o.Amount)
			return err
		}),
		pggate.Foreign[pgx.Tx]("charge", func(ctx context.Context, key string, s *pggate.State) error {
			var o order
			json.Unmarshal(s.Input, &o)
			req, err := http.NewRequestWithContext(ctx, http.MethodPost, url, strings.NewReader(o.ID))
			if err != nil {
				return err
			}
			req.Header.Set("Idempotency-Key", key) // the same on every retry
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				return err // the charge may have happened: the retry asks again with the same key
			}
			defer resp.Body.Close()
			id, err := io.ReadAll(resp.Body)
			if err != nil || resp.StatusCode != http.StatusOK {
				return fmt.Errorf("processor: %d %w", resp.StatusCode, err)
			}
			s.Set("charge", id)
			return nil
		}),
		pggate.Local("paid", func(ctx context.Context, tx pgx.Tx, s *pggate.State) error {
			var o order
			json.Unmarshal(s.Input, &o)
			charge := string(s.Get("charge"))
			if _, err := tx.Exec(ctx, `INSERT INTO checkout_charges (order_id, charge_id) VALUES ($1, $2)`, o.ID, charge); err != nil {
				return err
			}
			if _, err := tx.Exec(ctx, `UPDATE checkout_orders SET status = 'paid' WHERE id = $1`, o.ID); err != nil {
				return err
			}
			msg, _ := json.Marshal(map[string]string{"order": o.ID, "charge": charge})
			if err := pgoutbox.Publish(ctx, tx, "orders", "order-paid/"+o.ID, msg, nil); err != nil {
				return err
			}
			s.Result = msg
			return nil
		}),
	}}
}

func run(ctx context.Context, out io.Writer, pgURL, redisAddr string, orders int) error {
	pool, err := pgxpool.New(ctx, pgURL)
	if err != nil {
		return err
	}
	defer pool.Close()
	var store idem.Store
	mode := "pgstore (Postgres only)"
	if redisAddr != "" {
		rdb := redis.NewClient(&redis.Options{Addr: redisAddr})
		defer rdb.Close()
		rs, err := redisstore.New(rdb)
		if err != nil {
			return err
		}
		defer rs.Close()
		store, mode = rs, "hybrid (Redis + Postgres)"
	} else {
		ps, err := pgstore.New(pool)
		if err != nil {
			return err
		}
		defer ps.Close()
		if err := ps.Migrate(ctx); err != nil {
			return err
		}
		store = ps
	}
	exec, err := idem.New(store)
	if err != nil {
		return err
	}
	gate, err := pggate.New(exec, pool)
	if err != nil {
		return err
	}
	defer gate.Close()
	if err := gate.Migrate(ctx); err != nil {
		return err
	}
	if err := pgoutbox.Migrate(ctx, pool); err != nil {
		return err
	}
	if _, err := pool.Exec(ctx, `CREATE TABLE IF NOT EXISTS checkout_orders (id text NOT NULL, amount bigint NOT NULL, status text NOT NULL);
CREATE TABLE IF NOT EXISTS checkout_charges (order_id text NOT NULL, charge_id text NOT NULL)`); err != nil {
		return err
	}

	// The processor loses its reply to the first charge of every third order.
	proc := newProcessor(func(order string) bool {
		n, _ := strconv.Atoi(order[strings.LastIndexByte(order, '-')+1:])
		return n%3 == 0
	})
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return err
	}
	srv := &http.Server{Handler: proc}
	go srv.Serve(l)
	defer srv.Close()
	f := flow("http://" + l.Addr().String())
	if err := gate.Register(f); err != nil { // the completer finishes what a dead process left
		return err
	}

	var b [4]byte
	rand.Read(b[:])
	runID := hex.EncodeToString(b[:]) // order ids of this run
	var retried, replayed atomic.Int64
	var wg sync.WaitGroup
	errs := make(chan error, orders)
	for i := range orders {
		wg.Go(func() {
			o := order{ID: fmt.Sprintf("%s-%d", runID, i+1), Amount: int64(1000 + i)}
			in, _ := json.Marshal(o)
			key := idem.Key{Scope: "checkout", ID: o.ID}
			// The client retries with the same key until it gets an
			// answer, then once more (a retry of a paid order).
			for attempt := 0; ; attempt++ {
				_, err := gate.Run(ctx, key, string(in), f, in)
				if err == nil {
					break
				}
				if attempt == 5 || errors.Is(err, idem.ErrFailed) {
					errs <- fmt.Errorf("order %s: %w", o.ID, err)
					return
				}
				retried.Add(1)
			}
			if res, err := gate.Run(ctx, key, string(in), f, in); err != nil || !res.Replayed {
				errs <- fmt.Errorf("order %s: the retry of a paid order: replayed %v, %v", o.ID, res.Replayed, err)
				return
			}
			replayed.Add(1)
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		return err
	}

	once, more, lost := proc.counts()
	var paid, ids, charges, msgs int
	if err := pool.QueryRow(ctx, `SELECT count(*) FILTER (WHERE status = 'paid'), count(DISTINCT id),
  (SELECT count(*) FROM checkout_charges WHERE order_id LIKE $1),
  (SELECT count(*) FROM idem_outbox WHERE key LIKE 'order-paid/' || $1)
FROM checkout_orders WHERE id LIKE $1`, runID+"-%").Scan(&paid, &ids, &charges, &msgs); err != nil {
		return err
	}
	fmt.Fprintf(out, "mode: %s\n", mode)
	fmt.Fprintf(out, "orders: %d, retried after an error: %d, paid orders retried and replayed: %d\n", orders, retried.Load(), replayed.Load())
	fmt.Fprintf(out, "processor: %d orders charged once, %d more than once, %d replies lost\n", once, more, lost)
	fmt.Fprintf(out, "database: %d orders paid (%d ids), %d charges, %d \"order paid\" messages in the outbox\n", paid, ids, charges, msgs)
	return nil
}
