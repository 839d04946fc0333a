package otelidem_test

import (
	"context"
	"fmt"

	"github.com/idemgo/idem"
	"github.com/idemgo/idem/memstore"
	"github.com/idemgo/idem/otelidem"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
)

func Example() {
	// In a service, tp is the application's TracerProvider (or leave the
	// option out to use the global one).
	rec := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec))
	defer tp.Shutdown(context.Background())

	store, err := memstore.New()
	if err != nil {
		panic(err)
	}
	exec, err := idem.New(otelidem.Store(store, otelidem.WithTracerProvider(tp)))
	if err != nil {
		panic(err)
	}
	for range 2 {
		res, err := exec.Do(context.Background(), idem.Key{Scope: "payments", ID: "k1"}, "fp",
			func(context.Context) ([]byte, error) { return []byte("charged"), nil })
		if err != nil {
			panic(err)
		}
		fmt.Printf("%s replayed=%v\n", res.Value, res.Replayed)
	}
	for _, s := range rec.Ended() {
		for _, kv := range s.Attributes() {
			if kv.Key == otelidem.KeyOutcome {
				fmt.Println(s.Name(), kv.Value.Emit())
			}
		}
		if s.Name() != otelidem.SpanAcquire {
			fmt.Println(s.Name())
		}
	}
	// Output:
	// charged replayed=false
	// charged replayed=true
	// idem.acquire acquired
	// idem.complete
	// idem.acquire replay
}
