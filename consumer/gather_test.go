package consumer_test

import (
	"context"
	"errors"
	"testing"

	"github.com/idemgo/idem/consumer"
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
