package netfault

import (
	"context"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idemgo/idem"
	"github.com/idemgo/idem/chaos/chaostest"
	"github.com/idemgo/idem/storekit"
)

// callTimeout bounds a store call made while the proxy swallows its reply.
const callTimeout = time.Second

// TestLostReplyResolvedByRetry is scenario 5's key property: an operation
// whose reply was lost is resolved by repeating the call with the same
// owner, never by executing twice. Through each client library:
//
//   - acquire, reply lost: the proxy swallows what Redis sends back, the
//     Acquire fails, the record is IN_PROGRESS with the caller's owner (read
//     directly); repeated with the same owner once healed, it returns
//     Acquired with the same fence.
//   - complete, reply lost: the same for Complete; the record is COMPLETED
//     and the repeated Complete succeeds.
//   - Do, complete reply lost: the proxy swallows the reply of the Complete
//     that Do sends after the handler ran; Do fails; the next Do replays the
//     result. The handler ran once.
//   - Do, complete request lost: the proxy swallows the Complete request
//     itself (the outcome is just as unknown to the caller); Do fails; the
//     next Do calls, once the network healed, must get the result without
//     running the handler again: the Executor must repeat Complete with the
//     same lease rather than leave the key to be taken over after the lease.
func TestLostReplyResolvedByRetry(t *testing.T) {
	total := &chaostest.Counters{}
	var takeovers atomic.Int64
	for _, c := range clients {
		t.Run(c.name, func(t *testing.T) {
			t.Run("acquire reply lost", func(t *testing.T) { storeAcquireReplyLost(t, c) })
			t.Run("complete reply lost", func(t *testing.T) { storeCompleteReplyLost(t, c) })
			t.Run("Do complete reply lost", func(t *testing.T) { doCompleteLost(t, c, "downstream", total, &takeovers) })
			t.Run("Do complete request lost", func(t *testing.T) { doCompleteLost(t, c, "upstream", total, &takeovers) })
		})
	}
	chaostest.Report(t, "lost reply resolved by retry", command("TestLostReplyResolvedByRetry"), total, map[string]string{
		"store_calls_repeated": fmt.Sprint(2 * len(clients)),
		"takeovers_after_loss": fmt.Sprint(takeovers.Load()),
	})
}

func storeAcquireReplyLost(t *testing.T, c client) {
	r := newRig(t, c)
	ctx := t.Context()
	key := idem.Key{Scope: "netfault", ID: "acquire-reply-lost"}.Digest()
	req := storekit.AcquireRequest{Fingerprint: "fp", Owner: "owner-1", Lease: time.Minute, Retention: time.Hour}

	toxic := r.proxy.AddToxic(t, "timeout", "downstream", map[string]any{"timeout": 0})
	cctx, cancel := context.WithTimeout(ctx, callTimeout)
	_, err := r.store.Acquire(cctx, key, req)
	cancel()
	if err == nil {
		t.Fatal("Acquire succeeded although its reply was swallowed")
	}
	rec, err := r.direct.Get(ctx, key)
	if err != nil || rec.State != storekit.StateInProgress || rec.Owner != req.Owner {
		t.Fatalf("record after the lost reply: %+v, %v; want IN_PROGRESS owned by %s (the script ran)", rec, err, req.Owner)
	}
	r.proxy.RemoveToxic(t, toxic)

	a := retry(t, func(ctx context.Context) (storekit.Acquisition, error) { return r.store.Acquire(ctx, key, req) })
	if a.Outcome != storekit.Acquired || a.Lease.Fence != rec.Fence || a.Attempts != 1 {
		t.Errorf("repeated Acquire: got %v fence %d attempts %d, want acquired fence %d attempts 1", a.Outcome, a.Lease.Fence, a.Attempts, rec.Fence)
	}
	// Another owner still finds the key in progress: the lost reply did not
	// free it.
	other := req
	other.Owner = "owner-2"
	if b, err := r.direct.Acquire(ctx, key, other); err != nil || b.Outcome != storekit.InProgress {
		t.Errorf("another owner's Acquire: got %v, %v; want in-progress", b.Outcome, err)
	}
}

func storeCompleteReplyLost(t *testing.T, c client) {
	r := newRig(t, c)
	ctx := t.Context()
	key := idem.Key{Scope: "netfault", ID: "complete-reply-lost"}.Digest()
	a, err := r.store.Acquire(ctx, key, storekit.AcquireRequest{Fingerprint: "fp", Owner: "owner-1", Lease: time.Minute, Retention: time.Hour})
	if err != nil || a.Outcome != storekit.Acquired {
		t.Fatalf("Acquire: %v, %v", a.Outcome, err)
	}
	result := []byte("the result")

	toxic := r.proxy.AddToxic(t, "timeout", "downstream", map[string]any{"timeout": 0})
	cctx, cancel := context.WithTimeout(ctx, callTimeout)
	err = r.store.Complete(cctx, key, a.Lease, result, time.Hour)
	cancel()
	if err == nil {
		t.Fatal("Complete succeeded although its reply was swallowed")
	}
	rec, err := r.direct.Get(ctx, key)
	if err != nil || rec.State != storekit.StateCompleted || string(rec.Result) != string(result) {
		t.Fatalf("record after the lost reply: %v %q, %v; want COMPLETED (the script ran)", rec.State, rec.Result, err)
	}
	r.proxy.RemoveToxic(t, toxic)

	retry(t, func(ctx context.Context) (struct{}, error) {
		return struct{}{}, r.store.Complete(ctx, key, a.Lease, result, time.Hour)
	})
}

// doCompleteLost runs Do on a key whose Complete is swallowed on stream
// (downstream: the reply; upstream: the request), heals the network and
// calls Do again until it is acknowledged. The handler must have run once.
func doCompleteLost(t *testing.T, c client, stream string, total *chaostest.Counters, takeovers *atomic.Int64) {
	r := newRig(t, c)
	ctx := t.Context()
	const lease = 500 * time.Millisecond
	exec, err := idem.New(r.store, idem.WithLease(lease))
	if err != nil {
		t.Fatal(err)
	}
	key := idem.Key{Scope: "netfault", ID: "do-complete-lost-" + stream}
	var counters chaostest.Counters
	var executed atomic.Int64
	var fences []int64
	fn := func(ctx context.Context) ([]byte, error) {
		fence, _ := idem.FenceFrom(ctx)
		fences = append(fences, fence)
		counters.Executed.Add(1)
		if executed.Add(1) == 1 {
			// Lose what Do sends (or receives) next: the Complete. The
			// network heals within a quarter of the lease.
			r.proxy.AddToxic(t, "timeout", stream, map[string]any{"timeout": 0})
			time.AfterFunc(lease/4, r.proxy.ResetToxics)
		}
		return []byte("charged"), nil
	}

	// Do may fail (its Complete's outcome unknown) or, if it repeats the
	// Complete once the network healed, succeed; the caller repeats it with
	// the same key until it gets an answer.
	counters.Attempted.Add(1)
	deadline := time.Now().Add(10 * lease)
	for {
		cctx, cancel := context.WithTimeout(ctx, callTimeout)
		res, err := exec.Do(cctx, key, "fp", fn)
		cancel()
		if err == nil {
			counters.Acknowledged.Add(1)
			if string(res.Value) != "charged" {
				t.Errorf("result: got %q, want %q", res.Value, "charged")
			}
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("no answer within %v: %v", 10*lease, err)
		}
		wait(ctx, 20*time.Millisecond)
	}
	if len(fences) > 1 {
		takeovers.Add(int64(len(fences) - 1))
	}
	// The fenced sink accepts every fence above the last one, so each
	// execution is an effect.
	counters.Effects.Store(executed.Load())
	counters.Duplicated.Store(max(0, executed.Load()-1))
	merge(total, &counters)
	if n := executed.Load(); n != 1 {
		t.Errorf("the handler ran %d times (fences %v), want 1: the Executor did not resolve its lost Complete by repeating it with the same lease, and the key was taken over once the lease ended", n, fences)
	}
}

// retry repeats call (a store call with the same arguments) until it
// succeeds, for at most 10s; the proxy has healed, but the client may need
// a moment to reconnect.
func retry[T any](t *testing.T, call func(ctx context.Context) (T, error)) T {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		ctx, cancel := context.WithTimeout(t.Context(), callTimeout)
		v, err := call(ctx)
		cancel()
		if err == nil {
			return v
		}
		if time.Now().After(deadline) {
			t.Fatalf("repeated call still failing after 10s: %v", err)
		}
		wait(t.Context(), 20*time.Millisecond)
	}
}
