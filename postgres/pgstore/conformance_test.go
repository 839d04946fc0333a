package pgstore_test

import (
	"testing"

	"github.com/idemgo/idem/postgres/pgstore"
	"github.com/idemgo/idem/postgres/pgtest"
	"github.com/idemgo/idem/storekit"
	"github.com/idemgo/idem/storetest"
)

func newStore(t *testing.T) *pgstore.Store {
	t.Helper()
	pool, _ := pgtest.Pool(t)
	s, err := pgstore.New(pool)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	if err := s.Migrate(t.Context()); err != nil {
		t.Fatalf("Migrate: %v", err)
	}
	return s
}

func TestConformance(t *testing.T) {
	s := newStore(t)
	storetest.Run(t, func(*testing.T) storekit.Store { return s })
}
