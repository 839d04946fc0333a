package idem_test

import (
	"context"
	"testing"

	"github.com/idemgo/idem"
	"github.com/idemgo/idem/adapterkit"
	"github.com/idemgo/idem/memstore"
)

// TestAttemptFrom: the operation's context carries its attempt, with the
// fingerprint it was acquired with, from Do and from BeginBatch.
func TestAttemptFrom(t *testing.T) {
	ms, _ := memstore.New()
	e, err := idem.New(ms)
	if err != nil {
		t.Fatal(err)
	}
	if _, ok := idem.AttemptFrom(t.Context()); ok {
		t.Fatal("AttemptFrom outside an attempt: ok")
	}
	key := idem.Key{Scope: "s", ID: "a"}
	_, err = e.Do(t.Context(), key, "fp-a", func(ctx context.Context) ([]byte, error) {
		a, ok := idem.AttemptFrom(ctx)
		if !ok || a.Key() != key.Digest() || a.Fingerprint() != "fp-a" || a.Executor() != e {
			t.Errorf("AttemptFrom in Do: got %v, %+v", ok, a)
		}
		return nil, nil
	})
	if err != nil {
		t.Fatal(err)
	}
	bs := adapterkit.BeginBatch(t.Context(), e, []idem.Key{{Scope: "s", ID: "b"}}, []string{"fp-b"})
	a, ok := idem.AttemptFrom(bs[0].Ctx)
	if !ok || a != bs[0].Attempt || a.Fingerprint() != "fp-b" {
		t.Fatalf("AttemptFrom after BeginBatch: got %v, %+v", ok, a)
	}
	_ = a.Release(t.Context())
}
