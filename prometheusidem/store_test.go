package prometheusidem_test

import (
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/idemgo/idem"
	"github.com/idemgo/idem/memstore"
	"github.com/idemgo/idem/prometheusidem"
	"github.com/idemgo/idem/storekit"
)

// statsStore is a memstore whose Stats answer is set by the test.
type statsStore struct {
	idem.Store
	st  storekit.Stats
	err error
}

func (s *statsStore) Stats(context.Context) (storekit.Stats, error) { return s.st, s.err }

// TestStoreCollector checks the gauges read from a store, and that a
// store that does not answer gives idem_store_stats_up 0.
func TestStoreCollector(t *testing.T) {
	ms, _ := memstore.New()
	s := &statsStore{Store: ms}
	s.st.Records[storekit.StateInProgress] = 2
	s.st.Records[storekit.StateCompleted] = 5
	s.st.Sampled = true
	s.st.OldestInProgress = 1500_000_000 // 1.5s
	s.st.MemoryUsed, s.st.MemoryLimit = 90, 100
	c, err := prometheusidem.NewStoreCollector(s)
	if err != nil {
		t.Fatal(err)
	}
	want := `
# HELP idem_store_memory_max_bytes The store's memory limit (Redis maxmemory; 0 none or unknown).
# TYPE idem_store_memory_max_bytes gauge
idem_store_memory_max_bytes 100
# HELP idem_store_memory_used_bytes Memory the store uses (Redis used_memory of the node closest to its limit; boltstore the size of its file and log; 0 unknown).
# TYPE idem_store_memory_used_bytes gauge
idem_store_memory_used_bytes 90
# HELP idem_store_oldest_in_progress_seconds Age of the oldest IN_PROGRESS record counted, since it was first acquired (0: none).
# TYPE idem_store_oldest_in_progress_seconds gauge
idem_store_oldest_in_progress_seconds 1.5
# HELP idem_store_records Records the store holds, by state; of a sample when idem_store_records_sampled is 1.
# TYPE idem_store_records gauge
idem_store_records{state="COMPLETED"} 5
idem_store_records{state="FAILED"} 0
idem_store_records{state="IN_PROGRESS"} 2
idem_store_records{state="RELEASED"} 0
# HELP idem_store_records_sampled 1 when idem_store_records counts a sample of the records (redisstore stops at 1000), 0 when it counts them all.
# TYPE idem_store_records_sampled gauge
idem_store_records_sampled 1
# HELP idem_store_stats_up 1 if the store answered the last reading of these gauges, 0 if not.
# TYPE idem_store_stats_up gauge
idem_store_stats_up 1
`
	if err := testutil.CollectAndCompare(c, strings.NewReader(want)); err != nil {
		t.Error(err)
	}
	s.err = errors.New("store down")
	if err := testutil.CollectAndCompare(c, strings.NewReader(`
# HELP idem_store_stats_up 1 if the store answered the last reading of these gauges, 0 if not.
# TYPE idem_store_stats_up gauge
idem_store_stats_up 0
`)); err != nil {
		t.Error(err)
	}
	if _, err := prometheusidem.NewStoreCollector(struct{ idem.Store }{ms}); err == nil {
		t.Error("a store without Stats: got no error")
	}
}

// TestStoreCollectorMemstore reads a real memstore.
func TestStoreCollectorMemstore(t *testing.T) {
	ms, _ := memstore.New()
	e, _ := idem.New(ms)
	if _, err := e.Do(t.Context(), idem.Key{ID: "a"}, "", func(context.Context) ([]byte, error) { return nil, nil }); err != nil {
		t.Fatal(err)
	}
	c, err := prometheusidem.NewStoreCollector(ms)
	if err != nil {
		t.Fatal(err)
	}
	if err := testutil.CollectAndCompare(c, strings.NewReader(`
# HELP idem_store_records Records the store holds, by state; of a sample when idem_store_records_sampled is 1.
# TYPE idem_store_records gauge
idem_store_records{state="COMPLETED"} 1
idem_store_records{state="FAILED"} 0
idem_store_records{state="IN_PROGRESS"} 0
idem_store_records{state="RELEASED"} 0
`), "idem_store_records"); err != nil {
		t.Error(err)
	}
}
