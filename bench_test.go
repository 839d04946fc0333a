package idem_test

import (
	"context"
	"strconv"
	"testing"

	"github.com/idemgo/idem"
	"github.com/idemgo/idem/memstore"
	"github.com/idemgo/idem/observe"
)

var benchValue = []byte(`{"id":"ch_1","amount":4200,"status":"succeeded"}`)

func benchKeys(n int) []idem.Key {
	keys := make([]idem.Key, n)
	for i := range keys {
		keys[i] = idem.Key{Scope: "charge", ID: "order-" + strconv.Itoa(i)}
	}
	return keys
}

// BenchmarkDo measures a full lifecycle on memstore: acquire, run, complete.
// The store is sized for the run, so that what is measured is Do, not the
// map growing to b.N records.
func BenchmarkDo(b *testing.B) { benchDo(b) }

// BenchmarkDoObserved is BenchmarkDo with an Observer that does nothing:
// the cost of the observations themselves (BenchmarkDo has none).
func BenchmarkDoObserved(b *testing.B) {
	benchDo(b, idem.WithObserver(func(context.Context, observe.Observation) {}))
}

func benchDo(b *testing.B, opts ...idem.Option) {
	s, _ := memstore.New(memstore.WithCapacity(b.N))
	e, _ := idem.New(s, opts...)
	keys := benchKeys(b.N)
	fn := func(context.Context) ([]byte, error) { return benchValue, nil }
	ctx := context.Background()
	b.ReportAllocs()
	b.ResetTimer()
	for i := range b.N {
		if _, err := e.Do(ctx, keys[i], "fp", fn); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkDoReplay measures a replay on memstore.
func BenchmarkDoReplay(b *testing.B) {
	s, _ := memstore.New()
	e, _ := idem.New(s)
	fn := func(context.Context) ([]byte, error) { return benchValue, nil }
	ctx := context.Background()
	key := idem.Key{Scope: "charge", ID: "order-1"}
	if _, err := e.Do(ctx, key, "fp", fn); err != nil {
		b.Fatal(err)
	}
	b.ReportAllocs()
	b.ResetTimer()
	for range b.N {
		r, err := e.Do(ctx, key, "fp", fn)
		if err != nil || !r.Replayed {
			b.Fatal(r, err)
		}
	}
}
