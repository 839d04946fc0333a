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

func newProcessor(t *testing.T, opts ...consumer.Option) *consumer.Processor {
	t.Helper()
	s, err := memstore.New()
	if err != nil {
		t.Fatal(err)
	}
	exec, err := idem.New(s)
	if err != nil {
		t.Fatal(err)
	}
	p, err := consumer.New(exec, opts...)
	if err != nil {
		t.Fatal(err)
	}
	return p
}

func TestProcess(t *testing.T) {
	p := newProcessor(t, consumer.WithMaxDeliveries(3))
	ctx := t.Context()
	effects := map[string]int{}
	fail := map[string]error{"flaky": errors.New("downstream timeout"), "poison": idem.Terminal(errors.New("bad payload"))}
	handler := func(msgs []consumer.Message) consumer.Handler {
		return func(ctx context.Context, i int) error {
			if _, ok := idem.FenceFrom(ctx); !ok {
				t.Error("the handler's context has no fence")
			}
			if err := fail[msgs[i].Key]; err != nil {
				return err
			}
			effects[msgs[i].Key]++
			return nil
		}
	}
	batch := []consumer.Message{
		{Key: "a", Deliveries: 1},
		{Key: "a", Deliveries: 1}, // a duplicate within the batch
		{Key: "", Deliveries: 1},
		{Key: "flaky", Deliveries: 1},
		{Key: "poison", Deliveries: 1},
	}
	got := p.Process(ctx, batch, handler(batch))
	want := []consumer.Action{consumer.Ack, consumer.Retry, consumer.DeadLetter, consumer.Retry, consumer.DeadLetter}
	for i := range want {
		if got[i].Action != want[i] {
			t.Errorf("message %d (%q): got %v (%v), want %v", i, batch[i].Key, got[i].Action, got[i].Err, want[i])
		}
	}
	if !errors.Is(got[1].Err, idem.ErrInProgress) || got[1].Delay <= 0 {
		t.Errorf("duplicate in progress: got %v, delay %v", got[1].Err, got[1].Delay)
	}
	if !errors.Is(got[2].Err, consumer.ErrNoKey) {
		t.Errorf("no key: got %v", got[2].Err)
	}

	// Redelivery: "a" is replayed, "flaky" fails until its third delivery.
	for d := 2; d <= 3; d++ {
		again := []consumer.Message{{Key: "a", Deliveries: d}, {Key: "flaky", Deliveries: d}}
		got = p.Process(ctx, again, handler(again))
		if got[0].Action != consumer.Ack || !got[0].Replayed {
			t.Errorf("delivery %d of a: got %+v, want a replayed Ack", d, got[0])
		}
		wantFlaky := consumer.Retry
		if d == 3 {
			wantFlaky = consumer.DeadLetter
		}
		if got[1].Action != wantFlaky {
			t.Errorf("delivery %d of flaky: got %v, want %v", d, got[1].Action, wantFlaky)
		}
	}
	// A FAILED key is dead-lettered again, never acked silently.
	got = p.Process(ctx, []consumer.Message{{Key: "poison", Deliveries: 2}}, handler(nil))
	if got[0].Action != consumer.DeadLetter || !errors.Is(got[0].Err, idem.ErrFailed) {
		t.Errorf("redelivered poison: got %+v, want DeadLetter with ErrFailed", got[0])
	}
	if effects["a"] != 1 || effects["flaky"] != 0 {
		t.Errorf("effects: got %v, want a once", effects)
	}
	// The same key with another payload is a poison message too.
	got = p.Process(ctx, []consumer.Message{{Key: "a", Fingerprint: "other", Deliveries: 1}}, handler(nil))
	if got[0].Action != consumer.DeadLetter || !errors.Is(got[0].Err, idem.ErrMismatch) {
		t.Errorf("mismatch: got %+v", got[0])
	}
}

func TestPanicCompletesFinishedMessages(t *testing.T) {
	p := newProcessor(t)
	ctx := t.Context()
	batch := []consumer.Message{{Key: "done"}, {Key: "boom"}}
	func() {
		defer func() {
			if recover() == nil {
				t.Fatal("the panic did not continue")
			}
		}()
		p.Process(ctx, batch, func(ctx context.Context, i int) error {
			if i == 1 {
				panic("handler crashed")
			}
			return nil
		})
	}()
	var ran []string
	got := p.Process(ctx, batch, func(ctx context.Context, i int) error {
		ran = append(ran, batch[i].Key)
		return nil
	})
	if !got[0].Replayed || got[1].Action != consumer.Ack || got[1].Replayed {
		t.Fatalf("after the panic: got %+v, want done replayed and boom executed", got)
	}
	if len(ran) != 1 || ran[0] != "boom" {
		t.Fatalf("handlers run after the panic: %v, want only boom", ran)
	}
}

func TestNewInvalid(t *testing.T) {
	if _, err := consumer.New(nil); !errors.Is(err, idem.ErrInvalid) {
		t.Errorf("nil executor: got %v", err)
	}
	s, _ := memstore.New()
	exec, _ := idem.New(s)
	for _, o := range []consumer.Option{consumer.WithMaxDeliveries(-1), consumer.WithRetryDelay(-time.Second)} {
		if _, err := consumer.New(exec, o); !errors.Is(err, idem.ErrInvalid) {
			t.Errorf("bad option: got %v", err)
		}
	}
}
