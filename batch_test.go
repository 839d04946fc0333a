package idem_test

import (
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/idemgo/idem"
	"github.com/idemgo/idem/adapterkit"
	"github.com/idemgo/idem/memstore"
	"github.com/idemgo/idem/storekit"
)

func TestBatch(t *testing.T) {
	e, _ := newExec(t)
	ctx := t.Context()
	if _, err := e.Do(ctx, idem.Key{ID: "done"}, "", func(context.Context) ([]byte, error) { return []byte("old"), nil }); err != nil {
		t.Fatal(err)
	}
	keys := []idem.Key{{ID: "a"}, {ID: "done"}, {ID: "a"}, {ID: ""}, {ID: "b"}}
	fps := []string{"", "", "", "", strings.Repeat("f", storekit.MaxFingerprintLen+1)}
	began := adapterkit.BeginBatch(ctx, e, keys, fps)
	if began[0].Err != nil || began[0].Attempt == nil || began[0].Attempt.Replayed() {
		t.Fatalf("new key: got %+v", began[0])
	}
	if f, ok := idem.FenceFrom(began[0].Ctx); !ok || f != began[0].Attempt.Lease().Fence {
		t.Fatalf("the context of a batch attempt has fence %d, want %d", f, began[0].Attempt.Lease().Fence)
	}
	if began[1].Err != nil || !began[1].Attempt.Replayed() || string(began[1].Attempt.Value()) != "old" {
		t.Fatalf("completed key: got %+v", began[1])
	}
	if !errors.Is(began[2].Err, idem.ErrInProgress) {
		t.Fatalf("duplicate in the batch: got %v, want ErrInProgress", began[2].Err)
	}
	if !errors.Is(began[3].Err, idem.ErrInvalid) || !errors.Is(began[4].Err, idem.ErrInvalid) {
		t.Fatalf("bad input: got %v and %v, want ErrInvalid", began[3].Err, began[4].Err)
	}
	attempts := make([]*idem.Attempt, len(began))
	values := make([][]byte, len(began))
	for i, b := range began {
		attempts[i] = b.Attempt
		values[i] = []byte("new")
	}
	for i, err := range adapterkit.CommitBatch(ctx, e, attempts, values) {
		if err != nil {
			t.Fatalf("CommitBatch %d: %v", i, err)
		}
	}
	if began[0].Ctx.Err() == nil {
		t.Error("a committed attempt's context is still live")
	}
	// Committing again is refused for the committed one.
	if errs := adapterkit.CommitBatch(ctx, e, attempts[:1], values[:1]); !errors.Is(errs[0], idem.ErrLeaseLost) {
		t.Fatalf("second CommitBatch: got %v, want ErrLeaseLost", errs[0])
	}
	r, err := e.Do(ctx, idem.Key{ID: "a"}, "", func(context.Context) ([]byte, error) { t.Error("ran twice"); return nil, nil })
	if err != nil || !r.Replayed || string(r.Value) != "new" {
		t.Fatalf("replay after CommitBatch: got %+v, %v", r, err)
	}
	// Mismatched lengths.
	if b := adapterkit.BeginBatch(ctx, e, keys, nil); !errors.Is(b[0].Err, idem.ErrInvalid) {
		t.Fatalf("BeginBatch with missing fingerprints: got %v", b[0].Err)
	}
}

// TestBatchFallback runs the batch calls on a store without BatchStore.
func TestBatchFallback(t *testing.T) {
	s, _ := memstore.New()
	e, _ := idem.New(struct{ idem.Store }{s}) // hides AcquireBatch and CompleteBatch
	ctx := t.Context()
	began := adapterkit.BeginBatch(ctx, e, []idem.Key{{ID: "x"}, {ID: "x"}}, []string{"", ""})
	if began[0].Err != nil || !errors.Is(began[1].Err, idem.ErrInProgress) {
		t.Fatalf("fallback BeginBatch: got %v, %v", began[0].Err, began[1].Err)
	}
	if errs := adapterkit.CommitBatch(ctx, e, []*idem.Attempt{began[0].Attempt, nil}, [][]byte{[]byte("v"), nil}); errs[0] != nil || errs[1] != nil {
		t.Fatalf("fallback CommitBatch: %v", errs)
	}
	if rec, _ := s.Get(ctx, idem.Key{ID: "x"}.Digest()); rec.State != storekit.StateCompleted {
		t.Fatalf("record after fallback commit: got %v", rec.State)
	}
}
