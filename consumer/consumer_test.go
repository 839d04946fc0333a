package consumer_test

import (
	"context"
	"errors"
	"strings"
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
	want := []consumer.Action{consumer.Ack, consumer.Ack, consumer.DeadLetter, consumer.Retry, consumer.DeadLetter}
	for i := range want {
		if got[i].Action != want[i] {
			t.Errorf("message %d (%q): got %v (%v), want %v", i, batch[i].Key, got[i].Action, got[i].Err, want[i])
		}
	}
	if !got[1].Replayed {
		t.Errorf("duplicate within the batch: got %+v, want a replayed Ack after the first", got[1])
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

// TestPanicIsAnError checks that a panicking handler does not crash the
// consumer: the panic is the message's error (retried, then dead-lettered)
// and the other messages of the batch are completed.
func TestPanicIsAnError(t *testing.T) {
	p := newProcessor(t, consumer.WithMaxDeliveries(2))
	ctx := t.Context()
	batch := []consumer.Message{{Key: "done"}, {Key: "boom"}, {Key: "after"}}
	handler := func(msgs []consumer.Message) consumer.Handler {
		return func(ctx context.Context, i int) error {
			if msgs[i].Key == "boom" {
				panic("handler crashed")
			}
			return nil
		}
	}
	got := p.Process(ctx, batch, handler(batch))
	if got[0].Action != consumer.Ack || got[2].Action != consumer.Ack {
		t.Fatalf("the panic's neighbours: got %+v and %+v, want both acked", got[0], got[2])
	}
	if got[1].Action != consumer.Retry || !errors.Is(got[1].Err, consumer.ErrPanic) {
		t.Fatalf("the panicking message: got %+v, want Retry with ErrPanic", got[1])
	}
	// The second delivery reaches the maximum: dead-lettered.
	got = p.Process(ctx, batch[1:2], handler(batch[1:2]))
	if got[0].Action != consumer.DeadLetter || !errors.Is(got[0].Err, consumer.ErrPanic) {
		t.Fatalf("second panic: got %+v, want DeadLetter with ErrPanic", got[0])
	}
	if st := p.Stats(); st.Panics != 2 || st.DeadLettered != 1 || st.Processed != 2 {
		t.Fatalf("stats %+v, want 2 panics, 1 dead letter, 2 processed", st)
	}
}

// TestPoisonLengthsDeadLetteredAtOnce checks that a key or fingerprint over
// its limit is dead-lettered at its first delivery instead of being retried
// forever.
func TestPoisonLengthsDeadLetteredAtOnce(t *testing.T) {
	p := newProcessor(t)
	long := strings.Repeat("k", idem.MaxKeyLen+1)
	batch := []consumer.Message{
		{Key: long, Deliveries: 1},
		{Key: "ok", Fingerprint: strings.Repeat("f", idem.MaxFingerprintLen+1), Deliveries: 1},
	}
	ran := 0
	got := p.Process(t.Context(), batch, func(context.Context, int) error { ran++; return nil })
	for i, r := range got {
		if r.Action != consumer.DeadLetter || !errors.Is(r.Err, idem.ErrInvalid) {
			t.Errorf("message %d: got %+v, want DeadLetter with ErrInvalid", i, r)
		}
	}
	if ran != 0 {
		t.Errorf("handler ran %d times for invalid messages", ran)
	}
	if st := p.Stats(); st.Invalid != 2 || st.DeadLettered != 2 {
		t.Errorf("stats %+v, want 2 invalid dead letters", st)
	}
}

// TestDeliveriesSurviveRestart checks that the dead-letter decision counts
// the record's acquisitions in the store, for a broker (or an adapter
// restarted) that cannot say how often a message was delivered.
func TestDeliveriesSurviveRestart(t *testing.T) {
	s, err := memstore.New()
	if err != nil {
		t.Fatal(err)
	}
	fail := func(context.Context, int) error { return errors.New("downstream down") }
	msg := []consumer.Message{{Key: "k", Deliveries: 0}}
	for delivery := 1; delivery <= 3; delivery++ {
		// A new executor and processor for each delivery: a restarted
		// process, with no count in memory.
		exec, err := idem.New(s)
		if err != nil {
			t.Fatal(err)
		}
		p, err := consumer.New(exec, consumer.WithMaxDeliveries(3))
		if err != nil {
			t.Fatal(err)
		}
		got := p.Process(t.Context(), msg, fail)
		want := consumer.Retry
		if delivery == 3 {
			want = consumer.DeadLetter
		}
		if got[0].Action != want {
			t.Fatalf("delivery %d: got %+v, want %v", delivery, got[0], want)
		}
	}
}

// TestInBatchRepeatWithOtherFingerprint checks the in-batch rule for a
// repeated key whose payload differs: a mismatch, dead-lettered.
func TestInBatchRepeatWithOtherFingerprint(t *testing.T) {
	p := newProcessor(t)
	batch := []consumer.Message{{Key: "k", Fingerprint: "a"}, {Key: "k", Fingerprint: "b"}, {Key: "k", Fingerprint: "a"}}
	ran := 0
	got := p.Process(t.Context(), batch, func(context.Context, int) error { ran++; return nil })
	if got[0].Action != consumer.Ack || got[1].Action != consumer.DeadLetter || !errors.Is(got[1].Err, idem.ErrMismatch) || !got[2].Replayed || ran != 1 {
		t.Fatalf("got %+v, ran %d; want ack, mismatch dead letter, replay, one run", got, ran)
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
