package redisstore_test

import (
	"errors"
	"testing"
	"time"

	"github.com/idemgo/idem"
	"github.com/idemgo/idem/storekit"
	"github.com/idemgo/idem/testkit/redistest"
)

// TestDeleteWakesWaiters: on every client and topology, a watch of an
// in-progress key (what a waiter for its outcome holds; the lease runs for
// a minute) is woken when another store deletes the key (idem rm), so the
// waiter looks at the key again at once, not at its next periodic look.
func TestDeleteWakesWaiters(t *testing.T) {
	t.Parallel()
	standalone := redistest.Start(t)
	cluster := redistest.StartCluster(t, 3)
	for _, c := range clients(t, standalone, cluster) {
		t.Run(c.name, func(t *testing.T) {
			owner, admin := c.newStore(t), c.newStore(t)
			ctx := t.Context()
			key := idem.Key{Scope: c.name, ID: "deleted"}.Digest()
			if _, err := owner.Acquire(ctx, key, storekit.AcquireRequest{Owner: "o", Lease: time.Minute, Retention: time.Hour}); err != nil {
				t.Fatal(err)
			}
			woken, stop, err := owner.Watch(ctx, key)
			if err != nil {
				t.Fatal(err)
			}
			defer stop()
			if err := admin.Delete(ctx, key); err != nil {
				t.Fatal(err)
			}
			select {
			case <-woken:
			case <-time.After(5 * time.Second):
				t.Fatal("the delete did not wake the key's watch (its lease ends in a minute)")
			}
			if _, err := owner.Get(ctx, key); !errors.Is(err, storekit.ErrNotFound) {
				t.Fatalf("after the delete: Get returned %v, want ErrNotFound", err)
			}
		})
	}
}
