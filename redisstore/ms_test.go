package redisstore

import (
	"strconv"
	"testing"
	"time"

	"github.com/idemgo/idem/storekit"
)

// TestMsKeepsTheExecutorsDurations: the durations an Executor passes on
// every call (its default lease and retention, the TTL of an IN_PROGRESS
// record) are formatted once, then served from the cache without an
// allocation: none evicts another.
func TestMsKeepsTheExecutorsDurations(t *testing.T) {
	durations := []time.Duration{30 * time.Second, 24 * time.Hour, 2*30*time.Second + storekit.InProgressGrace, time.Hour}
	for _, d := range durations {
		if got, want := ms(d), strconv.FormatInt(d.Milliseconds(), 10); got != want {
			t.Fatalf("ms(%v) = %q, want %q", d, got, want)
		}
	}
	allocs := testing.AllocsPerRun(100, func() {
		for _, d := range durations {
			ms(d)
		}
	})
	if allocs != 0 {
		t.Errorf("%v allocations per round of the same %d durations, want 0", allocs, len(durations))
	}
}
