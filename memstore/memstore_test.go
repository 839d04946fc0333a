package memstore_test

import (
	"testing"

	"github.com/idemgo/idem/memstore"
	"github.com/idemgo/idem/storekit"
	"github.com/idemgo/idem/storetest"
)

func TestConformance(t *testing.T) {
	t.Parallel()
	storetest.Run(t, func(t *testing.T) storekit.Store {
		s, err := memstore.New()
		if err != nil {
			t.Fatal(err)
		}
		return s
	})
}
