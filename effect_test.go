package idem_test

import (
	"context"
	"crypto/aes"
	"crypto/cipher"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/idemgo/idem"
	"github.com/idemgo/idem/adapterkit"
	"github.com/idemgo/idem/memstore"

	"github.com/idemgo/idem/storekit"
)

// effectStore is an EffectStore on memstore for the Executor's tests: an
// effect is a Go function, applied under a lock with the completion. The
// real atomic store is redisstore (its tests run on Redis).
type effectStore struct {
	*memstore.Store
	mu      sync.Mutex
	effects map[string]func(e idem.Effect) error
	applied []idem.Effect
	// lostReplies makes that many CompleteEffect calls report an unknown
	// outcome after they completed.
	lostReplies int
	calls       int
}

func (s *effectStore) CheckEffect(key string, e idem.Effect) error {
	if _, ok := s.effects[e.Name]; !ok {
		return errors.Join(idem.ErrInvalid, errors.New("unknown effect "+e.Name))
	}
	return nil
}

func (s *effectStore) CompleteEffect(ctx context.Context, key string, lease idem.Lease, result []byte, retention time.Duration, e idem.Effect) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.calls++
	err := s.completeEffect(ctx, key, lease, result, retention, e)
	if err == nil && s.lostReplies > 0 {
		s.lostReplies--
		return errors.New("connection reset")
	}
	return err
}

func (s *effectStore) completeEffect(ctx context.Context, key string, lease idem.Lease, result []byte, retention time.Duration, e idem.Effect) error {
	rec, err := s.Get(ctx, key)
	if err != nil {
		return err
	}
	if rec.State == storekit.StateCompleted && rec.Fence == lease.Fence {
		return nil // a repetition: applied already
	}
	if rec.State != storekit.StateInProgress || rec.Owner != lease.Owner || rec.Fence != lease.Fence {
		return idem.ErrLeaseLost
	}
	if err := s.effects[e.Name](e); err != nil {
		if errors.Is(err, errWrote) {
			// As redisstore does: the key ends FAILED in the same call.
			if _, ferr := s.Fail(ctx, key, lease, storekit.Failure{Result: e.PartialResult(), Terminal: true, Retention: retention}); ferr != nil {
				return ferr
			}
			return &storekit.EffectError{Name: e.Name, Message: err.Error(), Partial: true}
		}
		return &storekit.EffectError{Name: e.Name, Message: err.Error()}
	}
	s.applied = append(s.applied, e)
	return s.Complete(ctx, key, lease, result, retention)
}

// errWrote is the error of an effect that failed after it wrote.
var errWrote = errors.New("wrote")

func newEffectExec(t *testing.T, opts ...idem.Option) (*idem.Executor, *effectStore) {
	t.Helper()
	m, err := memstore.New()
	if err != nil {
		t.Fatal(err)
	}
	s := &effectStore{Store: m, effects: map[string]func(idem.Effect) error{
		"ok":   func(idem.Effect) error { return nil },
		"fail": func(idem.Effect) error { return errors.New("out of stock") },
		"half": func(idem.Effect) error { return fmt.Errorf("%w, then WRONGTYPE", errWrote) },
	}}
	exec, err := idem.New(s, opts...)
	if err != nil {
		t.Fatal(err)
	}
	return exec, s
}

func TestSetEffectOutsideAttempt(t *testing.T) {
	if err := idem.SetEffect(t.Context(), idem.Effect{Name: "ok"}); !errors.Is(err, idem.ErrInvalid) {
		t.Fatalf("got %v, want ErrInvalid", err)
	}
}

func TestSetEffectStoreWithoutEffects(t *testing.T) {
	exec, _ := newExec(t)
	_, err := exec.Do(t.Context(), idem.Key{ID: "k"}, "", func(ctx context.Context) ([]byte, error) {
		return nil, idem.SetEffect(ctx, idem.Effect{Name: "ok"})
	})
	if !errors.Is(err, idem.ErrInvalid) {
		t.Fatalf("got %v, want ErrInvalid", err)
	}
}

func TestDoAppliesEffectWithCompletion(t *testing.T) {
	exec, s := newEffectExec(t)
	for range 3 {
		res, err := exec.Do(t.Context(), idem.Key{ID: "k"}, "", func(ctx context.Context) ([]byte, error) {
			keys := []string{"a"}
			if err := idem.SetEffect(ctx, idem.Effect{Name: "ok", Keys: keys, Args: []string{"1"}}); err != nil {
				return nil, err
			}
			keys[0] = "changed after SetEffect"
			return []byte("v"), nil
		})
		if err != nil || string(res.Value) != "v" {
			t.Fatalf("Do: got %q, %v", res.Value, err)
		}
	}
	if len(s.applied) != 1 || s.applied[0].Keys[0] != "a" {
		t.Fatalf("applied: got %+v, want the one effect as set", s.applied)
	}
}

func TestSetEffectUnknownName(t *testing.T) {
	exec, _ := newEffectExec(t)
	_, err := exec.Do(t.Context(), idem.Key{ID: "k"}, "", func(ctx context.Context) ([]byte, error) {
		return nil, idem.SetEffect(ctx, idem.Effect{Name: "nope"})
	})
	if !errors.Is(err, idem.ErrInvalid) {
		t.Fatalf("got %v, want ErrInvalid", err)
	}
}

func TestEffectDroppedWhenOperationFails(t *testing.T) {
	exec, s := newEffectExec(t)
	boom := errors.New("boom")
	_, err := exec.Do(t.Context(), idem.Key{ID: "k"}, "", func(ctx context.Context) ([]byte, error) {
		if err := idem.SetEffect(ctx, idem.Effect{Name: "ok"}); err != nil {
			return nil, err
		}
		return nil, boom
	})
	if !errors.Is(err, boom) {
		t.Fatalf("got %v, want boom", err)
	}
	if len(s.applied) != 0 || s.calls != 0 {
		t.Fatalf("got %d effects applied in %d calls, want none", len(s.applied), s.calls)
	}
}

func TestFailingEffectReleasesOrFails(t *testing.T) {
	for _, terminal := range []bool{false, true} {
		t.Run(map[bool]string{false: "retryable", true: "terminal"}[terminal], func(t *testing.T) {
			var opts []idem.Option
			if terminal {
				opts = append(opts, idem.WithFailurePolicy(func(err error) bool { return errors.Is(err, idem.ErrEffect) }))
			}
			exec, s := newEffectExec(t, opts...)
			key := idem.Key{ID: "k"}
			_, err := exec.Do(t.Context(), key, "", func(ctx context.Context) ([]byte, error) {
				return []byte("v"), idem.SetEffect(ctx, idem.Effect{Name: "fail"})
			})
			var ee *storekit.EffectError
			if !errors.As(err, &ee) || ee.Name != "fail" || ee.Message != "out of stock" {
				t.Fatalf("got %v, want an *storekit.EffectError", err)
			}
			if idem.IsTerminal(err) != terminal {
				t.Fatalf("IsTerminal: got %v, want %v", idem.IsTerminal(err), terminal)
			}
			if s.calls != 1 {
				t.Fatalf("got %d CompleteEffect calls, want 1 (an effect error is not repeated)", s.calls)
			}
			rec, err := s.Get(t.Context(), key.Digest())
			want := storekit.StateReleased
			if terminal {
				want = storekit.StateFailed
			}
			if err != nil || rec.State != want {
				t.Fatalf("record: got %v, %v, want %v", rec.State, err, want)
			}
		})
	}
}

// TestPartialEffectFailsTheKey: an effect that failed after it wrote
// (the store answers ErrEffectPartial, having ended the key FAILED with
// the effect's PartialResult) is terminal whatever the failure policy, and
// later calls get a *FailedError saying the effect may have partly
// applied; the operation runs once.
func TestPartialEffectFailsTheKey(t *testing.T) {
	block, err := aes.NewCipher(make([]byte, 32))
	if err != nil {
		t.Fatal(err)
	}
	aead, err := cipher.NewGCM(block)
	if err != nil {
		t.Fatal(err)
	}
	for _, opts := range [][]idem.Option{nil, {idem.WithEncryption(aead)}} {
		exec, s := newEffectExec(t, opts...)
		key := idem.Key{ID: "k"}
		runs := 0
		for i := range 3 {
			_, err := exec.Do(t.Context(), key, "", func(ctx context.Context) ([]byte, error) {
				runs++
				return []byte("v"), idem.SetEffect(ctx, idem.Effect{Name: "half"})
			})
			var fe *idem.FailedError
			switch {
			case i == 0 && (!errors.Is(err, idem.ErrEffectPartial) || !errors.Is(err, idem.ErrEffect) || !idem.IsTerminal(err)):
				t.Fatalf("first Do: got %v, want a terminal ErrEffectPartial", err)
			case i > 0 && (!errors.As(err, &fe) || !strings.Contains(fe.Message, "effect half failed after it wrote (it may have partly applied)")):
				t.Fatalf("Do #%d: got %v, want a *FailedError that says the effect may have partly applied", i+1, err)
			}
		}
		if runs != 1 || s.calls != 1 {
			t.Fatalf("%d runs and %d completion calls, want 1 and 1", runs, s.calls)
		}
	}
}

func TestEffectCompletionRepeatedAfterLostReply(t *testing.T) {
	exec, s := newEffectExec(t)
	s.lostReplies = 2
	_, err := exec.Do(t.Context(), idem.Key{ID: "k"}, "", func(ctx context.Context) ([]byte, error) {
		return []byte("v"), idem.SetEffect(ctx, idem.Effect{Name: "ok"})
	})
	if err != nil {
		t.Fatal(err)
	}
	if s.calls != 3 || len(s.applied) != 1 {
		t.Fatalf("got %d calls and %d effects, want 3 calls and 1 effect", s.calls, len(s.applied))
	}
}

func TestCommitBatchAppliesEffects(t *testing.T) {
	exec, s := newEffectExec(t)
	began := adapterkit.BeginBatch(t.Context(), exec, []idem.Key{{ID: "a"}, {ID: "b"}}, []string{"", ""})
	attempts := make([]*idem.Attempt, len(began))
	for i, b := range began {
		if b.Err != nil {
			t.Fatal(b.Err)
		}
		attempts[i] = b.Attempt
	}
	if err := idem.SetEffect(began[0].Ctx, idem.Effect{Name: "ok", Keys: []string{"x"}}); err != nil {
		t.Fatal(err)
	}
	for i, err := range adapterkit.CommitBatch(t.Context(), exec, attempts, [][]byte{[]byte("1"), []byte("2")}) {
		if err != nil {
			t.Fatalf("CommitBatch[%d]: %v", i, err)
		}
	}
	if len(s.applied) != 1 {
		t.Fatalf("got %d effects applied, want 1", len(s.applied))
	}
	if err := idem.SetEffect(began[1].Ctx, idem.Effect{Name: "ok"}); !errors.Is(err, idem.ErrLeaseLost) {
		t.Fatalf("SetEffect after the commit: got %v, want ErrLeaseLost", err)
	}
}

// TestCommitBatchWithPassesEffects: a commit hook gets each attempt's
// effect with its completion, and an effect error it answers ends the
// attempt as Commit would (released by the default policy).
func TestCommitBatchWithPassesEffects(t *testing.T) {
	exec, s := newEffectExec(t)
	began := adapterkit.BeginBatch(t.Context(), exec, []idem.Key{{ID: "a"}, {ID: "b"}, {ID: "c"}}, []string{"", "", ""})
	attempts := make([]*idem.Attempt, len(began))
	for i, b := range began {
		if b.Err != nil {
			t.Fatal(b.Err)
		}
		attempts[i] = b.Attempt
	}
	for i, name := range []string{"ok", "fail"} {
		if err := idem.SetEffect(began[i].Ctx, idem.Effect{Name: name}); err != nil {
			t.Fatal(err)
		}
	}
	var got []string
	errs := adapterkit.CommitBatchWith(t.Context(), exec, attempts, make([][]byte, 3), func(ctx context.Context, cs []storekit.BatchCompletion) []error {
		out := make([]error, len(cs))
		for k, c := range cs {
			if c.Effect == nil {
				got = append(got, "")
				out[k] = s.Complete(ctx, c.Key, c.Lease, c.Result, c.Retention)
				continue
			}
			got = append(got, c.Effect.Name)
			out[k] = s.CompleteEffect(ctx, c.Key, c.Lease, c.Result, c.Retention, *c.Effect)
		}
		return out
	})
	if want := []string{"ok", "fail", ""}; !slices.Equal(got, want) {
		t.Fatalf("effects passed: got %q, want %q", got, want)
	}
	if errs[0] != nil || !errors.Is(errs[1], idem.ErrEffect) || errs[2] != nil {
		t.Fatalf("errors: got %v, want nil, an effect error, nil", errs)
	}
	for i, want := range []storekit.State{storekit.StateCompleted, storekit.StateReleased, storekit.StateCompleted} {
		rec, err := s.Get(t.Context(), attempts[i].Key())
		if err != nil || rec.State != want {
			t.Fatalf("record %d: got %v, %v, want %v", i, rec.State, err, want)
		}
	}
}

// A wrapper that unwraps to an EffectStore keeps its effects: SetEffect
// and the completion find the store beneath it.
func TestEffectThroughWrapper(t *testing.T) {
	_, s := newEffectExec(t)
	exec, err := idem.New(unwrapping{wrapped{s}})
	if err != nil {
		t.Fatal(err)
	}
	res, err := exec.Do(t.Context(), idem.Key{ID: "k"}, "", func(ctx context.Context) ([]byte, error) {
		return []byte("v"), idem.SetEffect(ctx, idem.Effect{Name: "ok", Keys: []string{"a"}})
	})
	if err != nil || string(res.Value) != "v" {
		t.Fatalf("Do: got %q, %v", res.Value, err)
	}
	if len(s.applied) != 1 || s.applied[0].Name != "ok" {
		t.Fatalf("applied: got %+v, want the one effect", s.applied)
	}
}
