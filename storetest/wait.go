package storetest

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idemgo/idem"
	"github.com/idemgo/idem/storekit"
)

// RunWait checks the waiting Do (idem.WithWait, idem.WaitFor) with one
// Executor on first and another on second, which must be two clients of
// the same records (two connections to one server, two processes' stores)
// or the same store: while the first Executor's operation runs, a Do of
// the same key on the second waits for it to end, is woken, and then
// replays its result, gets its stored failure, or runs once the key was
// released; a wait that runs out returns an *idem.InProgressError and runs
// nothing; WaitFor(0) overrides the Executor's WithWait. On a store that
// implements storekit.Watcher the wait goes through it (it is woken by the
// store's notification); beneath a wrapper that hides it, it polls. Run
// calls it with one store from newStore as both.
func RunWait(t *testing.T, first, second storekit.Store) {
	_, watches := storekit.StoreAs[storekit.Watcher](second)
	endings := []struct {
		name   string
		result func() ([]byte, error)
		check  func(t *testing.T, res idem.Result, err error, ran int32)
	}{
		{"Complete", func() ([]byte, error) { return []byte("first"), nil },
			func(t *testing.T, res idem.Result, err error, ran int32) {
				if err != nil || !res.Replayed || string(res.Value) != "first" || ran != 0 {
					t.Fatalf("waiter: got %q replayed=%v, %v, ran %d times; want the replay of %q, ran 0 times", res.Value, res.Replayed, err, ran, "first")
				}
			}},
		{"Release", func() ([]byte, error) { return nil, errors.New("retryable") },
			func(t *testing.T, res idem.Result, err error, ran int32) {
				if err != nil || res.Replayed || string(res.Value) != "second" || ran != 1 {
					t.Fatalf("waiter: got %q replayed=%v, %v, ran %d times; want its own run %q", res.Value, res.Replayed, err, ran, "second")
				}
			}},
		{"Fail", func() ([]byte, error) { return nil, idem.Terminal(errors.New("declined")) },
			func(t *testing.T, res idem.Result, err error, ran int32) {
				if !errors.Is(err, idem.ErrFailed) || ran != 0 {
					t.Fatalf("waiter: got %v, ran %d times; want ErrFailed, ran 0 times", err, ran)
				}
			}},
	}
	type wrapping struct {
		name string
		wrap func(s storekit.Store) *waitProbe
	}
	wrappings := []wrapping{{"polling", func(s storekit.Store) *waitProbe { return newProbe(s, false) }}}
	if watches {
		wrappings = append(wrappings, wrapping{"watcher", func(s storekit.Store) *waitProbe { return newProbe(s, true) }})
	}
	for _, wr := range wrappings {
		for _, end := range endings {
			t.Run(wr.name+"/"+end.name, func(t *testing.T) {
				probe := wr.wrap(second)
				var s storekit.Store = probe
				if probe.unwrap {
					s = &watchingProbe{probe}
				}
				h := holdKey(t, first)
				waiter := newExecutor(t, s, idem.WithWait(waitLimit))
				var ran atomic.Int32
				done := make(chan struct{})
				var res idem.Result
				var err error
				go func() {
					defer close(done)
					res, err = waiter.Do(t.Context(), h.key, "fp", func(context.Context) ([]byte, error) {
						ran.Add(1)
						return []byte("second"), nil
					})
				}()
				// The waiter looks at the record: it waits.
				select {
				case <-probe.got:
				case <-done:
					t.Fatalf("the waiter returned while the key was held: %v", err)
				case <-time.After(waitLimit):
					t.Fatalf("the waiter did not look at the record within %v", waitLimit)
				}
				h.end(end.result)
				select {
				case <-done:
				case <-time.After(waitLimit):
					t.Fatalf("the waiter did not return within %v of the first attempt's end", waitLimit)
				}
				end.check(t, res, err, ran.Load())
				if probe.unwrap && probe.watches.Load() == 0 {
					t.Errorf("the waiter did not watch the key through the store's storekit.Watcher")
				}
			})
		}
	}
	t.Run("timeout", func(t *testing.T) {
		h := holdKey(t, first)
		defer h.end(func() ([]byte, error) { return []byte("first"), nil })
		waiter := newExecutor(t, second)
		var ran atomic.Int32
		start := time.Now()
		_, err := waiter.Do(t.Context(), h.key, "fp", func(context.Context) ([]byte, error) {
			ran.Add(1)
			return nil, nil
		}, idem.WaitFor(100*time.Millisecond))
		ip, ok := errors.AsType[*idem.InProgressError](err)
		if !ok || ran.Load() != 0 {
			t.Fatalf("waiter: got %v, ran %d times; want an *InProgressError, ran 0 times", err, ran.Load())
		}
		if waited := time.Since(start); waited < 100*time.Millisecond {
			t.Errorf("waiter returned after %v, before its wait of 100ms", waited)
		}
		if ip.RetryAfter <= 0 || ip.RetryAfter > longLease {
			t.Errorf("RetryAfter: got %v, want in (0, %v]", ip.RetryAfter, longLease)
		}
	})
	t.Run("WaitFor(0) overrides WithWait", func(t *testing.T) {
		h := holdKey(t, first)
		defer h.end(func() ([]byte, error) { return []byte("first"), nil })
		probe := newProbe(second, false)
		waiter := newExecutor(t, probe, idem.WithWait(time.Hour))
		_, err := waiter.Do(t.Context(), h.key, "fp", func(context.Context) ([]byte, error) { return nil, nil }, idem.WaitFor(0))
		if !errors.Is(err, idem.ErrInProgress) || probe.gets.Load() != 0 {
			t.Fatalf("got %v after %d looks at the record, want ErrInProgress at once", err, probe.gets.Load())
		}
	})
}

// held is a key whose operation runs on an Executor of its own until end.
type held struct {
	key    idem.Key
	result chan func() ([]byte, error)
	done   chan struct{}
}

// holdKey starts a Do of a new key on s whose operation runs until end.
func holdKey(t *testing.T, s storekit.Store) *held {
	t.Helper()
	var b [8]byte
	rand.Read(b[:])
	h := &held{
		key:    idem.Key{Scope: t.Name(), ID: hex.EncodeToString(b[:])},
		result: make(chan func() ([]byte, error), 1),
		done:   make(chan struct{}),
	}
	exec := newExecutor(t, s)
	started := make(chan struct{})
	go func() {
		defer close(h.done)
		_, _ = exec.Do(context.Background(), h.key, "fp", func(context.Context) ([]byte, error) {
			close(started)
			return (<-h.result)()
		})
	}()
	select {
	case <-started:
	case <-time.After(waitLimit):
		t.Fatalf("the first attempt did not start within %v", waitLimit)
	}
	return h
}

// end makes the held operation return what result returns, and waits for
// its Do to return.
func (h *held) end(result func() ([]byte, error)) {
	select {
	case h.result <- result:
		<-h.done
	default: // already ended
	}
}

func newExecutor(t *testing.T, s storekit.Store, opts ...idem.Option) *idem.Executor {
	t.Helper()
	e, err := idem.New(s, append([]idem.Option{idem.WithLease(longLease), idem.WithRetention(retention)}, opts...)...)
	if err != nil {
		t.Fatalf("idem.New: %v", err)
	}
	return e
}

// waitProbe counts the looks at records (Get) and tells of the first; it
// hides the store's capabilities (so a wait polls) unless wrapped in a
// watchingProbe.
type waitProbe struct {
	storekit.Store
	unwrap  bool
	gets    atomic.Int32
	watches atomic.Int32
	got     chan struct{} // closed at the first Get
}

func newProbe(s storekit.Store, unwrap bool) *waitProbe {
	return &waitProbe{Store: s, unwrap: unwrap, got: make(chan struct{})}
}

func (p *waitProbe) Get(ctx context.Context, key string) (storekit.Record, error) {
	if p.gets.Add(1) == 1 {
		close(p.got)
	}
	return p.Store.Get(ctx, key)
}

// watchingProbe is a waitProbe that passes the store's storekit.Watcher
// through, counting the watches.
type watchingProbe struct{ *waitProbe }

func (p *watchingProbe) Watch(ctx context.Context, key string) (<-chan struct{}, func(), error) {
	w, _ := storekit.StoreAs[storekit.Watcher](p.Store)
	p.watches.Add(1)
	return w.Watch(ctx, key)
}

// Unwrap returns the probed store, so that its other capabilities are
// found (storekit.StoreAs).
func (p *watchingProbe) Unwrap() storekit.Store { return p.Store }
