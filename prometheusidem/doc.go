// Package prometheusidem records the outcomes of idem Executors, and the
// records a store holds, as Prometheus metrics, with
// github.com/prometheus/client_golang. It is a module of its own, so that
// idem's users who do not use Prometheus do not download it.
//
// Metrics is an observe.Observer (pass its Observe method to idem.WithObserver)
// and a prometheus.Collector; the Executor tells it every outcome, so
// idemhttp and the consumer adapters built on that Executor are counted
// too:
//
//	m, err := prometheusidem.New()
//	if err != nil { … }
//	prometheus.MustRegister(m)
//	exec, err := idem.New(store, idem.WithObserver(m.Observe))
//
// StoreCollector adds gauges read from the store when Prometheus scrapes:
// records by state, the oldest IN_PROGRESS record, and Redis memory
// against maxmemory (see NewStoreCollector).
//
// ProxyMetrics records what an idemproxy.Proxy does with its requests
// (outcomes, times, the upstream's failures, requests in flight), the
// series of `idem proxy`'s /metrics:
//
//	pm, err := prometheusidem.NewProxyMetrics(p.InFlight)
//	if err != nil { … }
//	prometheus.MustRegister(pm)
//	p.Observer = pm.Observe
//
// The histograms' buckets start at 50µs (DefaultBuckets). Series carry the
// scope's kind (observe.Observation.ScopeKind), never a key; the number of
// kinds is bounded (WithMaxScopeKinds).
package prometheusidem
