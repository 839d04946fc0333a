package pgstore_test

import (
	"testing"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemgo/idem/postgres/pgstore"
	"github.com/idemgo/idem/postgres/pgtest"
	"github.com/idemgo/idem/storetest"
)

// TestWaitingDoAcrossPools runs the waiting Do (idem.WithWait) with one
// Executor on a store and the other on a second store with a pool of its
// own on the same schema: the waiter is woken by LISTEN/NOTIFY on its own
// connection.
func TestWaitingDoAcrossPools(t *testing.T) {
	pool, url := pgtest.Pool(t)
	first, err := pgstore.New(pool)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { first.Close() })
	if err := first.Migrate(t.Context()); err != nil {
		t.Fatalf("Migrate: %v", err)
	}
	pool2, err := pgxpool.New(t.Context(), url)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool2.Close)
	second, err := pgstore.New(pool2)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { second.Close() })
	storetest.RunWait(t, first, second)
}
