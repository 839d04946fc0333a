package idem_test

import (
	"bytes"
	"errors"
	"testing"

	"github.com/idemgo/idem"
	"github.com/idemgo/idem/adapterkit"
	"github.com/idemgo/idem/memstore"

	"github.com/idemgo/idem/storekit"
)

// wrapped decorates a store and hides its optional methods, as a tracing
// wrapper does; with unwrap set it implements storekit.Unwrapper.
type wrapped struct {
	idem.Store
}

type unwrapping struct{ wrapped }

func (u unwrapping) Unwrap() idem.Store { return u.Store }

func TestStoreAsLooksThroughWrappers(t *testing.T) {
	ms, err := memstore.New()
	if err != nil {
		t.Fatal(err)
	}
	if _, ok := storekit.StoreAs[storekit.Relayer](ms); !ok {
		t.Fatal("storekit.StoreAs[storekit.Relayer](memstore): got false, want true")
	}
	if _, ok := storekit.StoreAs[storekit.Relayer](wrapped{ms}); ok {
		t.Fatal("storekit.StoreAs through a wrapper without Unwrap: got true, want false")
	}
	r, ok := storekit.StoreAs[storekit.Relayer](unwrapping{wrapped{unwrapping{wrapped{ms}}}})
	if !ok || r != storekit.Relayer(ms) {
		t.Fatalf("storekit.StoreAs through two unwrapping wrappers: got %v %v, want the memstore", r, ok)
	}
	if _, ok := storekit.StoreAs[storekit.Relayer](unwrapping{wrapped{nil}}); ok {
		t.Fatal("storekit.StoreAs of a wrapper of nil: got true, want false")
	}
}

func TestEncodeResult(t *testing.T) {
	ms, _ := memstore.New()
	e, err := idem.New(ms, idem.WithMaxResultSize(1000), idem.WithCompressAbove(10))
	if err != nil {
		t.Fatal(err)
	}
	value := bytes.Repeat([]byte("abc"), 100)
	blob, err := adapterkit.EncodeResult(e, "k", value)
	if err != nil {
		t.Fatalf("EncodeResult: %v", err)
	}
	if len(blob) >= len(value) {
		t.Errorf("blob of %d bytes for %d compressible bytes: not compressed", len(blob), len(value))
	}
	got, err := adapterkit.DecodeResult(e, "k", blob)
	if err != nil || !bytes.Equal(got, value) {
		t.Fatalf("DecodeResult: got %q, %v, want the value", got, err)
	}
	if _, err := adapterkit.EncodeResult(e, "k", make([]byte, 1001)); !errors.Is(err, idem.ErrResultTooLarge) {
		t.Fatalf("EncodeResult over the limit: got %v, want ErrResultTooLarge", err)
	}
}
