package boltstore_test

import (
	"context"
	"fmt"
	"log"
	"os"
	"path/filepath"

	"github.com/idemgo/idem"
	"github.com/idemgo/idem/boltstore"
)

func Example() {
	dir, err := os.MkdirTemp("", "idem")
	if err != nil {
		log.Fatal(err)
	}
	defer os.RemoveAll(dir)

	store, err := boltstore.Open(filepath.Join(dir, "idem.db"))
	if err != nil {
		log.Fatal(err)
	}
	defer store.Close()
	exec, err := idem.New(store)
	if err != nil {
		log.Fatal(err)
	}

	ctx := context.Background()
	key := idem.Key{Scope: "charge", ID: "order-42"}
	for range 2 {
		res, err := exec.Do(ctx, key, "amount=100", func(ctx context.Context) ([]byte, error) {
			fmt.Println("charging the card")
			return []byte("charge ch_1"), nil
		})
		if err != nil {
			log.Fatal(err)
		}
		fmt.Printf("%s (replayed: %v)\n", res.Value, res.Replayed)
	}
	// Output:
	// charging the card
	// charge ch_1 (replayed: false)
	// charge ch_1 (replayed: true)
}
