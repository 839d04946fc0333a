package pggate_test

import (
	"context"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/idemgo/idem"
	"github.com/idemgo/idem/postgres/pggate"
)

// TestForeignInsert: the statement a handler in another language runs
// (docs/consume.md) inserts one completion per digest: a second
// transaction of the same digest changes no row (it must roll back), an
// expired row is replaced, and Committed returns the live row's result and
// nothing for a digest without one.
func TestForeignInsert(t *testing.T) {
	v := newEnv(t)
	ctx := t.Context()
	digest := idem.Key{Scope: "payments", ID: "k1"}.Digest()
	insert := func(fence int64, result string, retention int) int64 {
		t.Helper()
		var n int64
		err := pgx.BeginFunc(ctx, v.pool, func(tx pgx.Tx) error {
			tag, err := tx.Exec(ctx, pggate.ForeignInsert, digest, fence, []byte(result), retention)
			n = tag.RowsAffected()
			if err == nil && n == 1 {
				_, err = tx.Exec(ctx, `INSERT INTO effects (key, fence) VALUES ($1, $2)`, "k1", fence)
			}
			return err
		})
		if err != nil {
			t.Fatalf("insert fence %d: %v", fence, err)
		}
		return n
	}
	committed := func() (string, bool) {
		t.Helper()
		r, ok, err := v.gate.Committed(ctx, digest)
		if err != nil {
			t.Fatalf("Committed: %v", err)
		}
		return string(r), ok
	}
	if _, ok := committed(); ok {
		t.Fatal("Committed before any insert: got a row, want none")
	}
	if n := insert(1, "first", 0); n != 1 {
		t.Fatalf("first insert: %d rows, want 1", n)
	}
	if _, ok := committed(); ok {
		t.Error("a row of retention 0: Committed found it live, want it expired")
	}
	if n := insert(2, "second", 3600); n != 1 {
		t.Fatalf("insert over an expired row: %d rows, want 1 (replaced)", n)
	}
	if n := insert(3, "third", 3600); n != 0 {
		t.Fatalf("insert over a live row: %d rows, want 0", n)
	}
	if r, ok := committed(); !ok || r != "second" {
		t.Errorf("Committed: got %q %v, want the live row's result \"second\"", r, ok)
	}
	var relayed bool
	if err := v.pool.QueryRow(ctx, `SELECT relayed FROM idem_completions WHERE digest = $1`, digest).Scan(&relayed); err != nil || !relayed {
		t.Errorf("the row's relayed: %v %v, want true (the relay leaves it alone)", relayed, err)
	}
	if n, err := v.gate.Relay(context.WithoutCancel(ctx)); err != nil || n != 0 {
		t.Errorf("Relay: %d %v, want nothing relayed", n, err)
	}
}
