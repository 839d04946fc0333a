package idem_test

import (
	"context"
	"crypto/aes"
	"crypto/cipher"
	"errors"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idemgo/idem"
	"github.com/idemgo/idem/adapterkit"
	"github.com/idemgo/idem/memstore"
	"github.com/idemgo/idem/observe"

	"github.com/idemgo/idem/storekit"
)

func newExec(t *testing.T, opts ...idem.Option) (*idem.Executor, *memstore.Store) {
	t.Helper()
	s, err := memstore.New()
	if err != nil {
		t.Fatal(err)
	}
	e, err := idem.New(s, opts...)
	if err != nil {
		t.Fatal(err)
	}
	return e, s
}

func TestDoRunsOnceAndReplays(t *testing.T) {
	e, _ := newExec(t)
	key := idem.Key{Scope: "charge", ID: "order-1"}
	var runs atomic.Int32
	fn := func(ctx context.Context) ([]byte, error) {
		runs.Add(1)
		fence, ok := idem.FenceFrom(ctx)
		if !ok || fence <= 0 {
			t.Errorf("FenceFrom: got %d, %v, want a positive fence", fence, ok)
		}
		if l, ok := idem.LeaseFrom(ctx); !ok || l.Owner == "" {
			t.Errorf("LeaseFrom: got owner %q, %v, want one", l.Owner, ok)
		}
		return []byte("charged"), nil
	}
	first, err := e.Do(t.Context(), key, "fp", fn)
	if err != nil || first.Replayed || string(first.Value) != "charged" || first.Fence <= 0 {
		t.Fatalf("first Do: got %+v, %v, want executed \"charged\" with a fence", first, err)
	}
	second, err := e.Do(t.Context(), key, "fp", fn)
	if err != nil || !second.Replayed || string(second.Value) != "charged" {
		t.Fatalf("second Do: got %+v, %v, want replayed \"charged\"", second, err)
	}
	if n := runs.Load(); n != 1 {
		t.Fatalf("fn ran %d times, want 1", n)
	}
	if _, err := e.Do(t.Context(), key, "other", fn); !errors.Is(err, idem.ErrMismatch) {
		t.Fatalf("Do with another fingerprint: got %v, want ErrMismatch", err)
	}
	// The same ID in another scope is another key.
	if r, err := e.Do(t.Context(), idem.Key{Scope: "refund", ID: "order-1"}, "fp", fn); err != nil || r.Replayed {
		t.Fatalf("Do in another scope: got %+v, %v, want an execution", r, err)
	}
	if _, ok := idem.FenceFrom(t.Context()); ok {
		t.Fatal("FenceFrom outside an attempt reported ok")
	}
}

func TestDoInProgress(t *testing.T) {
	e, _ := newExec(t)
	key := idem.Key{ID: "k"}
	started, release := make(chan struct{}), make(chan struct{})
	done := make(chan error)
	go func() {
		_, err := e.Do(t.Context(), key, "", func(ctx context.Context) ([]byte, error) {
			close(started)
			<-release
			return []byte("ok"), nil
		})
		done <- err
	}()
	<-started
	_, err := e.Do(t.Context(), key, "", func(context.Context) ([]byte, error) {
		t.Error("second fn ran while the first held the key")
		return nil, nil
	})
	var ip *idem.InProgressError
	if !errors.As(err, &ip) || !errors.Is(err, idem.ErrInProgress) || ip.RetryAfter <= 0 || ip.RetryAfter > adapterkit.DefaultLease {
		t.Fatalf("concurrent Do: got %v, want *InProgressError with RetryAfter in (0, %v]", err, adapterkit.DefaultLease)
	}
	// Await returns once the first completes.
	awaited := make(chan error)
	go func() { awaited <- e.Await(t.Context(), key) }()
	close(release)
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if err := <-awaited; err != nil {
		t.Fatalf("Await: %v", err)
	}
	if r, err := e.Do(t.Context(), key, "", nil); err == nil || r.Replayed {
		t.Fatalf("Do with nil fn: got %+v, %v, want ErrInvalid", r, err)
	}
}

func TestHeartbeatKeepsTheLease(t *testing.T) {
	const lease = 300 * time.Millisecond
	e, s := newExec(t, idem.WithLease(lease), idem.WithRetention(time.Hour))
	key := idem.Key{ID: "long"}
	var fence int64
	r, err := e.Do(t.Context(), key, "", func(ctx context.Context) ([]byte, error) {
		fence, _ = idem.FenceFrom(ctx)
		// Run for five leases; meanwhile nobody can take the key over.
		deadline := time.Now().Add(5 * lease)
		for time.Now().Before(deadline) {
			_, err := e.Do(t.Context(), key, "", func(context.Context) ([]byte, error) {
				t.Error("the key was taken over while its owner was alive")
				return nil, nil
			})
			if !errors.Is(err, idem.ErrInProgress) {
				t.Errorf("Do during a long operation: got %v, want ErrInProgress", err)
			}
			time.Sleep(lease / 4)
		}
		return []byte("done"), ctx.Err()
	})
	if err != nil || string(r.Value) != "done" {
		t.Fatalf("long Do: got %+v, %v", r, err)
	}
	rec, err := s.Get(t.Context(), key.Digest())
	if err != nil || rec.State != storekit.StateCompleted || rec.Fence != fence || rec.Attempts != 1 {
		t.Fatalf("record: got %+v, %v, want COMPLETED by fence %d in 1 attempt", rec, err, fence)
	}
}

func TestLeaseLostCancelsTheOperation(t *testing.T) {
	const lease = 30 * time.Millisecond
	e, s := newExec(t, idem.WithLease(lease), idem.WithRetention(time.Hour))
	key := idem.Key{ID: "lost"}
	var cause error
	_, err := e.Do(t.Context(), key, "", func(ctx context.Context) ([]byte, error) {
		// Force the key away from this owner, as an operator's rm would.
		if err := s.Delete(t.Context(), key.Digest()); err != nil {
			t.Fatal(err)
		}
		select {
		case <-ctx.Done():
			cause = context.Cause(ctx)
		case <-time.After(10 * time.Second):
			t.Fatal("the context was not cancelled after the lease was lost")
		}
		return []byte("too late"), nil
	})
	if !errors.Is(cause, idem.ErrLeaseLost) {
		t.Fatalf("context cause: got %v, want ErrLeaseLost", cause)
	}
	if !errors.Is(err, idem.ErrLeaseLost) {
		t.Fatalf("Do: got %v, want ErrLeaseLost", err)
	}
	if _, err := s.Get(t.Context(), key.Digest()); !errors.Is(err, storekit.ErrNotFound) {
		t.Fatalf("the lost owner's result was stored: Get got %v", err)
	}
}

func TestPanicReleasesTheKey(t *testing.T) {
	e, s := newExec(t)
	key := idem.Key{ID: "panics"}
	func() {
		defer func() {
			if r := recover(); r != "boom" {
				t.Fatalf("recovered %v, want the original panic", r)
			}
		}()
		e.Do(t.Context(), key, "", func(context.Context) ([]byte, error) { panic("boom") })
	}()
	rec, err := s.Get(t.Context(), key.Digest())
	if err != nil || rec.State != storekit.StateReleased {
		t.Fatalf("after a panic: got %+v, %v, want RELEASED", rec, err)
	}
	r, err := e.Do(t.Context(), key, "", func(context.Context) ([]byte, error) { return []byte("second try"), nil })
	if err != nil || r.Replayed || string(r.Value) != "second try" {
		t.Fatalf("Do after a panic: got %+v, %v, want an execution", r, err)
	}
}

func TestFailurePolicy(t *testing.T) {
	e, _ := newExec(t, idem.WithMaxAttempts(3))
	ctx := t.Context()
	retryable := errors.New("gateway timeout")
	key := idem.Key{ID: "flaky"}
	var runs int
	for i := range 3 {
		_, err := e.Do(ctx, key, "", func(context.Context) ([]byte, error) { runs++; return nil, retryable })
		if !errors.Is(err, retryable) {
			t.Fatalf("attempt %d: got %v, want the operation's error", i+1, err)
		}
	}
	_, err := e.Do(ctx, key, "", func(context.Context) ([]byte, error) { runs++; return nil, nil })
	var fe *idem.FailedError
	if !errors.As(err, &fe) || !fe.Replayed || fe.Message != retryable.Error() {
		t.Fatalf("after 3 attempts: got %v, want a replayed *FailedError with the last error", err)
	}
	if runs != 3 {
		t.Fatalf("runs: got %d, want 3", runs)
	}

	declined := idem.Terminal(errors.New("card declined"))
	key = idem.Key{ID: "declined"}
	if _, err := e.Do(ctx, key, "", func(context.Context) ([]byte, error) { return nil, declined }); !errors.Is(err, declined) || !idem.IsTerminal(err) {
		t.Fatalf("terminal failure: got %v, want the terminal error", err)
	}
	_, err = e.Do(ctx, key, "", func(context.Context) ([]byte, error) { t.Error("ran after a terminal failure"); return nil, nil })
	if !errors.As(err, &fe) || fe.Message != "card declined" || !errors.Is(err, idem.ErrFailed) {
		t.Fatalf("replay of a terminal failure: got %v, want *FailedError \"card declined\"", err)
	}
}

func TestResultTooLarge(t *testing.T) {
	e, s := newExec(t, idem.WithMaxResultSize(10))
	key := idem.Key{ID: "big"}
	r, err := e.Do(t.Context(), key, "", func(context.Context) ([]byte, error) { return []byte("more than ten bytes"), nil })
	if !errors.Is(err, idem.ErrResultTooLarge) || string(r.Value) != "more than ten bytes" {
		t.Fatalf("Do: got %+v, %v, want the value and ErrResultTooLarge", r, err)
	}
	if rec, _ := s.Get(t.Context(), key.Digest()); rec.State != storekit.StateFailed {
		t.Fatalf("record: got %v, want FAILED (the operation ran; running it again could repeat it)", rec.State)
	}
}

func TestBadInput(t *testing.T) {
	s, _ := memstore.New()
	for _, tc := range []struct {
		name string
		opts []idem.Option
	}{
		{"zero lease", []idem.Option{idem.WithLease(0)}},
		{"negative lease", []idem.Option{idem.WithLease(-time.Second)}},
		{"retention below lease", []idem.Option{idem.WithLease(time.Minute), idem.WithRetention(time.Second)}},
		{"negative attempts", []idem.Option{idem.WithMaxAttempts(-1)}},
		{"nil policy", []idem.Option{idem.WithFailurePolicy(nil)}},
		{"zero result size", []idem.Option{idem.WithMaxResultSize(0)}},
	} {
		if _, err := idem.New(s, tc.opts...); !errors.Is(err, idem.ErrInvalid) {
			t.Errorf("New with %s: got %v, want ErrInvalid", tc.name, err)
		}
	}
	if _, err := idem.New(nil); !errors.Is(err, idem.ErrInvalid) {
		t.Errorf("New(nil): got %v, want ErrInvalid", err)
	}
	e, _ := idem.New(s)
	fn := func(context.Context) ([]byte, error) { t.Error("fn ran on bad input"); return nil, nil }
	for _, tc := range []struct {
		name string
		key  idem.Key
		fp   string
	}{
		{"empty key", idem.Key{}, ""},
		{"long key", idem.Key{ID: strings.Repeat("k", storekit.MaxKeyLen+1)}, ""},
		{"long fingerprint", idem.Key{ID: "k"}, strings.Repeat("f", storekit.MaxFingerprintLen+1)},
	} {
		if _, err := e.Do(t.Context(), tc.key, tc.fp, fn); !errors.Is(err, idem.ErrInvalid) {
			t.Errorf("Do with %s: got %v, want ErrInvalid", tc.name, err)
		}
	}
	if s.Len() != 0 {
		t.Fatalf("bad input reached the store: %d records", s.Len())
	}
}

func TestCompressionAndEncryption(t *testing.T) {
	block, _ := aes.NewCipher(make([]byte, 32))
	aead, _ := cipher.NewGCM(block)
	e, s := newExec(t, idem.WithCompressAbove(100), idem.WithEncryption(aead))
	big := []byte(strings.Repeat("a compressible response body ", 200))
	key := idem.Key{ID: "sealed"}
	if _, err := e.Do(t.Context(), key, "", func(context.Context) ([]byte, error) { return big, nil }); err != nil {
		t.Fatal(err)
	}
	rec, _ := s.Get(t.Context(), key.Digest())
	if len(rec.Result) >= len(big)/4 {
		t.Errorf("stored %d bytes for a %d-byte compressible result", len(rec.Result), len(big))
	}
	if strings.Contains(string(rec.Result), "compressible") {
		t.Error("the stored result is readable without the key")
	}
	r, err := e.Do(t.Context(), key, "", func(context.Context) ([]byte, error) { return nil, nil })
	if err != nil || !r.Replayed || string(r.Value) != string(big) {
		t.Fatalf("replay: got %d bytes, %v, want the original %d bytes", len(r.Value), err, len(big))
	}
	// Another executor without the key cannot read it.
	plain, _ := idem.New(s)
	if _, err := plain.Do(t.Context(), key, "", func(context.Context) ([]byte, error) { return nil, nil }); !errors.Is(err, idem.ErrCorruptResult) {
		t.Fatalf("replay without the key: got %v, want ErrCorruptResult", err)
	}
}

func TestTyped(t *testing.T) {
	e, _ := newExec(t)
	type charge struct {
		ID     string
		Amount int
	}
	typed := idem.Typed[charge]{Executor: e}
	var runs int
	fn := func(context.Context) (charge, error) { runs++; return charge{"ch_1", 4200}, nil }
	for i, want := range []bool{false, true} {
		c, replayed, err := typed.Do(t.Context(), idem.Key{ID: "typed"}, "", fn)
		if err != nil || replayed != want || c != (charge{"ch_1", 4200}) {
			t.Fatalf("call %d: got %+v, %v, %v, want the charge, replayed %v", i, c, replayed, err, want)
		}
	}
	if runs != 1 {
		t.Fatalf("runs: got %d, want 1", runs)
	}
}

func TestBeginCommit(t *testing.T) {
	e, _ := newExec(t)
	key := idem.Key{ID: "manual"}
	ctx, a, err := e.Begin(t.Context(), key, "fp")
	if err != nil || a.Replayed() {
		t.Fatalf("Begin: %v", err)
	}
	if f, _ := idem.FenceFrom(ctx); f != a.Lease().Fence {
		t.Fatalf("context fence %d, attempt fence %d", f, a.Lease().Fence)
	}
	if err := a.Commit(t.Context(), []byte("v")); err != nil {
		t.Fatal(err)
	}
	if ctx.Err() == nil {
		t.Error("the attempt's context is still live after Commit")
	}
	if err := a.Commit(t.Context(), []byte("v")); !errors.Is(err, idem.ErrLeaseLost) {
		t.Fatalf("second Commit: got %v, want ErrLeaseLost", err)
	}
	_, b, err := e.Begin(t.Context(), key, "fp")
	if err != nil || !b.Replayed() || string(b.Value()) != "v" {
		t.Fatalf("Begin after Commit: got %v, want a replay of \"v\"", err)
	}
}

func TestConcurrentDo(t *testing.T) {
	e, _ := newExec(t)
	var runs atomic.Int32
	var wg sync.WaitGroup
	key := idem.Key{ID: "storm"}
	for range 64 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				r, err := e.Do(t.Context(), key, "", func(context.Context) ([]byte, error) {
					runs.Add(1)
					return []byte("once"), nil
				})
				if errors.Is(err, idem.ErrInProgress) {
					e.Await(t.Context(), key)
					continue
				}
				if err != nil || string(r.Value) != "once" {
					t.Errorf("Do: got %+v, %v", r, err)
				}
				return
			}
		}()
	}
	wg.Wait()
	if n := runs.Load(); n != 1 {
		t.Fatalf("fn ran %d times among 64 callers, want 1", n)
	}
}

func TestAbandonLeavesTheKeyUntilTheLeaseEnds(t *testing.T) {
	const lease = 50 * time.Millisecond
	e, s := newExec(t, idem.WithLease(lease), idem.WithRetention(time.Hour))
	key := idem.Key{ID: "unknown outcome"}
	// The lease starts within Begin: measured from before it, the takeover
	// comes no sooner than the lease, however long Begin took to return.
	start := time.Now()
	_, a, err := e.Begin(t.Context(), key, "")
	if err != nil {
		t.Fatal(err)
	}
	if err := a.Abandon(t.Context(), observe.Abandoned); err != nil {
		t.Fatal(err)
	}
	if _, err := e.Do(t.Context(), key, "", func(context.Context) ([]byte, error) { return nil, nil }); !errors.Is(err, idem.ErrInProgress) {
		t.Fatalf("Do right after Abandon: got %v, want ErrInProgress", err)
	}
	// No heartbeat extends it: the next caller takes it over after the lease.
	for {
		_, b, err := e.Begin(t.Context(), key, "")
		if errors.Is(err, idem.ErrInProgress) {
			if time.Since(start) > 5*time.Second {
				t.Fatal("the abandoned key was never taken over: its lease is still extended")
			}
			time.Sleep(5 * time.Millisecond)
			continue
		}
		if err != nil {
			t.Fatal(err)
		}
		if prev, ok := b.TakenOver(); !ok || prev != a.Lease().Owner {
			t.Fatalf("TakenOver: got %q, %v, want the abandoned owner", prev, ok)
		}
		if el := time.Since(start); el < lease-5*time.Millisecond {
			t.Fatalf("taken over after %v, before the lease of %v ended", el, lease)
		}
		b.Release(t.Context())
		break
	}
	if rec, _ := s.Get(t.Context(), key.Digest()); rec.Attempts != 2 {
		t.Fatalf("attempts: got %d, want 2", rec.Attempts)
	}
}

// TestDecodeResult reads stored results back as an admin tool does: plain,
// compressed and encrypted blobs decode to the value Do stored, and a blob
// that was altered is refused.
func TestDecodeResult(t *testing.T) {
	block, err := aes.NewCipher(make([]byte, 16))
	if err != nil {
		t.Fatal(err)
	}
	aead, err := cipher.NewGCM(block)
	if err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name  string
		opts  []idem.Option
		value string
	}{
		{"plain", nil, "small result"},
		{"compressed", nil, strings.Repeat("compressible ", 1000)},
		{"encrypted", []idem.Option{idem.WithEncryption(aead)}, "secret result"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			e, s := newExec(t, tt.opts...)
			key := idem.Key{Scope: "s", ID: "k"}
			if _, err := e.Do(t.Context(), key, "", func(context.Context) ([]byte, error) { return []byte(tt.value), nil }); err != nil {
				t.Fatal(err)
			}
			rec, err := s.Get(t.Context(), key.Digest())
			if err != nil {
				t.Fatal(err)
			}
			got, err := adapterkit.DecodeResult(e, key.Digest(), rec.Result)
			if err != nil || string(got) != tt.value {
				t.Fatalf("DecodeResult: got %.20q, %v, want %.20q, nil", got, err, tt.value)
			}
			altered := append([]byte{0xff}, rec.Result[1:]...)
			if _, err := adapterkit.DecodeResult(e, key.Digest(), altered); !errors.Is(err, idem.ErrCorruptResult) {
				t.Errorf("DecodeResult of an altered blob: got %v, want ErrCorruptResult", err)
			}
		})
	}
}

// TestDefaults checks the documented defaults: a 30s lease, 24h retention
// and results up to 1 MiB.
func TestDefaults(t *testing.T) {
	e, _ := newExec(t)
	if adapterkit.Lease(e) != 30*time.Second || adapterkit.Retention(e) != 24*time.Hour || adapterkit.MaxResultSize(e) != 1<<20 {
		t.Fatalf("lease %v, retention %v, max result %d; want 30s, 24h, 1 MiB", adapterkit.Lease(e), adapterkit.Retention(e), adapterkit.MaxResultSize(e))
	}
	if adapterkit.DefaultLease != 30*time.Second {
		t.Fatalf("DefaultLease %v", adapterkit.DefaultLease)
	}
}

// TestEncryptionRefusesPlainResult checks that an executor with a key does
// not replay a result that is not sealed, such as one planted in the store
// by whoever can write to it.
func TestEncryptionRefusesPlainResult(t *testing.T) {
	block, _ := aes.NewCipher(make([]byte, 32))
	aead, _ := cipher.NewGCM(block)
	s, err := memstore.New()
	if err != nil {
		t.Fatal(err)
	}
	plain, _ := idem.New(s)
	key := idem.Key{ID: "planted"}
	if _, err := plain.Do(t.Context(), key, "", func(context.Context) ([]byte, error) { return []byte("forged"), nil }); err != nil {
		t.Fatal(err)
	}
	sealed, _ := idem.New(s, idem.WithEncryption(aead))
	ran := false
	r, err := sealed.Do(t.Context(), key, "", func(context.Context) ([]byte, error) { ran = true; return nil, nil })
	if !errors.Is(err, idem.ErrCorruptResult) || r.Replayed || ran {
		t.Fatalf("plain result under a key: got replayed=%v %q, ran=%v, err %v; want ErrCorruptResult, nothing replayed", r.Replayed, r.Value, ran, err)
	}
	if _, err := adapterkit.DecodeResult(sealed, key.Digest(), []byte{0}); !errors.Is(err, idem.ErrCorruptResult) {
		t.Fatalf("DecodeResult of a plain blob with a key: got %v, want ErrCorruptResult", err)
	}
}

// TestOnLeaseLost checks that Do calls the compensation hook, with the
// key, the fence and fn's error, when the lease was lost while fn ran, and
// not otherwise.
func TestOnLeaseLost(t *testing.T) {
	var got []idem.LeaseLost
	s, err := memstore.New()
	if err != nil {
		t.Fatal(err)
	}
	e, err := idem.New(s, idem.WithOnLeaseLost(func(_ context.Context, l idem.LeaseLost) { got = append(got, l) }))
	if err != nil {
		t.Fatal(err)
	}
	key := idem.Key{Scope: "s", ID: "k"}
	var fence int64
	boom := errors.New("half done")
	for _, fnErr := range []error{nil, boom} {
		_, err = e.Do(t.Context(), key, "", func(ctx context.Context) ([]byte, error) {
			fence, _ = idem.FenceFrom(ctx)
			// Another owner takes the key over: here, the record goes.
			if err := s.Delete(ctx, key.Digest()); err != nil {
				t.Fatal(err)
			}
			return []byte("v"), fnErr
		})
		if !errors.Is(err, idem.ErrLeaseLost) {
			t.Fatalf("Do after losing the lease: got %v, want ErrLeaseLost", err)
		}
		if len(got) == 0 || got[len(got)-1].Key != key || got[len(got)-1].Fence != fence || !errors.Is(got[len(got)-1].Err, fnErr) || (fnErr == nil) != (got[len(got)-1].Err == nil) {
			t.Fatalf("hook calls %+v, want the key, fence %d and error %v", got, fence, fnErr)
		}
	}
	n := len(got)
	if _, err := e.Do(t.Context(), idem.Key{ID: "fine"}, "", func(context.Context) ([]byte, error) { return nil, nil }); err != nil {
		t.Fatal(err)
	}
	if len(got) != n {
		t.Fatalf("hook called for an attempt that kept its lease: %+v", got)
	}
}
