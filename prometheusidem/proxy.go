package prometheusidem

import (
	"errors"
	"net/http"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/idemgo/idem/idemhttp"
	"github.com/idemgo/idem/idemproxy"
)

// ProxyMetrics records what an idemproxy.Proxy does with its requests as
// Prometheus metrics, the series of `idem proxy`'s /metrics that the
// dashboard and alerts in the repository's monitoring/ read. Its Observe
// method is an idemproxy.Observer; it is a prometheus.Collector to
// register. The series:
//
//	idem_requests_total{outcome}          counter: covered requests by idemhttp.Outcome
//	idem_request_duration_seconds{outcome} histogram: their time, upstream included
//	idem_overhead_seconds                  histogram: their time outside the upstream call
//	idem_upstream_duration_seconds         histogram: the upstream call, body included
//	idem_passthrough_requests_total        counter: requests whose method is not covered
//	idem_busy_requests_total               counter: requests refused over MaxConcurrent
//	idem_upstream_errors_total{kind}       counter: upstream calls without a response
//	idem_requests_in_flight                gauge: requests being handled
//
// Every series is created at once, so that recording takes no lock and
// allocates nothing. The Executor's outcomes are Metrics' (pass its Observe
// to idem.WithObserver). It is safe for concurrent use.
type ProxyMetrics struct {
	requests  []prometheus.Counter  // by idemhttp.Outcome
	durations []prometheus.Observer // by idemhttp.Outcome
	overhead  prometheus.Observer
	upstream  prometheus.Observer
	passed    prometheus.Counter
	busy      prometheus.Counter
	failures  []prometheus.Counter // by idemproxy.UpstreamFailure

	collectors []prometheus.Collector
}

var _ prometheus.Collector = (*ProxyMetrics)(nil)

// upstreamFailures are the failures counted by idem_upstream_errors_total.
var upstreamFailures = []idemproxy.UpstreamFailure{idemproxy.UpstreamUnreachable, idemproxy.UpstreamTimeout, idemproxy.UpstreamBroken}

// NewProxyMetrics returns the metrics of a proxy. inFlight, if not nil, is
// read at each scrape for idem_requests_in_flight: pass the proxy's
// InFlight method. Of the options, WithBuckets and WithConstLabels apply.
// It returns an error for an invalid option.
func NewProxyMetrics(inFlight func() int, opts ...Option) (*ProxyMetrics, error) {
	c := config{buckets: DefaultBuckets}
	for _, o := range opts {
		o(&c)
	}
	if len(c.buckets) == 0 {
		return nil, errors.New("prometheusidem: no histogram buckets")
	}
	m := &ProxyMetrics{}
	counter := func(name, help string, labels ...string) *prometheus.CounterVec {
		v := prometheus.NewCounterVec(prometheus.CounterOpts{Name: name, Help: help, ConstLabels: c.constant}, labels)
		m.collectors = append(m.collectors, v)
		return v
	}
	histogram := func(name, help string, labels ...string) *prometheus.HistogramVec {
		v := prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: name, Help: help, Buckets: c.buckets, ConstLabels: c.constant}, labels)
		m.collectors = append(m.collectors, v)
		return v
	}
	reqs := counter("idem_requests_total",
		"Requests with a covered method, by what the idempotency layer did: executed (forwarded, response stored), replayed, conflict (409, in progress), mismatch (422), failed (422, key FAILED), rejected (400/413), released (forwarded, key released), abandoned (forwarded, outcome unknown, key left to its lease), not-recorded (forwarded, response not stored: 503 outcome unknown, key left to its lease), store-error (503), failed-open, no-key.",
		"outcome")
	durs := histogram("idem_request_duration_seconds",
		"Time from receiving a covered request to the end of its handling, upstream included, by outcome.",
		"outcome")
	for oc := idemhttp.Outcome(0); ; oc++ {
		name := oc.String()
		if oc > 0 && name == "invalid" {
			break
		}
		m.requests = append(m.requests, reqs.WithLabelValues(name))
		m.durations = append(m.durations, durs.WithLabelValues(name))
	}
	m.overhead = histogram("idem_overhead_seconds",
		"Time a forwarded request spent in the proxy outside the upstream call: reading the body, the store calls before and after.").WithLabelValues()
	m.upstream = histogram("idem_upstream_duration_seconds",
		"Time of the upstream call of forwarded covered requests, response body included.").WithLabelValues()
	m.passed = counter("idem_passthrough_requests_total",
		"Requests whose method the proxy does not cover, forwarded untouched.").WithLabelValues()
	m.busy = counter("idem_busy_requests_total",
		"Requests answered 503 without being handled because the proxy's maximum of concurrent requests were in flight.").WithLabelValues()
	uerr := counter("idem_upstream_errors_total",
		"Upstream calls that failed without a response: unreachable (never sent; key released, 502), timeout (sent; key left to its lease, 504), broken (sent; key left to its lease, 502).",
		"kind")
	m.failures = make([]prometheus.Counter, len(upstreamFailures)+1)
	for _, f := range upstreamFailures {
		m.failures[f] = uerr.WithLabelValues(f.String())
	}
	if inFlight != nil {
		m.collectors = append(m.collectors, prometheus.NewGaugeFunc(
			prometheus.GaugeOpts{Name: "idem_requests_in_flight", Help: "Requests being handled.", ConstLabels: c.constant},
			func() float64 { return float64(inFlight()) }))
	}
	return m, nil
}

// Observe records one request. It is an idemproxy.Observer.
func (m *ProxyMetrics) Observe(_ *http.Request, ev idemproxy.Event) {
	if int(ev.UpstreamFailure) < len(m.failures) && m.failures[ev.UpstreamFailure] != nil {
		m.failures[ev.UpstreamFailure].Inc()
	}
	switch ev.Kind {
	case idemproxy.KindPassthrough:
		m.passed.Inc()
		return
	case idemproxy.KindBusy:
		m.busy.Inc()
		return
	}
	i := int(ev.Outcome)
	if i >= len(m.requests) {
		i = 0
	}
	m.requests[i].Inc()
	m.durations[i].Observe(ev.Duration.Seconds())
	if ev.Upstream > 0 {
		m.upstream.Observe(ev.Upstream.Seconds())
		m.overhead.Observe(max(ev.Duration-ev.Upstream, 0).Seconds())
	}
}

// Describe implements prometheus.Collector.
func (m *ProxyMetrics) Describe(ch chan<- *prometheus.Desc) {
	for _, c := range m.collectors {
		c.Describe(ch)
	}
}

// Collect implements prometheus.Collector.
func (m *ProxyMetrics) Collect(ch chan<- prometheus.Metric) {
	for _, c := range m.collectors {
		c.Collect(ch)
	}
}
