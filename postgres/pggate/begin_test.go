package pggate_test

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"

	"github.com/idemgo/idem"
	"github.com/idemgo/idem/postgres/pggate"
	"github.com/idemgo/idem/postgres/pgtest"
	"github.com/idemgo/idem/storekit"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// sends counts what a pool sends to the server: each query and each batch
// (pgx's tracer sees one of either per round trip once the connection's
// statements are prepared).
type sends struct{ n atomic.Int64 }

func (s *sends) TraceQueryStart(ctx context.Context, _ *pgx.Conn, _ pgx.TraceQueryStartData) context.Context {
	s.n.Add(1)
	return ctx
}

func (s *sends) TraceQueryEnd(context.Context, *pgx.Conn, pgx.TraceQueryEndData) {}

func (s *sends) TraceBatchStart(ctx context.Context, _ *pgx.Conn, _ pgx.TraceBatchStartData) context.Context {
	s.n.Add(1)
	return ctx
}

func (s *sends) TraceBatchQuery(context.Context, *pgx.Conn, pgx.TraceBatchQueryData) {}
func (s *sends) TraceBatchEnd(context.Context, *pgx.Conn, pgx.TraceBatchEndData)     {}

// newTracedEnv is newEnv on a pool of one connection whose round trips s
// counts.
func newTracedEnv(t *testing.T) (*env, *sends) {
	t.Helper()
	url := pgtest.Schema(t)
	cfg, err := pgxpool.ParseConfig(url)
	if err != nil {
		t.Fatal(err)
	}
	s := &sends{}
	cfg.ConnConfig.Tracer = s
	cfg.MaxConns = 1 // its statements are prepared once
	pool, err := pgxpool.NewWithConfig(t.Context(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	return newEnvOn(t, pool, url), s
}

// TestRoundTrips counts what the gate sends to Postgres for a new key: its
// BEGIN goes with the function's first statement, or with the completion
// and COMMIT when the function runs none, and a transaction that ran
// nothing is rolled back without a round trip.
func TestRoundTrips(t *testing.T) {
	v, s := newTracedEnv(t)
	none := func(context.Context, pgx.Tx) ([]byte, error) { return []byte("v"), nil }
	boom := errors.New("boom")
	for _, c := range []struct {
		name string
		fn   func(ctx context.Context, tx pgx.Tx) ([]byte, error)
		err  error
		want int64
	}{
		{"one statement", effect("rt", "v"), nil, 2}, // effect with BEGIN; completion with COMMIT
		{"two statements", func(ctx context.Context, tx pgx.Tx) ([]byte, error) {
			effect("rt", "")(ctx, tx)
			return effect("rt", "v")(ctx, tx)
		}, nil, 3}, // and the second statement
		{"no statement", none, nil, 1}, // BEGIN, completion and COMMIT
		{"no statement, error", func(context.Context, pgx.Tx) ([]byte, error) { return nil, boom }, boom, 0},                                    // nothing to roll back
		{"one statement, error", func(ctx context.Context, tx pgx.Tx) ([]byte, error) { effect("rt", "")(ctx, tx); return nil, boom }, boom, 2}, // and ROLLBACK
	} {
		t.Run(c.name, func(t *testing.T) {
			// The first call prepares the statements on the connection.
			if _, err := v.gate.Do(t.Context(), idem.Key{Scope: c.name, ID: "warm"}, "", c.fn); !errors.Is(err, c.err) {
				t.Fatalf("Do: got %v, want %v", err, c.err)
			}
			before := s.n.Load()
			if _, err := v.gate.Do(t.Context(), idem.Key{Scope: c.name, ID: "new"}, "", c.fn); !errors.Is(err, c.err) {
				t.Fatalf("Do: got %v, want %v", err, c.err)
			}
			if got := s.n.Load() - before; got != c.want {
				t.Fatalf("round trips for a new key: got %d, want %d", got, c.want)
			}
		})
	}
}

// TestTransactionCalls runs the effect through each call of the
// transaction handed to the function, first in the transaction and after
// another statement: the effect and the completion commit together, once,
// and an error rolls both back.
func TestTransactionCalls(t *testing.T) {
	v := newEnv(t)
	ins := `INSERT INTO effects (key, fence) VALUES ($1, 1)`
	calls := map[string]func(ctx context.Context, tx pgx.Tx, id string) error{
		"Exec": func(ctx context.Context, tx pgx.Tx, id string) error {
			_, err := tx.Exec(ctx, ins, id)
			return err
		},
		"Query": func(ctx context.Context, tx pgx.Tx, id string) error {
			rows, err := tx.Query(ctx, ins+` RETURNING key`, id)
			if err != nil {
				return err
			}
			keys, err := pgx.CollectRows(rows, pgx.RowTo[string])
			if err == nil && (len(keys) != 1 || keys[0] != id) {
				err = errors.New("wrong rows")
			}
			return err
		},
		"QueryRow": func(ctx context.Context, tx pgx.Tx, id string) error {
			var k string
			return tx.QueryRow(ctx, ins+` RETURNING key`, id).Scan(&k)
		},
		"QueryRow no rows": func(ctx context.Context, tx pgx.Tx, id string) error {
			var k string
			if err := tx.QueryRow(ctx, `SELECT key FROM effects WHERE false`).Scan(&k); !errors.Is(err, pgx.ErrNoRows) {
				return errors.New("want pgx.ErrNoRows")
			}
			_, err := tx.Exec(ctx, ins, id)
			return err
		},
		"SendBatch": func(ctx context.Context, tx pgx.Tx, id string) error {
			b := &pgx.Batch{}
			b.Queue(`SELECT 1`)
			b.Queue(ins, id)
			return tx.SendBatch(ctx, b).Close()
		},
		"Begin": func(ctx context.Context, tx pgx.Tx, id string) error {
			sp, err := tx.Begin(ctx)
			if err != nil {
				return err
			}
			if _, err := sp.Exec(ctx, ins, id+"-undone"); err != nil {
				return err
			}
			if err := sp.Rollback(ctx); err != nil { // to the savepoint only
				return err
			}
			_, err = tx.Exec(ctx, ins, id)
			return err
		},
		"CopyFrom": func(ctx context.Context, tx pgx.Tx, id string) error {
			_, err := tx.CopyFrom(ctx, pgx.Identifier{"effects"}, []string{"key", "fence"}, pgx.CopyFromRows([][]any{{id, int64(1)}}))
			return err
		},
		"Conn": func(ctx context.Context, tx pgx.Tx, id string) error {
			_, err := tx.Conn().Exec(ctx, ins, id)
			return err
		},
		"LargeObjects": func(ctx context.Context, tx pgx.Tx, id string) error {
			lo := tx.LargeObjects()
			if _, err := lo.Create(ctx, 0); err != nil {
				return err
			}
			_, err := tx.Exec(ctx, ins, id)
			return err
		},
	}
	boom := errors.New("boom")
	for name, call := range calls {
		for _, after := range []bool{false, true} {
			id := name
			if after {
				id += " after a statement"
			}
			t.Run(id, func(t *testing.T) {
				fn := func(fail bool) func(ctx context.Context, tx pgx.Tx) ([]byte, error) {
					return func(ctx context.Context, tx pgx.Tx) ([]byte, error) {
						if after {
							if _, err := tx.Exec(ctx, `SELECT 1`); err != nil {
								return nil, err
							}
						}
						if err := call(ctx, tx, id); err != nil {
							return nil, err
						}
						if fail {
							return nil, boom
						}
						return []byte("done"), nil
					}
				}
				if _, err := v.gate.Do(t.Context(), idem.Key{Scope: "fail", ID: id}, "", fn(true)); !errors.Is(err, boom) {
					t.Fatalf("Do of a failing function: got %v, want boom", err)
				}
				if n := v.effects(t, id); n != 0 {
					t.Fatalf("effects after a failure: got %d, want 0", n)
				}
				for i := range 2 {
					res, err := v.gate.Do(t.Context(), idem.Key{Scope: "t", ID: id}, "", fn(false))
					if err != nil || res.Replayed != (i == 1) || string(res.Value) != "done" {
						t.Fatalf("Do %d: got %+v, %v", i, res, err)
					}
				}
				if n := v.effects(t, id); n != 1 {
					t.Fatalf("effects: got %d, want 1", n)
				}
				if n := v.effects(t, id+"-undone"); n != 0 {
					t.Fatalf("effects rolled back to the savepoint: got %d, want 0", n)
				}
			})
		}
	}
}

// TestFirstStatementRefused: when the function's first statement is
// refused before it runs (it names a table that does not exist) and the
// function ignores the error, nothing commits, the gate reports neither a
// missing completion table nor a function that ended the transaction, and
// the key is released.
func TestFirstStatementRefused(t *testing.T) {
	v := newEnv(t)
	key := idem.Key{Scope: "t", ID: "refused"}
	_, err := v.gate.Do(t.Context(), key, "", func(ctx context.Context, tx pgx.Tx) ([]byte, error) {
		tx.Exec(ctx, `INSERT INTO no_such_table VALUES (1)`)
		return effect("refused", "v")(ctx, tx)
	})
	if err == nil || errors.Is(err, pggate.ErrNoTable) || errors.Is(err, pggate.ErrTxDone) {
		t.Fatalf("Do: got %v, want the refusal", err)
	}
	if n := v.effects(t, "refused"); n != 0 {
		t.Fatalf("effects: got %d, want 0", n)
	}
	if rec, err := v.store.Get(t.Context(), key.Digest()); err != nil || rec.State != storekit.StateReleased {
		t.Fatalf("record: got %v, %v, want RELEASED", rec.State, err)
	}
	if res, err := v.gate.Do(t.Context(), key, "", effect("refused", "v")); err != nil || res.Replayed {
		t.Fatalf("Do again: got %+v, %v", res, err)
	}
	if n := v.effects(t, "refused"); n != 1 {
		t.Fatalf("effects: got %d, want 1", n)
	}
}
