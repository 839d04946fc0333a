package consumer_test

import (
	"context"
	"testing"

	"github.com/idemgo/idem"
	"github.com/idemgo/idem/consumer"
	"github.com/idemgo/idem/redisstore"
	"github.com/idemgo/idem/storekit"
	"github.com/idemgo/idem/testkit/redistest"
)

// TestRefusedEffectOnLastTryFailsTheKey: a handler whose effect the store
// refuses, under the default (retryable) failure policy, gets its key
// released and its message retried until the maximum of deliveries, or at
// once on a last delivery; the dead-lettered message's key is then FAILED,
// as for a handler's own error, so that a later copy of the message is
// dead-lettered without running the handler again, not run as new.
func TestRefusedEffectOnLastTryFailsTheKey(t *testing.T) {
	srv := redistest.Start(t)
	rdb := srv.GoRedis(t)
	store, err := redisstore.New(rdb, redisstore.WithEffect("refuse", `return redis.error_reply('refused')`))
	if err != nil {
		t.Fatal(err)
	}
	exec, err := idem.New(store)
	if err != nil {
		t.Fatal(err)
	}
	p, err := consumer.New(exec, consumer.WithMaxDeliveries(2))
	if err != nil {
		t.Fatal(err)
	}
	ctx := t.Context()
	runs := 0
	h := func(ctx context.Context, _ int) error {
		runs++
		return idem.SetEffect(ctx, idem.Effect{Name: "refuse"})
	}
	state := func(key string) storekit.State {
		t.Helper()
		rec, err := store.Get(ctx, p.Key(key).Digest())
		if err != nil {
			t.Fatal(err)
		}
		return rec.State
	}
	steps := []struct {
		msg   consumer.Message
		want  consumer.Action
		runs  int
		state storekit.State
	}{
		{consumer.Message{Key: "k", Deliveries: 1}, consumer.Retry, 1, storekit.StateReleased},
		{consumer.Message{Key: "k", Deliveries: 2}, consumer.DeadLetter, 2, storekit.StateFailed},
		{consumer.Message{Key: "k", Deliveries: 3}, consumer.DeadLetter, 2, storekit.StateFailed}, // a copy: the handler does not run
		{consumer.Message{Key: "last", Deliveries: 1, Last: true}, consumer.DeadLetter, 3, storekit.StateFailed},
	}
	for i, s := range steps {
		r := p.Process(ctx, []consumer.Message{s.msg}, h)[0]
		if r.Action != s.want || runs != s.runs {
			t.Fatalf("step %d: got %v (%v) after %d runs, want %v after %d", i, r.Action, r.Err, runs, s.want, s.runs)
		}
		if st := state(s.msg.Key); st != s.state {
			t.Fatalf("step %d: key %s is %v, want %v", i, s.msg.Key, st, s.state)
		}
	}
}
