package prometheusidem_test

import (
	"fmt"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/idemgo/idem"
	"github.com/idemgo/idem/idemproxy"
	"github.com/idemgo/idem/memstore"
	"github.com/idemgo/idem/prometheusidem"
)

// TestProxyMetrics runs requests through a Proxy observed by ProxyMetrics
// and checks every series: covered outcomes and their times, passthrough,
// an upstream failure, the requests in flight.
func TestProxyMetrics(t *testing.T) {
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.WriteHeader(http.StatusCreated)
		fmt.Fprint(w, "done")
	}))
	t.Cleanup(up.Close)
	store, _ := memstore.New()
	exec, err := idem.New(store)
	if err != nil {
		t.Fatal(err)
	}
	target, _ := url.Parse(up.URL)
	tr := &http.Transport{}
	t.Cleanup(tr.CloseIdleConnections)
	p := &idemproxy.Proxy{Target: target, Executor: exec, Transport: tr}
	m, err := prometheusidem.NewProxyMetrics(p.InFlight, prometheusidem.WithConstLabels(prometheus.Labels{"proxy": "a"}))
	if err != nil {
		t.Fatal(err)
	}
	p.Observer = m.Observe
	reg := prometheus.NewPedanticRegistry()
	reg.MustRegister(m)
	srv := httptest.NewServer(p)
	t.Cleanup(srv.Close)

	do := func(method, path, key string) {
		t.Helper()
		req, _ := http.NewRequestWithContext(t.Context(), method, srv.URL+path, strings.NewReader("x"))
		if key != "" {
			req.Header.Set("Idempotency-Key", key)
		}
		res, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		res.Body.Close()
	}
	do(http.MethodPost, "/a", "k")
	do(http.MethodPost, "/a", "k")
	do(http.MethodPost, "/a", "")
	do(http.MethodGet, "/a", "")
	// The next call cannot reach the upstream: it dials, and is refused.
	// Without closing the idle connection, the call could instead be
	// written on the connection the upstream closed, an error after the
	// request may have been sent (outcome unknown), not "unreachable".
	up.Close()
	tr.CloseIdleConnections()
	do(http.MethodPost, "/a", "k2")

	for name, want := range map[string]float64{
		`idem_requests_total{outcome="executed",proxy="a"}`:                 1,
		`idem_requests_total{outcome="replayed",proxy="a"}`:                 1,
		`idem_requests_total{outcome="rejected",proxy="a"}`:                 1,
		`idem_requests_total{outcome="released",proxy="a"}`:                 1,
		`idem_requests_total{outcome="conflict",proxy="a"}`:                 0,
		`idem_passthrough_requests_total{proxy="a"}`:                        1,
		`idem_busy_requests_total{proxy="a"}`:                               0,
		`idem_upstream_errors_total{kind="unreachable",proxy="a"}`:          1,
		`idem_upstream_errors_total{kind="timeout",proxy="a"}`:              0,
		`idem_upstream_duration_seconds_count{proxy="a"}`:                   2,
		`idem_overhead_seconds_count{proxy="a"}`:                            2,
		`idem_request_duration_seconds_count{outcome="executed",proxy="a"}`: 1,
		`idem_requests_in_flight{proxy="a"}`:                                0,
	} {
		if got := value(t, reg, name); got != want {
			t.Errorf("%s: got %v, want %v", name, got, want)
		}
	}
	if n, err := testutil.GatherAndCount(reg); err != nil || n == 0 {
		t.Errorf("GatherAndCount: got %d, %v", n, err)
	}
}

// value returns the value of the series name (with its labels, as the
// text format writes them) from reg.
func value(t *testing.T, reg *prometheus.Registry, name string) float64 {
	t.Helper()
	families, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range families {
		for _, m := range f.GetMetric() {
			var labels []string
			for _, l := range m.GetLabel() {
				labels = append(labels, fmt.Sprintf("%s=%q", l.GetName(), l.GetValue()))
			}
			series := f.GetName()
			if len(labels) > 0 {
				series += "{" + strings.Join(labels, ",") + "}"
			}
			switch {
			case series == name && m.GetCounter() != nil:
				return m.GetCounter().GetValue()
			case series == name && m.GetGauge() != nil:
				return m.GetGauge().GetValue()
			case m.GetHistogram() != nil && strings.Replace(series, f.GetName(), f.GetName()+"_count", 1) == name:
				return float64(m.GetHistogram().GetSampleCount())
			}
		}
	}
	t.Fatalf("no series %s", name)
	return 0
}
