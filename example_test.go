package idem_test

import (
	"context"
	"errors"
	"fmt"

	"github.com/idemgo/idem"
	"github.com/idemgo/idem/memstore"
)

// A payment handler charges a card at most once per idempotency key, however
// often the client retries.
func Example() {
	store, _ := memstore.New() // redisstore.New(redisClient) in production
	exec, _ := idem.New(store)
	ctx := context.Background()

	charge := func(ctx context.Context) ([]byte, error) {
		fence, _ := idem.FenceFrom(ctx) // pass it to the ledger to reject stale writers
		fmt.Println("charging the card, fence > 0:", fence > 0)
		return []byte(`{"charge":"ch_1","amount":4200}`), nil
	}
	key := idem.Key{Scope: "POST /charges", ID: "7c1e4b52-retry-safe"}
	for range 3 { // the client retries
		res, err := exec.Do(ctx, key, "sha256-of-the-request-body", charge)
		if err != nil {
			fmt.Println("error:", err)
			return
		}
		fmt.Printf("%s replayed=%v\n", res.Value, res.Replayed)
	}
	// Output:
	// charging the card, fence > 0: true
	// {"charge":"ch_1","amount":4200} replayed=false
	// {"charge":"ch_1","amount":4200} replayed=true
	// {"charge":"ch_1","amount":4200} replayed=true
}

// Typed stores and replays Go values.
func ExampleTyped() {
	store, _ := memstore.New()
	exec, _ := idem.New(store)
	type Order struct {
		ID    string
		Total int
	}
	orders := idem.Typed[Order]{Executor: exec}
	for range 2 {
		order, replayed, err := orders.Do(context.Background(), idem.Key{Scope: "orders", ID: "k1"}, "",
			func(context.Context) (Order, error) { return Order{ID: "o_1", Total: 990}, nil })
		fmt.Println(order, replayed, err)
	}
	// Output:
	// {o_1 990} false <nil>
	// {o_1 990} true <nil>
}

// A terminal error is stored and replayed; other errors release the key so
// that a retry runs the operation again.
func ExampleTerminal() {
	store, _ := memstore.New()
	exec, _ := idem.New(store)
	ctx := context.Background()
	key := idem.Key{Scope: "charge", ID: "declined-card"}
	_, err := exec.Do(ctx, key, "", func(context.Context) ([]byte, error) {
		return nil, idem.Terminal(errors.New("card declined"))
	})
	fmt.Println(err)
	_, err = exec.Do(ctx, key, "", func(context.Context) ([]byte, error) { return []byte("never runs"), nil })
	var failed *idem.FailedError
	fmt.Println(errors.As(err, &failed), failed.Message)
	// Output:
	// card declined
	// true card declined
}

// Begin, Commit and Abort are for callers that cannot wrap their work in a
// function, such as middleware.
func ExampleExecutor_Begin() {
	store, _ := memstore.New()
	exec, _ := idem.New(store)
	ctx := context.Background()
	key := idem.Key{Scope: "webhook", ID: "evt_42"}

	actx, attempt, err := exec.Begin(ctx, key, "")
	if err != nil {
		fmt.Println(err)
		return
	}
	fence, _ := idem.FenceFrom(actx)
	fmt.Println("holding the key:", fence == attempt.Lease().Fence)
	if err := attempt.Commit(ctx, []byte("processed")); err != nil {
		fmt.Println(err)
	}

	_, again, _ := exec.Begin(ctx, key, "")
	fmt.Println(again.Replayed(), string(again.Value()))
	// Output:
	// holding the key: true
	// true processed
}
