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

// TestRecordArgsInOneAllocation: the record key, the notification channel
// and the fence of the calls that end an attempt are what Key, channel and
// strconv make, in one allocation instead of three.
func TestRecordArgsInOneAllocation(t *testing.T) {
	s := &Store{prefix: "p:"}
	key := "AAAAAAAAAAAAAAAAAAAAAA"
	for _, fence := range []int64{0, 7, -1, 1764412345678901, 1<<63 - 1} {
		rkey, ch, f := s.recordArgs(key, fence)
		if rkey != s.Key(key) || ch != s.channel(key) || f != strconv.FormatInt(fence, 10) {
			t.Fatalf("recordArgs(%q, %d) = %q, %q, %q, want %q, %q, %q", key, fence, rkey, ch, f, s.Key(key), s.channel(key), strconv.FormatInt(fence, 10))
		}
	}
	var sink string
	allocs := testing.AllocsPerRun(100, func() {
		rkey, ch, f := s.recordArgs(key, 1764412345678901)
		sink = rkey + ch[:0] + f[:0]
	})
	_ = sink
	if allocs != 1 {
		t.Errorf("%v allocations per call, want 1", allocs)
	}
}
