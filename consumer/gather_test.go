package consumer_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/idemgo/idem"
	"github.com/idemgo/idem/consumer"
	"github.com/idemgo/idem/memstore"
)

// TestGather: the handlers of a batch that gather run f once, with the
// contexts and items of those that called Gather in the batch's order; a
// handler that returns without calling it, a message that does not run
// (invalid, a repeat, a completed key) or a stopped batch's handlers do
// not hold it up; each message is decided by its own handler's error.
func TestGather(t *testing.T) {
	p := newProcessor(t, consumer.WithGatheredHandlers())
	if got := p.Process(t.Context(), []consumer.Message{{Key: "done"}}, func(context.Context, int) error { return nil }); got[0].Action != consumer.Ack {
		t.Fatal(got[0])
	}
	msgs := []consumer.Message{{Key: "a"}, {Key: "b"}, {Key: ""}, {Key: "a"}, {Key: "c"}, {Key: "done"}, {Key: "d"}}
	calls := 0
	var items []any
	got := p.Process(t.Context(), msgs, func(ctx context.Context, i int) error {
		if msgs[i].Key == "b" {
			return errors.New("b fails without gathering")
		}
		v, me, err := consumer.Gather(ctx, msgs[i].Key, func(_ context.Context, ctxs []context.Context, it []any) any {
			calls++
			items = it
			if len(ctxs) != len(it) {
				t.Errorf("%d contexts for %d items", len(ctxs), len(it))
			}
			return []error{nil, errors.New("c's own failure"), nil}
		})
		if err != nil {
			return err
		}
		if _, _, err := consumer.Gather(ctx, nil, nil); !errors.Is(err, consumer.ErrNotGathered) {
			t.Errorf("a second Gather: %v, want ErrNotGathered", err)
		}
		return v.([]error)[me]
	})
	if calls != 1 || len(items) != 3 || items[0] != "a" || items[1] != "c" || items[2] != "d" {
		t.Errorf("f ran %d times with items %v, want once with [a c d]", calls, items)
	}
	want := []consumer.Action{consumer.Ack, consumer.Retry, consumer.DeadLetter, consumer.Ack, consumer.Retry, consumer.Ack, consumer.Ack}
	for i, r := range got {
		if r.Action != want[i] {
			t.Errorf("message %d (%q): got %v (%v), want %v", i, msgs[i].Key, r.Action, r.Err, want[i])
		}
	}

	// Not gathered: an error, and a stopped batch does not wait.
	if _, _, err := consumer.Gather(t.Context(), nil, nil); !errors.Is(err, consumer.ErrNotGathered) {
		t.Errorf("outside a handler: %v, want ErrNotGathered", err)
	}
	plain := newProcessor(t)
	plain.Process(t.Context(), []consumer.Message{{Key: "x"}}, func(ctx context.Context, i int) error {
		if _, _, err := consumer.Gather(ctx, nil, nil); !errors.Is(err, consumer.ErrNotGathered) {
			t.Errorf("without WithGatheredHandlers: %v, want ErrNotGathered", err)
		}
		return nil
	})
	stopped, cancel := context.WithCancel(t.Context())
	b := p.Acquire(stopped, []consumer.Message{{Key: "s1"}, {Key: "s2"}})
	cancel()
	b.Handle(func(ctx context.Context, i int) error { t.Error("a handler started after the stop"); return nil })
	for i, r := range b.Commit(t.Context()) {
		if r.Action != consumer.Retry || !errors.Is(r.Err, consumer.ErrStopping) {
			t.Errorf("stopped message %d: %v (%v), want a retry for the stop", i, r.Action, r.Err)
		}
	}
}

// TestGatherLeaseLostWhileWaiting: a handler whose lease is lost while it
// waits in Gather for the others (before f starts) cancels f's context
// with its cause once f runs, on another handler; its message is retried,
// the other's acknowledged.
func TestGatherLeaseLostWhileWaiting(t *testing.T) {
	s, err := memstore.New()
	if err != nil {
		t.Fatal(err)
	}
	exec, err := idem.New(s, idem.WithLease(time.Second))
	if err != nil {
		t.Fatal(err)
	}
	p, err := consumer.New(exec, consumer.WithGatheredHandlers())
	if err != nil {
		t.Fatal(err)
	}
	lost := make(chan struct{})
	var cause error
	msgs := []consumer.Message{{Key: "a"}, {Key: "b"}}
	got := p.Process(t.Context(), msgs, func(ctx context.Context, i int) error {
		if i == 0 { // another owner takes a over: a's heartbeat cancels ctx
			if err := s.Delete(context.Background(), p.Key("a").Digest()); err != nil {
				t.Error(err)
			}
			if _, _, err := exec.Begin(context.Background(), p.Key("a"), ""); err != nil {
				t.Error(err)
			}
			context.AfterFunc(ctx, func() { close(lost) })
		} else { // b joins once a's context is done
			select {
			case <-lost:
			case <-time.After(10 * time.Second):
				t.Error("a's lease was not lost")
			}
		}
		_, _, err := consumer.Gather(ctx, nil, func(ctx context.Context, _ []context.Context, _ []any) any {
			select {
			case <-ctx.Done():
				cause = context.Cause(ctx)
			case <-time.After(10 * time.Second):
				t.Error("f's context was not cancelled")
			}
			return nil
		})
		return err
	})
	if !errors.Is(cause, idem.ErrLeaseLost) {
		t.Errorf("f's context's cause: got %v, want ErrLeaseLost", cause)
	}
	if got[0].Action != consumer.Retry || got[1].Action != consumer.Ack {
		t.Errorf("got %v (%v), %v (%v), want a retry of a and an ack of b", got[0].Action, got[0].Err, got[1].Action, got[1].Err)
	}
}
