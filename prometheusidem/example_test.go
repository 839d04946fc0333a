package prometheusidem_test

import (
	"context"
	"fmt"
	"log"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/idemgo/idem"
	"github.com/idemgo/idem/memstore"
	"github.com/idemgo/idem/prometheusidem"
)

// An Executor whose outcomes are counted; idemhttp and the consumer
// adapters built on it are counted too.
func Example() {
	reg := prometheus.NewRegistry()
	m, err := prometheusidem.New()
	if err != nil {
		log.Fatal(err)
	}
	reg.MustRegister(m)

	store, _ := memstore.New()
	exec, err := idem.New(store, idem.WithObserver(m.Observe))
	if err != nil {
		log.Fatal(err)
	}
	key := idem.Key{Scope: "charge", ID: "order-1"}
	charge := func(context.Context) ([]byte, error) { return []byte("ch_1"), nil }
	for range 2 {
		if _, err := exec.Do(context.Background(), key, "", charge); err != nil {
			log.Fatal(err)
		}
	}

	families, _ := reg.Gather()
	for _, f := range families {
		if f.GetName() != "idem_operations_total" {
			continue
		}
		for _, s := range f.GetMetric() {
			if v := s.GetCounter().GetValue(); v > 0 {
				fmt.Println(s.GetLabel()[0].GetValue(), s.GetLabel()[1].GetValue(), v)
			}
		}
	}
	// Output:
	// executed charge 1
	// replayed charge 1
}
