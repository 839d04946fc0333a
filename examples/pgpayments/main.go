// Command pgpayments is a payments consumer whose effect is a write to
// PostgreSQL, made exactly once per payment through idem's commit gate
// (pggate): the payment row and idem's completion row commit in one
// transaction, so a redelivered or retried message never charges twice,
// even if Redis lost its record.
//
// It processes a batch of payment messages in which about a third are
// redeliveries of earlier ones, from several workers at once, then prints
// how many payments the database holds:
//
//	go run . -postgres postgres://postgres@127.0.0.1:5432/test              # pgstore: Postgres only
//	go run . -postgres postgres://postgres@127.0.0.1:5432/test -redis 127.0.0.1:6379  # hybrid
package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"strconv"
	"sync"
	"sync/atomic"

	"github.com/idemgo/idem"
	"github.com/idemgo/idem/postgres/pggate"
	"github.com/idemgo/idem/postgres/pgstore"
	"github.com/idemgo/idem/redisstore"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/redis/go-redis/v9"
)

// payment is one message: charge Amount to Account, once per ID.
type payment struct {
	ID      string `json:"id"`
	Account string `json:"account"`
	Amount  int64  `json:"amount"`
}

// receipt is the stored result, replayed to redeliveries.
type receipt struct {
	PaymentID string `json:"payment_id"`
	Fence     int64  `json:"fence"`
}

func main() {
	pgURL := flag.String("postgres", "postgres://postgres@127.0.0.1:5432/test?sslmode=disable", "PostgreSQL URL")
	redisAddr := flag.String("redis", "", "Redis address for the hybrid mode (empty: pgstore, Postgres only)")
	messages := flag.Int("messages", 300, "messages to process")
	flag.Parse()
	if err := run(context.Background(), os.Stdout, *pgURL, *redisAddr, *messages); err != nil {
		fmt.Fprintln(os.Stderr, "pgpayments:", err)
		os.Exit(1)
	}
}

func run(ctx context.Context, out io.Writer, pgURL, redisAddr string, messages int) error {
	pool, err := pgxpool.New(ctx, pgURL)
	if err != nil {
		return err
	}
	defer pool.Close()
	if _, err := pool.Exec(ctx, `CREATE TABLE IF NOT EXISTS payments (
  id text NOT NULL, account text NOT NULL, amount bigint NOT NULL, charged_at timestamptz NOT NULL DEFAULT now())`); err != nil {
		return err
	}

	// The store: Redis in front (hybrid) or the whole store in Postgres.
	var store idem.Store
	mode := "pgstore (Postgres only)"
	if redisAddr != "" {
		rdb := redis.NewClient(&redis.Options{Addr: redisAddr})
		defer rdb.Close()
		if store, err = redisstore.New(rdb); err != nil {
			return err
		}
		mode = "hybrid (Redis + Postgres)"
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

	// The messages: every third one redelivers an earlier payment.
	var batch []payment
	for i := range messages {
		if i%3 == 2 {
			batch = append(batch, batch[rand.IntN(len(batch))])
			continue
		}
		batch = append(batch, payment{ID: "pay-" + strconv.Itoa(i), Account: "acct-" + strconv.Itoa(i%7), Amount: int64(100 + i)})
	}

	var charged, replayed atomic.Int64
	work := make(chan payment)
	var wg sync.WaitGroup
	var firstErr error
	var once sync.Once
	for range 8 {
		wg.Go(func() {
			for p := range work {
				if err := handle(ctx, exec, gate, p, &charged, &replayed); err != nil {
					once.Do(func() { firstErr = err })
				}
			}
		})
	}
	for _, p := range batch {
		work <- p
	}
	close(work)
	wg.Wait()
	if firstErr != nil {
		return firstErr
	}
	var rows, distinct int
	if err := pool.QueryRow(ctx, `SELECT count(*), count(DISTINCT id) FROM payments`).Scan(&rows, &distinct); err != nil {
		return err
	}
	fmt.Fprintf(out, "mode: %s\n", mode)
	fmt.Fprintf(out, "messages: %d, charged: %d, replayed: %d\n", len(batch), charged.Load(), replayed.Load())
	fmt.Fprintf(out, "payments in the database: %d rows for %d payment ids\n", rows, distinct)
	return nil
}

// handle charges p once: the INSERT and idem's completion commit together.
// A redelivery that finds the payment in progress waits for it and gets
// the stored receipt.
func handle(ctx context.Context, exec *idem.Executor, gate *pggate.Gate[pgx.Tx], p payment, charged, replayed *atomic.Int64) error {
	key := idem.Key{Scope: "payments", ID: p.ID}
	fingerprint := p.Account + "/" + strconv.FormatInt(p.Amount, 10)
	for {
		res, err := gate.Do(ctx, key, fingerprint, func(ctx context.Context, tx pgx.Tx) ([]byte, error) {
			fence, _ := idem.FenceFrom(ctx)
			if _, err := tx.Exec(ctx, `INSERT INTO payments (id, account, amount) VALUES ($1, $2, $3)`, p.ID, p.Account, p.Amount); err != nil {
				return nil, err
			}
			return json.Marshal(receipt{PaymentID: p.ID, Fence: fence})
		})
		switch {
		case err == nil && res.Replayed:
			replayed.Add(1)
			return nil
		case err == nil:
			charged.Add(1)
			return nil
		case errors.Is(err, idem.ErrInProgress):
			if err := exec.Await(ctx, key); err != nil {
				return err
			}
		default:
			return fmt.Errorf("payment %s: %w", p.ID, err)
		}
	}
}
