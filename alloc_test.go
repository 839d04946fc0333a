package idem_test

import (
	"context"
	"testing"

	"github.com/idemgo/idem"
	"github.com/idemgo/idem/memstore"
)

// TestDoAllocations holds Do on memstore to its allocation budget (README,
// "Stores": at most 6 per call), which BenchmarkDo measures: one more than
// that came in unnoticed once (a record's address taken from a parameter
// moved every completion's record to the heap).
func TestDoAllocations(t *testing.T) {
	budget := 6.0
	if raceEnabled {
		// With the race detector, sync.Pool drops some of what it is
		// given on purpose, so the heartbeat's pool allocates now and
		// then: one more per call on average (8 with the regression).
		budget++
	}
	s, err := memstore.New(memstore.WithCapacity(2048))
	if err != nil {
		t.Fatal(err)
	}
	e, err := idem.New(s)
	if err != nil {
		t.Fatal(err)
	}
	keys := benchKeys(1001) // AllocsPerRun runs the function once more
	fn := func(context.Context) ([]byte, error) { return benchValue, nil }
	ctx := context.Background()
	i := 0
	allocs := testing.AllocsPerRun(1000, func() {
		if _, err := e.Do(ctx, keys[i], "fp", fn); err != nil {
			t.Fatal(err)
		}
		i++
	})
	if allocs > budget {
		t.Errorf("Do on memstore: %v allocations per call, want at most %v", allocs, budget)
	}
}
