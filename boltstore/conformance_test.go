package boltstore

import (
	"path/filepath"
	"testing"

	"github.com/idemgo/idem/storekit"
	"github.com/idemgo/idem/storetest"
)

func TestConformance(t *testing.T) {
	storetest.Run(t, func(t *testing.T) storekit.Store {
		return openTest(t, filepath.Join(t.TempDir(), "idem.db"))
	})
}
