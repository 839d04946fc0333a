package prometheusidem_test

import (
	"context"
	"fmt"
	"log"
	"net/http"
	"slices"
	"strings"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/idemgo/idem"
	"github.com/idemgo/idem/memstore"
	"github.com/idemgo/idem/prometheusidem"
)

func charge(context.Context) ([]byte, error) { return []byte("ch_1"), nil }

// An Executor whose outcomes are counted (idemhttp and the consumer
// adapters built on it too), and the store's gauges.
func Example() {
	m, err := prometheusidem.New()
	if err != nil {
		log.Fatal(err)
	}
	reg := prometheus.NewRegistry() // or prometheus.DefaultRegisterer
	reg.MustRegister(m)

	store, _ := memstore.New() // redisstore.New(client) in production
	exec, err := idem.New(store, idem.WithObserver(m.Observe))
	if err != nil {
		log.Fatal(err)
	}
	gauges, err := prometheusidem.NewStoreCollector(store) // records by state, memory
	if err != nil {
		log.Fatal(err)
	}
	reg.MustRegister(gauges)
	http.Handle("GET /metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{}))

	key := idem.Key{Scope: "charge", ID: "order-1"}
	for range 2 {
		if _, err := exec.Do(context.Background(), key, "", charge); err != nil {
			log.Fatal(err)
		}
	}
	printSeries(reg, "idem_operations_total", "idem_store_records")
	// Output:
	// idem_operations_total{outcome="executed",scope_kind="charge"} 1
	// idem_operations_total{outcome="replayed",scope_kind="charge"} 1
	// idem_store_records{state="COMPLETED"} 1
}

// printSeries prints the samples of the named counters and gauges that are
// not zero.
func printSeries(g prometheus.Gatherer, names ...string) {
	families, err := g.Gather()
	if err != nil {
		log.Fatal(err)
	}
	for _, f := range families {
		if !slices.Contains(names, f.GetName()) {
			continue
		}
		for _, s := range f.GetMetric() {
			v := s.GetCounter().GetValue() + s.GetGauge().GetValue()
			if v == 0 {
				continue
			}
			var labels []string
			for _, l := range s.GetLabel() {
				labels = append(labels, fmt.Sprintf("%s=%q", l.GetName(), l.GetValue()))
			}
			fmt.Printf("%s{%s} %v\n", f.GetName(), strings.Join(labels, ","), v)
		}
	}
}
