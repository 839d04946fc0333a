// Package consumertest is the conformance suite of broker consumer
// adapters, as storetest is the Store's: every adapter of this repository
// runs it against its real broker (kfake for Kafka). An adapter provides a
// Harness; Run checks what package consumer promises of every adapter.
package consumertest

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/idemgo/idem"
	"github.com/idemgo/idem/adapterkit"
	"github.com/idemgo/idem/consumer"
	"github.com/idemgo/idem/storekit"
)

// MaxDeliveries is the maximum of deliveries the suite configures.
const MaxDeliveries = 2

// Handler is the suite's handler: it gets the message's key (as the suite
// published it) and payload.
type Handler func(ctx context.Context, key string, payload []byte) error

// Harness is one adapter on a fresh queue (topic, stream, subject) of its
// real broker.
type Harness interface {
	// Publish sends a message whose idempotency key is key (none if
	// empty), with payload, where the adapter's default key source (or the
	// one the harness configures) finds it.
	Publish(t *testing.T, key string, payload []byte)
	// Start runs one consumer of the queue until stop is called; its
	// Processor has opts (the suite passes consumer.WithMaxDeliveries and a
	// short consumer.WithRetryDelay) and a fingerprint of the payload.
	// stats returns the consumer's Stats.
	Start(t *testing.T, opts []consumer.Option, h Handler) (stats func() consumer.Stats, stop func())
	// DeadLetters returns how many messages the dead-letter path holds.
	DeadLetters(t *testing.T) int
	// Executor returns an executor on the store that the harness's
	// consumers use (the same one for every Start of the harness): the
	// suite reads records through it, acquires keys as another owner and
	// deletes records to take a lease away. Its lease must be short (about
	// a second), so that a lost lease is noticed within the suite's waits.
	Executor(t *testing.T) *idem.Executor
}

// Run runs the suite; newHarness returns a harness on a fresh queue.
func Run(t *testing.T, newHarness func(t *testing.T) Harness) {
	run(t, newHarness, nil)
}

// run runs the suite's cases but those of inapplicable (by name; the
// value is the reason).
func run(t *testing.T, newHarness func(t *testing.T) Harness, inapplicable map[string]string) {
	tRun := func(name string, f func(t *testing.T)) {
		if _, ok := inapplicable[name]; !ok {
			t.Run(name, f)
		}
	}
	opts := []consumer.Option{consumer.WithMaxDeliveries(MaxDeliveries), consumer.WithRetryDelay(20 * time.Millisecond)}
	// scoped returns the suite's options with a scope of the subtest's
	// own, so that the suite knows the keys' records.
	scoped := func(extra ...consumer.Option) ([]consumer.Option, string) {
		scope := fmt.Sprintf("consumertest-%d", time.Now().UnixNano())
		return append(append(append([]consumer.Option{}, opts...), consumer.WithScope(scope)), extra...), scope
	}
	tRun("OrderAcquireHandlerComplete", func(t *testing.T) {
		// The handler runs with the key acquired (IN_PROGRESS in the store,
		// under the fence of its context), and the message counts as
		// processed only once the record is COMPLETED. That the
		// acknowledgement waits for the completion is checked by
		// LeaseLostNotAckedHookCalled: a completion that fails must leave
		// the message unacknowledged.
		h := newHarness(t)
		exec := h.Executor(t)
		opts, scope := scoped()
		key := idem.Key{Scope: scope, ID: "ordered"}
		var mu sync.Mutex
		var seen []string
		stats, stop := h.Start(t, opts, func(ctx context.Context, k string, payload []byte) error {
			fence, ok := fenceFrom(ctx)
			rec, err := adapterkit.Store(exec).Get(context.WithoutCancel(ctx), key.Digest())
			mu.Lock()
			defer mu.Unlock()
			switch {
			case !ok:
				seen = append(seen, "no fence in the handler's context")
			case err != nil:
				seen = append(seen, fmt.Sprintf("no record while the handler runs: %v", err))
			case rec.State != storekit.StateInProgress || rec.Fence != fence:
				seen = append(seen, fmt.Sprintf("record %v fence %d while the handler with fence %d runs", rec.State, rec.Fence, fence))
			default:
				seen = append(seen, "acquired")
			}
			return nil
		})
		defer stop()
		h.Publish(t, "ordered", []byte("a"))
		waitFor(t, "the message processed", func() bool { return stats().Processed == 1 })
		rec, err := adapterkit.Store(exec).Get(t.Context(), key.Digest())
		if err != nil || rec.State != storekit.StateCompleted {
			t.Errorf("after the message was processed: record %v, %v; want COMPLETED", rec.State, err)
		}
		mu.Lock()
		defer mu.Unlock()
		if len(seen) != 1 || seen[0] != "acquired" {
			t.Errorf("handler runs saw %q, want one run with its key acquired", seen)
		}
	})
	tRun("InProgressDuplicateNeverAcked", func(t *testing.T) {
		// Another owner holds the key: the message is not handled and not
		// acknowledged while it does; once the owner completes, the message
		// comes back and is replayed.
		h := newHarness(t)
		exec := h.Executor(t)
		opts, scope := scoped()
		_, owner, err := exec.Begin(t.Context(), idem.Key{Scope: scope, ID: "busy"}, "a")
		if err != nil {
			t.Fatal(err)
		}
		r := newRuns()
		stats, stop := h.Start(t, opts, r.handler(nil))
		defer stop()
		h.Publish(t, "busy", []byte("a"))
		waitFor(t, "the duplicate found in progress", func() bool { return stats().Retried >= 1 })
		if err := owner.Commit(t.Context(), nil); err != nil {
			t.Fatal(err)
		}
		waitFor(t, "the duplicate back and replayed (an adapter that acked it loses it)", func() bool { return stats().Replayed == 1 })
		if n := r.count("busy"); n != 0 {
			t.Errorf("handler ran %d times for a key held by another owner, want 0", n)
		}
	})
	tRun("LeaseLostNotAckedHookCalled", func(t *testing.T) {
		// The record is deleted while the handler runs (as a takeover
		// would): its context is cancelled with idem.ErrLeaseLost, the
		// compensation hook gets the key and fence, and the message is not
		// acknowledged: it comes back and runs again.
		h := newHarness(t)
		exec := h.Executor(t)
		lost := make(chan idem.LeaseLost, 1)
		opts, scope := scoped(consumer.WithOnLeaseLost(func(_ context.Context, l idem.LeaseLost) { lost <- l }))
		key := idem.Key{Scope: scope, ID: "lost"}
		entered := make(chan int64, 1)
		r := newRuns()
		var first sync.Once // the first run waits for the lease loss
		stats, stop := h.Start(t, opts, r.handler(nil).wrap(func(ctx context.Context) error {
			var err error
			first.Do(func() {
				fence, _ := fenceFrom(ctx)
				entered <- fence
				<-ctx.Done()
				err = context.Cause(ctx)
			})
			return err
		}))
		defer stop()
		h.Publish(t, "lost", []byte("a"))
		fence := waitRecv(t, "the handler", entered)
		if err := adapterkit.Store(exec).Delete(t.Context(), key.Digest()); err != nil {
			t.Fatal(err)
		}
		l := waitRecv(t, "the compensation hook", lost)
		if l.Key != key || l.Fence != fence || !errors.Is(l.Err, idem.ErrLeaseLost) {
			t.Errorf("hook got key %v fence %d err %v, want %v, %d and idem.ErrLeaseLost", l.Key, l.Fence, l.Err, key, fence)
		}
		waitFor(t, "the message back and completed (an adapter that acked it loses it)", func() bool {
			return r.count("lost") == 1 && stats().Processed == 1 // r counts the second run only
		})
	})
	tRun("CompletedDuplicateAckedWithoutHandler", func(t *testing.T) {
		h := newHarness(t)
		r := newRuns()
		stats, stop := h.Start(t, opts, r.handler(nil))
		defer stop()
		h.Publish(t, "k1", []byte("a"))
		waitFor(t, "the first run", func() bool { return stats().Processed == 1 })
		h.Publish(t, "k1", []byte("a"))
		waitFor(t, "the duplicate's replay", func() bool { return stats().Replayed == 1 })
		if n := r.count("k1"); n != 1 {
			t.Errorf("handler ran %d times for one key, want 1", n)
		}
	})
	tRun("HandlerErrorRedeliveredThenDeadLettered", func(t *testing.T) {
		h := newHarness(t)
		r := newRuns()
		stats, stop := h.Start(t, opts, r.handler(func(string) error { return errors.New("downstream refused") }))
		defer stop()
		h.Publish(t, "bad", []byte("a"))
		waitFor(t, "the dead letter", func() bool { return stats().DeadLettered == 1 && h.DeadLetters(t) == 1 })
		if n := r.count("bad"); n != MaxDeliveries {
			t.Errorf("handler ran %d times, want %d (the maximum of deliveries)", n, MaxDeliveries)
		}
	})
	tRun("PanicIsAnError", func(t *testing.T) {
		h := newHarness(t)
		r := newRuns()
		stats, stop := h.Start(t, opts, r.handler(func(key string) error {
			if key == "boom" {
				panic("poison message")
			}
			return nil
		}))
		defer stop()
		h.Publish(t, "boom", []byte("a"))
		h.Publish(t, "fine", []byte("b"))
		waitFor(t, "the dead letter and the next message", func() bool {
			st := stats()
			return st.DeadLettered == 1 && st.Processed == 1 && h.DeadLetters(t) == 1
		})
		if st := stats(); st.Panics != MaxDeliveries {
			t.Errorf("stats %+v, want %d panics", st, MaxDeliveries)
		}
	})
	tRun("InvalidDeadLetteredAtOnce", func(t *testing.T) {
		h := newHarness(t)
		r := newRuns()
		stats, stop := h.Start(t, opts, r.handler(nil))
		defer stop()
		h.Publish(t, "", []byte("no key"))
		h.Publish(t, strings.Repeat("k", storekit.MaxKeyLen+1), []byte("long key"))
		h.Publish(t, "long-fp", []byte(strings.Repeat("f", storekit.MaxFingerprintLen+1)))
		h.Publish(t, "ok", []byte("ok"))
		waitFor(t, "three dead letters and the good message", func() bool {
			st := stats()
			return st.Invalid == 3 && st.Processed == 1 && h.DeadLetters(t) == 3
		})
		if st := stats(); st.Retried != 0 {
			t.Errorf("stats %+v: an invalid message was retried", st)
		}
		if n := r.total(); n != 1 {
			t.Errorf("handler ran %d times, want 1 (only the valid message)", n)
		}
	})
	tRun("ShutdownFinishesOrReleasesInFlight", func(t *testing.T) {
		h := newHarness(t)
		started, release := make(chan struct{}), make(chan struct{})
		var first sync.Once
		stats, stop := h.Start(t, opts, func(ctx context.Context, key string, payload []byte) (err error) {
			first.Do(func() {
				close(started)
				<-release
				err = errors.New("interrupted by the shutdown")
			})
			return err
		})
		h.Publish(t, "inflight", []byte("a"))
		waitRecv(t, "the handler", started)
		// Stop while the handler runs, then let it fail as a handler
		// interrupted by a shutdown does: the consumer must leave the
		// message to be redelivered. (If the stop lands after the failure,
		// the consumer may redeliver it itself, and a later run completes
		// it.)
		stopped := make(chan struct{})
		go func() { stop(); close(stopped) }()
		close(release)
		waitRecv(t, "the consumer's stop", stopped)
		if stats().Processed == 1 {
			return // completed (and acked, or replayed on redelivery)
		}
		r := newRuns()
		stats2, stop2 := h.Start(t, opts, r.handler(nil))
		defer stop2()
		waitFor(t, "the released message's redelivery (else it is lost)", func() bool {
			st := stats2()
			return r.count("inflight") == 1 && st.Processed+st.Replayed == 1
		})
	})
	tRun("StuckHandlerAbandonedAtShutdown", func(t *testing.T) {
		// A handler that ignores its context does not keep Run from
		// returning: Run returns once the shutdown timeout (and the
		// Processor's second of grace) passed, while the handler still
		// runs. Its key is left to its lease (IN_PROGRESS under the
		// handler's fence, no longer extended), its message is not
		// acknowledged, and the handler's late return (a success) neither
		// completes the key nor acknowledges anything: the next consumer
		// gets the message and runs it again, with a higher fence, once
		// the lease ended.
		h := newHarness(t)
		exec := h.Executor(t)
		opts, scope := scoped(consumer.WithShutdownTimeout(100 * time.Millisecond))
		key := idem.Key{Scope: scope, ID: "stuck"}
		entered := make(chan int64, 1)
		release, returned := make(chan struct{}), make(chan struct{})
		var first sync.Once
		stats, stop := h.Start(t, opts, func(ctx context.Context, k string, payload []byte) error {
			var stuck bool
			first.Do(func() { stuck = true })
			if !stuck {
				// Only a redelivery within the same consumer gets here:
				// the stuck run is this consumer's only one.
				return errors.New("consumertest: a second run in the consumer whose handler is stuck")
			}
			fence, _ := fenceFrom(ctx)
			entered <- fence
			<-release // ignores ctx
			close(returned)
			return nil
		})
		var releaseOnce sync.Once
		unstick := func() { releaseOnce.Do(func() { close(release) }) }
		t.Cleanup(unstick) // runs before the harness's own stop at cleanup
		h.Publish(t, "stuck", []byte("a"))
		fence := waitRecv(t, "the handler", entered)
		stopped := make(chan struct{})
		stopping := time.Now()
		go func() { stop(); close(stopped) }()
		waitRecv(t, "Run's return while the handler ignores its context (a consumer that waits for the handler never returns)", stopped)
		t.Logf("Run returned %v after it was told to stop (shutdown timeout 100ms), its handler still running", time.Since(stopping).Round(time.Millisecond))
		select {
		case <-returned:
			t.Fatal("the handler returned before it was released")
		default:
		}
		if st := stats(); st.Processed != 0 || st.Abandoned != 1 || st.Retried != 1 {
			t.Errorf("stats after Run returned: %+v, want 1 abandoned and retried, 0 processed", st)
		}
		rec, err := adapterkit.Store(exec).Get(t.Context(), key.Digest())
		if err != nil || rec.State != storekit.StateInProgress || rec.Fence != fence {
			t.Fatalf("record after Run returned: %v fence %d (%v), want IN_PROGRESS under the stuck handler's fence %d (left to its lease)", rec.State, rec.Fence, err, fence)
		}
		leaseUntil := rec.LeaseUntil

		// The handler returns now, with success, after Run returned.
		unstick()
		waitRecv(t, "the stuck handler's return", returned)
		// The lease ends without an extension: the heartbeat stopped.
		waitFor(t, "the end of the stuck handler's lease", func() bool {
			rec, err = adapterkit.Store(exec).Get(t.Context(), key.Digest())
			return err != nil || rec.State != storekit.StateInProgress || rec.Now.After(leaseUntil)
		})
		if err != nil || rec.State != storekit.StateInProgress || rec.Fence != fence || !rec.LeaseUntil.Equal(leaseUntil) {
			t.Fatalf("record once the lease ended: %v fence %d lease until %v (%v), want IN_PROGRESS, fence %d, lease until %v: the late return completed nothing and nothing extended the lease",
				rec.State, rec.Fence, rec.LeaseUntil, err, fence, leaseUntil)
		}
		if st := stats(); st.Processed != 0 {
			t.Errorf("stats after the late return: %+v, want 0 processed", st)
		}

		// The next consumer gets the message and takes the key over.
		var mu sync.Mutex
		var fences []int64
		stats2, stop2 := h.Start(t, opts, func(ctx context.Context, k string, payload []byte) error {
			f, _ := fenceFrom(ctx)
			mu.Lock()
			fences = append(fences, f)
			mu.Unlock()
			return nil
		})
		defer stop2()
		waitFor(t, "the message's redelivery (an adapter that acked it loses it)", func() bool {
			st := stats2()
			return st.Processed+st.Replayed == 1
		})
		if st := stats2(); st.Processed != 1 {
			t.Errorf("next consumer: %+v, want the message processed (a replay means the late return completed the key)", st)
		}
		mu.Lock()
		defer mu.Unlock()
		if len(fences) != 1 || fences[0] <= fence {
			t.Errorf("next consumer's runs had fences %v, want one above the stuck handler's %d", fences, fence)
		}
		rec, err = adapterkit.Store(exec).Get(t.Context(), key.Digest())
		if err != nil || rec.State != storekit.StateCompleted || len(fences) == 1 && rec.Fence != fences[0] {
			t.Errorf("record at the end: %v fence %d (%v), want COMPLETED under the next consumer's fence %v", rec.State, rec.Fence, err, fences)
		}
	})
}

// runs counts handler runs per key.
type runs struct {
	mu sync.Mutex
	n  map[string]int
}

func newRuns() *runs { return &runs{n: map[string]int{}} }

func (r *runs) handler(fail func(key string) error) Handler {
	return func(ctx context.Context, key string, payload []byte) error {
		r.mu.Lock()
		r.n[key]++
		r.mu.Unlock()
		if _, ok := fenceFrom(ctx); !ok {
			return errors.New("consumertest: no fence in the handler's context")
		}
		if fail != nil {
			return fail(key)
		}
		return nil
	}
}

// wrap returns h preceded by f: f's error ends the run.
func (h Handler) wrap(f func(ctx context.Context) error) Handler {
	return func(ctx context.Context, key string, payload []byte) error {
		if err := f(ctx); err != nil {
			return err
		}
		return h(ctx, key, payload)
	}
}

func (r *runs) count(key string) int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.n[key]
}

func (r *runs) total() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	n := 0
	for _, c := range r.n {
		n += c
	}
	return n
}

// waitRecv waits for a value from c, or its close, for at most 20s, and
// returns it.
func waitRecv[T any](t *testing.T, what string, c <-chan T) T {
	t.Helper()
	var v T
	waitFor(t, what, func() bool {
		select {
		case v = <-c:
			return true
		default:
			return false
		}
	})
	return v
}

// waitFor waits for cond, checked every 10ms, for at most 20s.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after 20s waiting for %s", what)
		}
		time.Sleep(10 * time.Millisecond)
	}
}
