package prometheusidem

import (
	"context"
	"errors"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/idemgo/idem"
	"github.com/idemgo/idem/storekit"
)

// DefaultStatsTimeout is the default of WithStatsTimeout.
const DefaultStatsTimeout = 5 * time.Second

// StoreCollector is a prometheus.Collector of gauges read from a store
// (storekit.StatsStore) at every scrape:
//
//	idem_store_records{state}                  records by state (IN_PROGRESS, COMPLETED, RELEASED, FAILED)
//	idem_store_records_sampled                 1 when the counts are of a sample (redisstore: at most 1000)
//	idem_store_oldest_in_progress_seconds      age of the oldest IN_PROGRESS record counted
//	idem_store_memory_used_bytes               memory the store uses (Redis used_memory; 0: unknown)
//	idem_store_memory_max_bytes                its limit (Redis maxmemory; 0: none or unknown)
//	idem_store_stats_up                        1 if the store answered, 0 if not
//
// It is safe for concurrent use.
type StoreCollector struct {
	s       storekit.StatsStore
	timeout time.Duration

	records, sampled, oldest, used, limit, up *prometheus.Desc
}

// StoreOption configures a StoreCollector.
type StoreOption func(*StoreCollector)

// WithStatsTimeout bounds each reading of the store. The default is
// DefaultStatsTimeout (5s).
func WithStatsTimeout(d time.Duration) StoreOption {
	return func(c *StoreCollector) { c.timeout = d }
}

var _ prometheus.Collector = (*StoreCollector)(nil)

// NewStoreCollector returns a collector of store's gauges. store must be an
// storekit.StatsStore, or wrap one (storekit.StoreAs): memstore, boltstore and
// redisstore are. Register it with a prometheus.Registerer.
func NewStoreCollector(store idem.Store, opts ...StoreOption) (*StoreCollector, error) {
	ss, ok := storekit.StoreAs[storekit.StatsStore](store)
	if !ok {
		return nil, errors.New("prometheusidem: the store does not count its records (storekit.StatsStore)")
	}
	c := &StoreCollector{
		s:       ss,
		timeout: DefaultStatsTimeout,
		records: prometheus.NewDesc("idem_store_records", "Records the store holds, by state; of a sample when idem_store_records_sampled is 1.", []string{"state"}, nil),
		sampled: prometheus.NewDesc("idem_store_records_sampled", "1 when idem_store_records counts a sample of the records (redisstore stops at 1000), 0 when it counts them all.", nil, nil),
		oldest:  prometheus.NewDesc("idem_store_oldest_in_progress_seconds", "Age of the oldest IN_PROGRESS record counted, since it was first acquired (0: none).", nil, nil),
		used:    prometheus.NewDesc("idem_store_memory_used_bytes", "Memory the store uses (Redis used_memory of the node closest to its limit; boltstore the size of its file and log; 0 unknown).", nil, nil),
		limit:   prometheus.NewDesc("idem_store_memory_max_bytes", "The store's memory limit (Redis maxmemory; 0 none or unknown).", nil, nil),
		up:      prometheus.NewDesc("idem_store_stats_up", "1 if the store answered the last reading of these gauges, 0 if not.", nil, nil),
	}
	for _, o := range opts {
		o(c)
	}
	if c.timeout <= 0 {
		return nil, errors.New("prometheusidem: the stats timeout must be positive")
	}
	return c, nil
}

// Describe implements prometheus.Collector.
func (c *StoreCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{c.records, c.sampled, c.oldest, c.used, c.limit, c.up} {
		ch <- d
	}
}

// Collect implements prometheus.Collector: it reads the store.
func (c *StoreCollector) Collect(ch chan<- prometheus.Metric) {
	ctx, cancel := context.WithTimeout(context.Background(), c.timeout)
	defer cancel()
	st, err := c.s.Stats(ctx)
	if err != nil {
		ch <- prometheus.MustNewConstMetric(c.up, prometheus.GaugeValue, 0)
		return
	}
	ch <- prometheus.MustNewConstMetric(c.up, prometheus.GaugeValue, 1)
	for state := storekit.StateInProgress; state <= storekit.StateFailed; state++ {
		ch <- prometheus.MustNewConstMetric(c.records, prometheus.GaugeValue, float64(st.Records[state]), state.String())
	}
	sampled := 0.0
	if st.Sampled {
		sampled = 1
	}
	ch <- prometheus.MustNewConstMetric(c.sampled, prometheus.GaugeValue, sampled)
	ch <- prometheus.MustNewConstMetric(c.oldest, prometheus.GaugeValue, st.OldestInProgress.Seconds())
	ch <- prometheus.MustNewConstMetric(c.used, prometheus.GaugeValue, float64(st.MemoryUsed))
	ch <- prometheus.MustNewConstMetric(c.limit, prometheus.GaugeValue, float64(st.MemoryLimit))
}
