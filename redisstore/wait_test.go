package redisstore_test

import (
	"testing"

	"github.com/idemgo/idem/storetest"
	"github.com/idemgo/idem/testkit/redistest"
)

// TestWaitingDoAcrossClients runs the waiting Do (idem.WithWait) with one
// Executor on a go-redis client and the other on a rueidis client of the
// same redis-server: the waiter is woken by the store's notification,
// published by the other client's transition.
func TestWaitingDoAcrossClients(t *testing.T) {
	t.Parallel()
	cs := clients(t, redistest.Start(t), nil)
	first, second := cs[0], cs[1]
	t.Logf("first on %s, second on %s", first.name, second.name)
	storetest.RunWait(t, first.newStore(t), second.newStore(t))
}
