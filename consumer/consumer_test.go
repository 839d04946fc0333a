package consumer_test

import (
	"context"
	"errors"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idemgo/idem"
	"github.com/idemgo/idem/adapterkit"
	"github.com/idemgo/idem/consumer"
	"github.com/idemgo/idem/memstore"
	"github.com/idemgo/idem/storekit"
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
	long := strings.Repeat("k", storekit.MaxKeyLen+1)
	batch := []consumer.Message{
		{Key: long, Deliveries: 1},
		{Key: "ok", Fingerprint: strings.Repeat("f", storekit.MaxFingerprintLen+1), Deliveries: 1},
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
	type adapterSettings struct{ n int }
	for _, o := range []consumer.Option{consumer.WithMaxDeliveries(-1), consumer.WithRetryDelay(-time.Second),
		consumer.WithBatchSize(0), consumer.WithConcurrency(0), consumer.WithShutdownTimeout(-1), consumer.WithLogger(nil),
		consumer.AdapterOption(func(a *adapterSettings) { a.n = 1 })} {
		if _, err := consumer.New(exec, o); !errors.Is(err, idem.ErrInvalid) {
			t.Errorf("bad option: got %v", err)
		}
	}
}

// TestOnLeaseLost: a handler whose lease is lost while it runs (another
// owner took the key over) is not acknowledged, and the compensation hook
// gets its key, fence and error.
func TestOnLeaseLost(t *testing.T) {
	s, err := memstore.New()
	if err != nil {
		t.Fatal(err)
	}
	exec, err := idem.New(s)
	if err != nil {
		t.Fatal(err)
	}
	var got []idem.LeaseLost
	p, err := consumer.New(exec, consumer.WithOnLeaseLost(func(_ context.Context, l idem.LeaseLost) { got = append(got, l) }))
	if err != nil {
		t.Fatal(err)
	}
	boom := errors.New("half done")
	batch := []consumer.Message{{Key: "ok"}, {Key: "failed"}, {Key: "kept"}}
	fences := map[string]int64{}
	res := p.Process(t.Context(), batch, func(ctx context.Context, i int) error {
		fences[batch[i].Key], _ = idem.FenceFrom(ctx)
		if batch[i].Key == "kept" {
			return nil
		}
		if err := s.Delete(ctx, p.Key(batch[i].Key).Digest()); err != nil {
			t.Fatal(err)
		}
		if batch[i].Key == "failed" {
			return boom
		}
		return nil
	})
	if res[0].Action != consumer.Retry || res[1].Action != consumer.Retry || res[2].Action != consumer.Ack {
		t.Fatalf("results %+v, want the two lost leases retried and the third acked", res)
	}
	if len(got) != 2 {
		t.Fatalf("hook calls %+v, want 2", got)
	}
	for _, l := range got {
		if l.Fence != fences[l.Key.ID] || (l.Key.ID == "failed") != errors.Is(l.Err, boom) || (l.Key.ID == "ok" && l.Err != nil) {
			t.Errorf("hook call %+v, want fence %d and the handler's error", l, fences[l.Key.ID])
		}
	}
}

// TestPassDuplicates: with WithPassDuplicates a duplicate of a COMPLETED
// key reaches the handler, marked, instead of being acked silently.
func TestPassDuplicates(t *testing.T) {
	p := newProcessor(t, consumer.WithPassDuplicates())
	var dups, runs int
	h := func(ctx context.Context, i int) error {
		if _, ok := consumer.DuplicateFrom(ctx); ok {
			dups++
			if _, ok := idem.FenceFrom(ctx); ok {
				t.Error("a duplicate's context carries a lease")
			}
			return nil
		}
		runs++
		return nil
	}
	msg := []consumer.Message{{Key: "k"}}
	p.Process(t.Context(), msg, h)
	res := p.Process(t.Context(), msg, h)
	if runs != 1 || dups != 1 || res[0].Action != consumer.Ack || !res[0].Replayed {
		t.Fatalf("runs %d, duplicates passed %d, result %+v; want 1, 1 and a replayed ack", runs, dups, res[0])
	}
	// A failing duplicate handler delays the acknowledgement.
	res = p.Process(t.Context(), msg, func(context.Context, int) error { return errors.New("not yet") })
	if res[0].Action != consumer.Retry {
		t.Fatalf("failing duplicate handler: got %+v, want Retry", res[0])
	}
}

// TestStuckHandlerAbandoned: a handler that ignores its context keeps
// Process waiting only AbandonAfter once the batch's context is done. Its
// key is left to its lease (IN_PROGRESS, not extended), the messages after
// it in the batch do not start, and its late return completes nothing: the
// next delivery takes the key over with a higher fence once the lease
// ended.
func TestStuckHandlerAbandoned(t *testing.T) {
	s, err := memstore.New()
	if err != nil {
		t.Fatal(err)
	}
	exec, err := idem.New(s, idem.WithLease(300*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	p, err := consumer.New(exec)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	entered, release, returned := make(chan int64, 1), make(chan struct{}), make(chan struct{})
	var once sync.Once
	t.Cleanup(func() { once.Do(func() { close(release) }) })
	var nextRuns atomic.Int32
	batch := []consumer.Message{{Key: "stuck"}, {Key: "next"}}
	done := make(chan []consumer.Result, 1)
	go func() {
		done <- p.Process(ctx, batch, func(ctx context.Context, i int) error {
			if i == 1 {
				nextRuns.Add(1)
				return nil
			}
			fence, _ := idem.FenceFrom(ctx)
			entered <- fence
			<-release // ignores ctx
			close(returned)
			return nil
		})
	}()
	fence := <-entered
	cancel()
	var res []consumer.Result
	select {
	case res = <-done:
	case <-time.After(30 * time.Second):
		t.Fatal("Process had not returned 30s after its context was cancelled, its handler ignoring it")
	}
	if res[0].Action != consumer.Retry || !errors.Is(res[0].Err, consumer.ErrAbandoned) || res[0].Delay <= 0 || res[0].Delay > adapterkit.Lease(exec) {
		t.Errorf("stuck message: got %+v, want Retry with ErrAbandoned after the rest of the lease", res[0])
	}
	if res[1].Action != consumer.Retry || !errors.Is(res[1].Err, consumer.ErrStopping) || nextRuns.Load() != 0 {
		t.Errorf("next message: got %+v after %d runs, want Retry with ErrStopping and no run", res[1], nextRuns.Load())
	}
	if st := p.Stats(); st.Abandoned != 1 || st.Retried != 2 || st.Processed != 0 {
		t.Errorf("stats %+v, want 1 abandoned, 2 retried, 0 processed", st)
	}
	digest := p.Key("stuck").Digest()
	rec, err := s.Get(t.Context(), digest)
	if err != nil || rec.State != storekit.StateInProgress || rec.Fence != fence {
		t.Fatalf("record: %v fence %d (%v), want IN_PROGRESS under the stuck handler's fence %d", rec.State, rec.Fence, err, fence)
	}
	leaseUntil := rec.LeaseUntil

	close(release) // the late return: a success
	once.Do(func() {})
	<-returned
	deadline := time.Now().Add(30 * time.Second)
	for !rec.Now.After(leaseUntil) {
		if time.Now().After(deadline) {
			t.Fatal("the stuck handler's lease did not end within 30s")
		}
		time.Sleep(10 * time.Millisecond)
		if rec, err = s.Get(t.Context(), digest); err != nil {
			t.Fatal(err)
		}
	}
	if rec.State != storekit.StateInProgress || rec.Fence != fence || !rec.LeaseUntil.Equal(leaseUntil) {
		t.Fatalf("record once the lease ended: %v fence %d lease until %v, want IN_PROGRESS, fence %d, lease until %v (not completed, not extended)",
			rec.State, rec.Fence, rec.LeaseUntil, fence, leaseUntil)
	}
	var fence2 int64
	res = p.Process(t.Context(), batch[:1], func(ctx context.Context, i int) error {
		fence2, _ = idem.FenceFrom(ctx)
		return nil
	})
	if res[0].Action != consumer.Ack || res[0].Replayed || fence2 <= fence {
		t.Errorf("redelivery: got %+v with fence %d, want a takeover (Ack, not replayed) with a fence above %d", res[0], fence2, fence)
	}
}

// TestStuckHandlerAbandonedParallel: with handlers on goroutines of their
// own (WithParallelHandlers, WithGatheredHandlers), a handler that ignores
// its context is abandoned AbandonAfter after the batch's context is done
// while the others are decided as usual: one that returns its context's
// cause is released, one that returns nil is completed, one that waited
// for a slot does not start (ErrStopping); the stuck
// one's late return changes nothing (the race detector watches its
// goroutine).
func TestStuckHandlerAbandonedParallel(t *testing.T) {
	for _, tc := range []struct {
		name string
		opt  consumer.Option
		wait bool // the last message waits for a slot (all three taken)
	}{
		{"parallel", consumer.WithParallelHandlers(3), true},
		{"gathered", consumer.WithGatheredHandlers(), false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := newProcessor(t, tc.opt)
			ctx, cancel := context.WithCancel(t.Context())
			defer cancel()
			release, returned := make(chan struct{}), make(chan struct{})
			var once sync.Once
			t.Cleanup(func() { once.Do(func() { close(release) }) })
			var started sync.WaitGroup
			started.Add(3)
			if !tc.wait {
				started.Add(1) // gathered: "last" runs too, before the cancel
			}
			var lastRuns atomic.Int32
			batch := []consumer.Message{{Key: "stuck"}, {Key: "cancelled"}, {Key: "ok"}, {Key: "last"}}
			done := make(chan []consumer.Result, 1)
			go func() {
				done <- p.Process(ctx, batch, func(ctx context.Context, i int) error {
					switch i {
					case 0:
						started.Done()
						<-release // ignores ctx
						close(returned)
						return errors.New("late")
					case 1:
						started.Done()
						<-ctx.Done()
						return context.Cause(ctx)
					case 2:
						started.Done()
						<-ctx.Done()
						return nil // done: completed
					}
					if lastRuns.Add(1); !tc.wait {
						started.Done()
					}
					return nil
				})
			}()
			started.Wait()
			cancel()
			var res []consumer.Result
			select {
			case res = <-done:
			case <-time.After(30 * time.Second):
				t.Fatal("Process had not returned 30s after its context was cancelled, a handler ignoring it")
			}
			if res[0].Action != consumer.Retry || !errors.Is(res[0].Err, consumer.ErrAbandoned) {
				t.Errorf("stuck: got %+v, want Retry with ErrAbandoned", res[0])
			}
			if res[1].Action != consumer.Retry || errors.Is(res[1].Err, consumer.ErrAbandoned) || !errors.Is(res[1].Err, context.Canceled) {
				t.Errorf("cancelled: got %+v, want Retry with context.Canceled", res[1])
			}
			if res[2].Action != consumer.Ack {
				t.Errorf("ok: got %+v, want Ack", res[2])
			}
			switch {
			case tc.wait && (res[3].Action != consumer.Retry || !errors.Is(res[3].Err, consumer.ErrStopping) || lastRuns.Load() != 0):
				t.Errorf("last, waiting for a slot: got %+v after %d runs, want Retry with ErrStopping and no run", res[3], lastRuns.Load())
			case !tc.wait && res[3].Action != consumer.Ack:
				t.Errorf("last, gathered: got %+v, want Ack", res[3])
			}
			if st := p.Stats(); st.Abandoned != 1 || st.Processed+st.Retried != 4 {
				t.Errorf("stats %+v, want 1 abandoned, 4 decided", st)
			}
			close(release) // the late return: a failure, ignored
			once.Do(func() {})
			<-returned
			rec, err := adapterkit.Store(p.Executor()).Get(t.Context(), p.Key("stuck").Digest())
			if err != nil || rec.State != storekit.StateInProgress {
				t.Errorf("stuck record after its late return: %v (%v), want IN_PROGRESS (left to its lease)", rec.State, err)
			}
			if !errors.Is(res[0].Err, consumer.ErrAbandoned) {
				t.Errorf("stuck result after its late return: got %+v, want it unchanged (ErrAbandoned)", res[0])
			}
		})
	}
}

// TestCancelledHandlerNotAbandoned: a handler that returns when its context
// is cancelled by the batch's is not abandoned: its key is released.
func TestCancelledHandlerNotAbandoned(t *testing.T) {
	p := newProcessor(t)
	ctx, cancel := context.WithCancel(t.Context())
	res := p.Process(ctx, []consumer.Message{{Key: "k"}}, func(ctx context.Context, i int) error {
		cancel()
		<-ctx.Done()
		return context.Cause(ctx)
	})
	if res[0].Action != consumer.Retry || errors.Is(res[0].Err, consumer.ErrAbandoned) || !errors.Is(res[0].Err, context.Canceled) {
		t.Errorf("got %+v, want Retry with the handler's context.Canceled", res[0])
	}
	if st := p.Stats(); st.Abandoned != 0 {
		t.Errorf("stats %+v, want 0 abandoned", st)
	}
	if rec, err := adapterkit.Store(p.Executor()).Get(t.Context(), p.Key("k").Digest()); err != nil || rec.State != storekit.StateReleased {
		t.Errorf("record: %v (%v), want RELEASED", rec.State, err)
	}
}

// TestGoexitIsAnError: a handler that calls runtime.Goexit (t.FailNow in a
// test's handler) is a failed message, as a panic is.
func TestGoexitIsAnError(t *testing.T) {
	p := newProcessor(t)
	res := p.Process(t.Context(), []consumer.Message{{Key: "k"}}, func(context.Context, int) error {
		runtime.Goexit()
		return nil
	})
	if res[0].Action != consumer.Retry || !errors.Is(res[0].Err, consumer.ErrPanic) {
		t.Errorf("got %+v, want Retry with ErrPanic", res[0])
	}
}

// TestGoexitIsAnErrorParallel: with handlers on goroutines of their own,
// a handler that calls runtime.Goexit is a failed message, and the
// batch's other messages are decided as usual.
func TestGoexitIsAnErrorParallel(t *testing.T) {
	for _, opt := range []consumer.Option{consumer.WithParallelHandlers(2), consumer.WithGatheredHandlers()} {
		p := newProcessor(t, opt)
		ctx, cancel := context.WithCancel(t.Context()) // a batch that can stop: handlers on goroutines of their own
		res := p.Process(ctx, []consumer.Message{{Key: "k"}, {Key: "ok"}}, func(_ context.Context, i int) error {
			if i == 0 {
				runtime.Goexit()
			}
			return nil
		})
		cancel()
		if res[0].Action != consumer.Retry || !errors.Is(res[0].Err, consumer.ErrPanic) || res[1].Action != consumer.Ack {
			t.Errorf("got %+v, want Retry with ErrPanic, then Ack", res)
		}
	}
}

// TestSetResult: the result a handler sets is stored with the completion;
// a duplicate passed to the handler gets it, and a context that is not a
// handler's refuses it.
func TestSetResult(t *testing.T) {
	p := newProcessor(t, consumer.WithPassDuplicates())
	ctx := t.Context()
	if consumer.SetResult(ctx, []byte("x")) {
		t.Error("SetResult outside a handler: got true, want false")
	}
	msgs := []consumer.Message{{Key: "k", Deliveries: 1}}
	got := p.Process(ctx, msgs, func(ctx context.Context, i int) error {
		if m, ok := consumer.MessageFrom(ctx); !ok || m.Key != "k" || m.Deliveries != 1 {
			t.Errorf("MessageFrom: got %+v, %v, want the message", m, ok)
		}
		if !consumer.SetResult(ctx, []byte("first")) || !consumer.SetResult(ctx, []byte("201 created")) {
			t.Error("SetResult in a handler: got false, want true")
		}
		return nil
	})
	if got[0].Action != consumer.Ack || got[0].Replayed {
		t.Fatalf("first delivery: got %+v, want a processed Ack", got[0])
	}
	var stored []byte
	var setInDup bool
	got = p.Process(ctx, msgs, func(ctx context.Context, i int) error {
		stored, _ = consumer.DuplicateFrom(ctx)
		if m, ok := consumer.MessageFrom(ctx); !ok || m.Key != "k" {
			t.Errorf("MessageFrom in a duplicate: got %+v, %v, want the message", m, ok)
		}
		setInDup = consumer.SetResult(ctx, []byte("other"))
		return nil
	})
	if got[0].Action != consumer.Ack || !got[0].Replayed {
		t.Fatalf("duplicate: got %+v, want a replayed Ack", got[0])
	}
	if string(stored) != "201 created" {
		t.Errorf("duplicate's stored result: got %q, want %q", stored, "201 created")
	}
	if setInDup {
		t.Error("SetResult in a duplicate's handler: got true, want false")
	}
}

// TestParallelHandlers: with WithParallelHandlers(n), n handlers of a
// batch run at the same time and never more; a repeat of a key within the
// batch does not run; nothing is completed before every handler returned;
// failures are settled per message as in order. Each handler of the first
// n waits until n are running, so the test cannot pass with handlers run
// one at a time.
func TestParallelHandlers(t *testing.T) {
	const n = 4
	p := newProcessor(t, consumer.WithParallelHandlers(n), consumer.WithMaxDeliveries(1))
	exec := p.Executor()
	var msgs []consumer.Message
	for i := range 3 * n {
		msgs = append(msgs, consumer.Message{Key: "k" + string(rune('a'+i)), Deliveries: 1})
	}
	msgs = append(msgs, consumer.Message{Key: "ka", Deliveries: 1}) // a repeat: follows the first
	var running, peak, calls atomic.Int64
	allIn := make(chan struct{})
	var once sync.Once
	h := func(ctx context.Context, i int) error {
		calls.Add(1)
		r := running.Add(1)
		defer running.Add(-1)
		for {
			p := peak.Load()
			if r <= p || peak.CompareAndSwap(p, r) {
				break
			}
		}
		if r == n {
			once.Do(func() { close(allIn) })
		}
		select {
		case <-allIn:
		case <-time.After(10 * time.Second):
			t.Errorf("handler %d: got %d handlers running at once, want %d", i, running.Load(), n)
		}
		// Record before ack: no key of the batch is completed while a
		// handler runs.
		if _, a, err := exec.Begin(context.WithoutCancel(ctx), p.Key(msgs[0].Key), ""); err == nil {
			t.Errorf("handler %d: key %q could be acquired again while the batch runs (replayed %v)", i, msgs[0].Key, a.Replayed())
		}
		if msgs[i].Key == "kb" {
			return idem.Terminal(errors.New("poison"))
		}
		if msgs[i].Key == "kc" {
			return errors.New("flaky")
		}
		return nil
	}
	got := p.Process(t.Context(), msgs, h)
	if c := calls.Load(); c != int64(3*n) {
		t.Errorf("got %d handler calls, want %d (the repeat does not run)", c, 3*n)
	}
	if pk := peak.Load(); pk != n {
		t.Errorf("got at most %d handlers at once, want %d", pk, n)
	}
	for i, r := range got {
		want := consumer.Ack
		switch msgs[i].Key {
		case "kb", "kc": // terminal, and the last delivery of a flaky one
			want = consumer.DeadLetter
		}
		if r.Action != want {
			t.Errorf("message %d (%s): got %v (%v), want %v", i, msgs[i].Key, r.Action, r.Err, want)
		}
	}
	if !got[len(got)-1].Replayed {
		t.Errorf("the repeat: got %+v, want a replayed Ack", got[len(got)-1])
	}
	s := p.Stats()
	if s.Processed != int64(3*n-2) || s.DeadLettered != 2 || s.Replayed != 1 {
		t.Errorf("got %+v, want %d processed, 2 dead-lettered, 1 replayed", s, 3*n-2)
	}
}

// TestRetryBackoff: with WithRetryBackoff, a failing handler's message is
// retried after the retry delay doubled with each delivery, up to the
// maximum; without it, after the retry delay every time.
func TestRetryBackoff(t *testing.T) {
	fail := func(context.Context, int) error { return errors.New("downstream 503") }
	for _, tc := range []struct {
		name string
		opts []consumer.Option
		want []time.Duration // per delivery 1..5
	}{
		{"backoff", []consumer.Option{consumer.WithRetryDelay(10 * time.Millisecond), consumer.WithRetryBackoff(50 * time.Millisecond)},
			[]time.Duration{10, 20, 40, 50, 50}},
		{"fixed", []consumer.Option{consumer.WithRetryDelay(10 * time.Millisecond)},
			[]time.Duration{10, 10, 10, 10, 10}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := newProcessor(t, append(tc.opts, consumer.WithMaxDeliveries(0))...)
			for d, want := range tc.want {
				got := p.Process(t.Context(), []consumer.Message{{Key: "flaky", Deliveries: d + 1}}, fail)
				if got[0].Action != consumer.Retry || got[0].Delay != want*time.Millisecond {
					t.Errorf("delivery %d: got %v after %v, want a retry after %v", d+1, got[0].Action, got[0].Delay, want*time.Millisecond)
				}
			}
		})
	}
}

// TestCompleteEach: with WithCompleteEach, a key is completed as soon as
// its handler returned, before the next handler of the batch starts (one
// at a time) or with the keys of the handlers that returned meanwhile (in
// parallel), so that a crash in the middle of the batch (Batch.Abandon)
// leaves only the running handler's key to be run again. Without it,
// nothing is completed before the batch's end.
func TestCompleteEach(t *testing.T) {
	for _, tc := range []struct {
		name     string
		parallel int
		each     bool
	}{
		{"in-order", 1, true},
		{"parallel", 4, true},
		{"off", 1, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var calls atomic.Int64
			opts := []consumer.Option{consumer.WithParallelHandlers(tc.parallel), consumer.WithCommit(
				func(ctx context.Context, _ []consumer.Message, attempts []*idem.Attempt, values [][]byte) []error {
					calls.Add(1)
					return adapterkit.CommitBatch(ctx, attempts[0].Executor(), attempts, values)
				})}
			if tc.each {
				opts = append(opts, consumer.WithCompleteEach())
			}
			p := newProcessor(t, opts...)
			exec := p.Executor()
			const n = 12
			var msgs []consumer.Message
			for i := range n {
				msgs = append(msgs, consumer.Message{Key: "k" + string(rune('a'+i)), Deliveries: 1})
			}
			completed := func(key string) bool {
				_, a, err := exec.Begin(t.Context(), p.Key(key), "")
				if err == nil && !a.Replayed() {
					t.Fatalf("key %q acquired again", key)
				}
				return err == nil
			}
			// The crash comes while the last handler runs: the batch is
			// abandoned, not committed.
			b := p.Acquire(t.Context(), msgs)
			var before atomic.Int64 // keys found completed by the last handler
			b.Handle(func(ctx context.Context, i int) error {
				if i != n-1 {
					return nil
				}
				deadline := time.Now().Add(10 * time.Second)
				for {
					before.Store(0)
					for _, m := range msgs[:n-1] {
						if completed(m.Key) {
							before.Add(1)
						}
					}
					// In parallel, the handlers started with the last
					// one complete as they return: wait for them.
					if !tc.each || before.Load() == n-1 || time.Now().After(deadline) {
						return nil
					}
					time.Sleep(time.Millisecond) // poll the store
				}
			})
			b.Abandon()
			want := int64(0)
			if tc.each {
				want = n - 1
			}
			if got := before.Load(); got != want {
				t.Errorf("got %d keys completed while the last handler ran, want %d", got, want)
			}
			if tc.each && tc.parallel == 1 && calls.Load() != n {
				t.Errorf("got %d commit calls, want %d (one per handler, one at a time)", calls.Load(), n)
			}
			if tc.each && calls.Load() > n {
				t.Errorf("got %d commit calls, want at most %d", calls.Load(), n)
			}
		})
	}
}
