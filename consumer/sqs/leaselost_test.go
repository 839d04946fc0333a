package sqsconsumer_test

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/service/sqs/types"

	"github.com/idemgo/idem"
	"github.com/idemgo/idem/consumer"
	sqsconsumer "github.com/idemgo/idem/consumer/sqs"
	"github.com/idemgo/idem/memstore"
	"github.com/idemgo/idem/testkit/sqsfake"
)

// TestLeaseLost: when another owner takes the key over while the handler
// runs, the handler's context is cancelled with idem.ErrLeaseLost and the
// message is not deleted; once the new owner completes, the redelivery is a
// replay.
func TestLeaseLost(t *testing.T) {
	t.Parallel()
	var offset atomic.Int64
	store, err := memstore.New(memstore.WithClock(func() time.Time { return time.Now().Add(time.Duration(offset.Load())) }))
	if err != nil {
		t.Fatal(err)
	}
	exec, err := idem.New(store, idem.WithLease(300*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	f := startFake(t)
	qURL := f.CreateQueue("q", sqsfake.QueueOptions{})
	dURL := f.CreateQueue("dlq", sqsfake.QueueOptions{})
	started := make(chan struct{})
	cause := make(chan error, 1)
	var runs atomic.Int32
	c, err := sqsconsumer.New(f.client(nil), qURL, dURL, exec, func(ctx context.Context, m types.Message) error {
		runs.Add(1)
		close(started)
		<-ctx.Done()
		cause <- context.Cause(ctx)
		return context.Cause(ctx)
	}, sqsconsumer.WithWaitTime(time.Second), consumer.WithRetryDelay(0))
	if err != nil {
		t.Fatal(err)
	}
	f.Send("q", "m", keyAttr("k"), "")
	stop := runConsumer(t, c.Run)
	defer stop()
	<-started
	// The consumer looks dead to the store: its lease and record expire
	// and another owner acquires the key.
	offset.Store(int64(time.Hour))
	_, other, err := exec.Begin(t.Context(), c.Processor().Key("k"), "")
	if err != nil {
		t.Fatal(err)
	}
	if other.Replayed() {
		t.Fatal("the second owner got a replay, want the key")
	}
	select {
	case err := <-cause:
		if !errors.Is(err, idem.ErrLeaseLost) {
			t.Fatalf("handler context cause: got %v, want idem.ErrLeaseLost", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("the handler's context was not cancelled after the lease was lost")
	}
	waitFor(t, 5*time.Second, "the message to be retried", func() bool { return c.Stats().Retried >= 1 })
	if got := f.Ops("q").Deleted; got != 0 {
		t.Fatalf("deleted after the lease was lost: got %d, want 0", got)
	}
	if err := other.Commit(t.Context(), nil); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 10*time.Second, "the queue to drain", drained(f, "q"))
	if got, st := runs.Load(), c.Stats(); got != 1 || st.Replayed != 1 || st.Processed != 0 {
		t.Errorf("got %d handler runs and %+v, want 1 run, 1 replayed, 0 processed", got, st)
	}
}
