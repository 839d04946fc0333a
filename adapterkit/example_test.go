package adapterkit_test

import (
	"context"
	"fmt"

	"github.com/idemgo/idem"
	"github.com/idemgo/idem/adapterkit"
	"github.com/idemgo/idem/memstore"
)

// A completion written outside the store, as the commit gate writes one in
// its own transaction, is encoded as Commit would store it and read back
// as a replay would.
func Example() {
	store, _ := memstore.New()
	exec, _ := idem.New(store, idem.WithMaxResultSize(1<<10))
	ctx := context.Background()

	_, a, _ := exec.Begin(ctx, idem.Key{Scope: "charge", ID: "42"}, "fp")
	blob, err := adapterkit.EncodeResult(exec, a.Key(), []byte("charged"))
	if err != nil {
		fmt.Println(err)
		return
	}
	value, err := adapterkit.DecodeResult(exec, a.Key(), blob)
	fmt.Printf("%s %v\n", value, err)
	fmt.Println(adapterkit.Lease(exec), adapterkit.MaxResultSize(exec))
	_ = a.Release(ctx)
	// Output:
	// charged <nil>
	// 30s 1024
}
