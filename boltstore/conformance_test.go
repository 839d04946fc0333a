package boltstore

import (
	"path/filepath"
	"testing"

	"github.com/idemgo/idem"
	"github.com/idemgo/idem/storetest"
)

func TestConformance(t *testing.T) {
	storetest.Run(t, func(t *testing.T) idem.Store {
		return openTest(t, filepath.Join(t.TempDir(), "idem.db"))
	})
}
