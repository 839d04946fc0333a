package main

import (
	"testing"

	"github.com/idemgo/idem"
	"github.com/idemgo/idem/memstore"
)

// The proxy's instrumented store keeps the capabilities of the store
// beneath it, directly or beneath another wrapper (tracing).
func TestInstrumentKeepsCapabilities(t *testing.T) {
	ms, err := memstore.New()
	if err != nil {
		t.Fatal(err)
	}
	for name, s := range map[string]idem.Store{
		"memstore":         newObserver().instrument(ms),
		"wrapped memstore": newObserver().instrument(unwrapOnly{ms}),
	} {
		if _, ok := s.(idem.Watcher); !ok {
			t.Errorf("%s: the instrumented store is not an idem.Watcher", name)
		}
		if _, ok := idem.StoreAs[idem.Relayer](s); !ok {
			t.Errorf("%s: idem.StoreAs finds no idem.Relayer", name)
		}
		if _, ok := idem.StoreAs[idem.BatchStore](s); !ok {
			t.Errorf("%s: idem.StoreAs finds no idem.BatchStore", name)
		}
	}
}

// unwrapOnly hides the optional methods of its store and unwraps to it.
type unwrapOnly struct{ idem.Store }

func (u unwrapOnly) Unwrap() idem.Store { return u.Store }
