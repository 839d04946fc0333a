package idem_test

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idemgo/idem"
	"github.com/idemgo/idem/adapterkit"
	"github.com/idemgo/idem/memstore"
	"github.com/idemgo/idem/observe"

	"github.com/idemgo/idem/storekit"
)

// errNet stands for a network error: the call's outcome is unknown.
var errNet = errors.New("read tcp: connection reset by peer")

// lossy is a memstore whose ending calls (Complete, CompleteBatch, Fail,
// Release) fail with errNet for the first n calls: when replyLost, after the
// store applied them (the reply was lost), otherwise before (the request was
// lost).
type lossy struct {
	*memstore.Store
	n         atomic.Int64
	replyLost bool
	calls     atomic.Int64

	// acquireLost is how many Acquire calls lose their reply, after the
	// store applied them; acquires counts the Acquire calls.
	acquireLost atomic.Int64
	acquires    atomic.Int64
}

func (s *lossy) Acquire(ctx context.Context, key string, req storekit.AcquireRequest) (storekit.Acquisition, error) {
	s.acquires.Add(1)
	a, err := s.Store.Acquire(ctx, key, req)
	if s.acquireLost.Add(-1) >= 0 {
		return storekit.Acquisition{}, errNet
	}
	return a, err
}

func (s *lossy) lose(apply func() error) error {
	s.calls.Add(1)
	if s.n.Add(-1) < 0 {
		return apply()
	}
	if s.replyLost {
		_ = apply()
	}
	return errNet
}

func (s *lossy) Complete(ctx context.Context, key string, l idem.Lease, r []byte, ret time.Duration) error {
	return s.lose(func() error { return s.Store.Complete(ctx, key, l, r, ret) })
}

func (s *lossy) CompleteBatch(ctx context.Context, keys []string, ls []idem.Lease, rs [][]byte, ret time.Duration) []error {
	errs := make([]error, len(keys))
	for i := range keys {
		errs[i] = s.Complete(ctx, keys[i], ls[i], rs[i], ret)
	}
	return errs
}

func (s *lossy) AcquireBatch(ctx context.Context, keys []string, reqs []storekit.AcquireRequest) ([]storekit.Acquisition, []error) {
	acqs := make([]storekit.Acquisition, len(keys))
	errs := make([]error, len(keys))
	for i := range keys {
		acqs[i], errs[i] = s.Acquire(ctx, keys[i], reqs[i])
	}
	return acqs, errs
}

func (s *lossy) Fail(ctx context.Context, key string, l idem.Lease, f storekit.Failure) (storekit.State, error) {
	var st storekit.State
	err := s.lose(func() (err error) { st, err = s.Store.Fail(ctx, key, l, f); return err })
	return st, err
}

func (s *lossy) Release(ctx context.Context, key string, l idem.Lease, ret time.Duration) error {
	return s.lose(func() error { return s.Store.Release(ctx, key, l, ret) })
}

// TestEndingCallsAreRepeated loses the request or the reply of the call
// that ends an attempt, three times in a row: the executor repeats it with
// the same lease, so the key reaches its final state and the operation never
// runs a second time, also after the lease.
func TestEndingCallsAreRepeated(t *testing.T) {
	for _, replyLost := range []bool{false, true} {
		for _, end := range []string{"complete", "fail", "release", "commit batch"} {
			t.Run(fmt.Sprintf("%s/reply lost=%v", end, replyLost), func(t *testing.T) {
				var skew atomic.Int64 // the store's clock runs ahead by skew
				ms, err := memstore.New(memstore.WithClock(func() time.Time { return time.Now().Add(time.Duration(skew.Load())) }))
				if err != nil {
					t.Fatal(err)
				}
				s := &lossy{Store: ms, replyLost: replyLost}
				const lease = 500 * time.Millisecond
				e, err := idem.New(s, idem.WithLease(lease))
				if err != nil {
					t.Fatal(err)
				}
				key := idem.Key{ID: "k"}
				s.n.Store(3)
				var runs atomic.Int64
				fn := func(context.Context) ([]byte, error) {
					runs.Add(1)
					switch end {
					case "fail":
						return nil, idem.Terminal(errors.New("declined"))
					case "release":
						panic("boom")
					}
					return []byte("v"), nil
				}
				switch end {
				case "commit batch":
					b := adapterkit.BeginBatch(t.Context(), e, []idem.Key{key}, []string{""})
					if b[0].Err != nil {
						t.Fatal(b[0].Err)
					}
					runs.Add(1)
					if errs := adapterkit.CommitBatch(t.Context(), e, []*idem.Attempt{b[0].Attempt}, [][]byte{[]byte("v")}); errs[0] != nil {
						t.Fatalf("CommitBatch: %v", errs[0])
					}
				case "release":
					func() {
						defer func() { _ = recover() }()
						_, _ = e.Do(t.Context(), key, "", fn)
					}()
				default:
					_, err := e.Do(t.Context(), key, "", fn)
					if end == "complete" && err != nil {
						t.Fatalf("Do: %v", err)
					}
				}
				if got := s.calls.Load(); got != 4 {
					t.Fatalf("ending calls: %d, want 4 (three lost, then one answered)", got)
				}
				rec, err := ms.Get(t.Context(), key.Digest())
				if err != nil {
					t.Fatal(err)
				}
				want := map[string]storekit.State{"complete": storekit.StateCompleted, "commit batch": storekit.StateCompleted,
					"fail": storekit.StateFailed, "release": storekit.StateReleased}[end]
				if rec.State != want {
					t.Fatalf("state %v, want %v", rec.State, want)
				}
				if end == "release" {
					return // released: running again is what release is for
				}
				// After the lease, a new Do must not run the operation again.
				skew.Store(int64(2 * lease))
				_, _ = e.Do(t.Context(), key, "", fn)
				if got := runs.Load(); got != 1 {
					t.Fatalf("the operation ran %d times, want 1", got)
				}
			})
		}
	}
}

// TestEndingCallGivesUpAfterALease checks that the repetition is bounded: a
// store that never answers makes Do return the error after about one lease.
func TestEndingCallGivesUpAfterALease(t *testing.T) {
	ms, err := memstore.New()
	if err != nil {
		t.Fatal(err)
	}
	s := &lossy{Store: ms}
	s.n.Store(1 << 40)
	const lease = 300 * time.Millisecond
	e, err := idem.New(s, idem.WithLease(lease))
	if err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	_, err = e.Do(t.Context(), idem.Key{ID: "k"}, "", func(context.Context) ([]byte, error) { return nil, nil })
	if !errors.Is(err, errNet) {
		t.Fatalf("Do: %v, want the store's error", err)
	}
	if d := time.Since(start); d > 3*lease {
		t.Fatalf("Do returned after %v, want about one lease (%v)", d, lease)
	}
	if s.calls.Load() < 3 {
		t.Fatalf("the complete was sent %d times, want it repeated", s.calls.Load())
	}
	if storekit.OutcomeUnknown(nil) || storekit.OutcomeUnknown(idem.ErrLeaseLost) || !storekit.OutcomeUnknown(errNet) {
		t.Fatal("storekit.OutcomeUnknown misclassifies")
	}
}

// TestLostAcquireReplyIsRepeated loses the reply of an acquire that the
// store applied, twice: Begin repeats the acquire with the same owner and
// gets the key it took, instead of leaving it held by nobody until the
// lease ends; Do runs the operation once and completes.
func TestLostAcquireReplyIsRepeated(t *testing.T) {
	ms, err := memstore.New()
	if err != nil {
		t.Fatal(err)
	}
	s := &lossy{Store: ms}
	s.acquireLost.Store(2)
	e, err := idem.New(s, idem.WithLease(time.Minute))
	if err != nil {
		t.Fatal(err)
	}
	runs := 0
	r, err := e.Do(t.Context(), idem.Key{ID: "k"}, "", func(ctx context.Context) ([]byte, error) {
		runs++
		return []byte("v"), nil
	})
	if err != nil || runs != 1 || r.Replayed {
		t.Fatalf("Do: %+v, %v, %d runs; want one run and success", r, err, runs)
	}
	if got := s.acquires.Load(); got != 3 {
		t.Fatalf("acquires: %d, want 3 (two replies lost)", got)
	}
	rec, err := ms.Get(t.Context(), idem.Key{ID: "k"}.Digest())
	if err != nil || rec.State != storekit.StateCompleted || rec.Fence != r.Fence {
		t.Fatalf("record %+v, %v; want COMPLETED with fence %d", rec, err, r.Fence)
	}
}

// TestAcquireOnAStoreDownFailsFast checks that the repetition of a lost
// acquire is short: with every reply lost, Begin returns the store's error
// after a few quick repetitions, not after a lease.
func TestAcquireOnAStoreDownFailsFast(t *testing.T) {
	ms, err := memstore.New()
	if err != nil {
		t.Fatal(err)
	}
	s := &lossy{Store: ms}
	s.acquireLost.Store(1 << 40)
	e, err := idem.New(s, idem.WithLease(time.Minute))
	if err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	_, _, err = e.Begin(t.Context(), idem.Key{ID: "k"}, "")
	if !errors.Is(err, errNet) {
		t.Fatalf("Begin: %v, want the store's error", err)
	}
	if d := time.Since(start); d > 2*time.Second {
		t.Fatalf("Begin returned after %v, want within about 70ms", d)
	}
	if got := s.acquires.Load(); got != 4 {
		t.Fatalf("acquires: %d, want 4 (the call and three repetitions)", got)
	}
}

// TestLostBatchAcquireRepliesAreRepeated loses the replies of the first
// three acquisitions of a batch of five, after the store applied them:
// BeginBatch repeats those with the same owners and every key is acquired.
func TestLostBatchAcquireRepliesAreRepeated(t *testing.T) {
	ms, err := memstore.New()
	if err != nil {
		t.Fatal(err)
	}
	s := &lossy{Store: ms}
	s.acquireLost.Store(3)
	e, err := idem.New(s, idem.WithLease(time.Minute))
	if err != nil {
		t.Fatal(err)
	}
	keys := make([]idem.Key, 5)
	for i := range keys {
		keys[i] = idem.Key{ID: fmt.Sprint("b", i)}
	}
	began := adapterkit.BeginBatch(t.Context(), e, keys, make([]string, len(keys)))
	for i, b := range began {
		if b.Err != nil || b.Attempt == nil || b.Attempt.Replayed() {
			t.Fatalf("key %d: %+v; want it acquired", i, b)
		}
		_ = b.Attempt.Abandon(t.Context(), observe.Abandoned)
	}
	if got := s.acquires.Load(); got != 8 {
		t.Fatalf("acquires: %d, want 8 (five, then the three lost again)", got)
	}
}

// TestRepeatUnknown checks repeatUnknown: the whole batch first
// (idx nil), then only the elements whose outcome is unknown, until each
// has a definite answer; and no longer than d when one never gets one.
func TestRepeatUnknown(t *testing.T) {
	unknownLeft := map[int]int{1: 2, 3: 1} // element → unknown answers before a definite one
	var calls [][]int
	errs := idem.RepeatUnknown(t.Context(), time.Minute, func(idx []int) []error {
		calls = append(calls, idx)
		if idx == nil {
			idx = []int{0, 1, 2, 3}
		}
		out := make([]error, len(idx))
		for k, i := range idx {
			switch {
			case unknownLeft[i] > 0:
				unknownLeft[i]--
				out[k] = errNet
			case i == 2:
				out[k] = idem.ErrLeaseLost
			}
		}
		return out
	})
	if fmt.Sprint(calls) != "[[] [1 3] [1]]" {
		t.Fatalf("calls %v, want the batch, then [1 3], then [1]", calls)
	}
	if errs[0] != nil || errs[1] != nil || !errors.Is(errs[2], idem.ErrLeaseLost) || errs[3] != nil {
		t.Fatalf("errors %v", errs)
	}
	start := time.Now()
	errs = idem.RepeatUnknown(t.Context(), 200*time.Millisecond, func(idx []int) []error { return []error{errNet} })
	if !errors.Is(errs[0], errNet) || time.Since(start) > 2*time.Second {
		t.Fatalf("never answered: %v after %v, want the error after about 200ms", errs, time.Since(start))
	}
}
