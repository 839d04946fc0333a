package prooftest

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/idemgo/idem"
	"github.com/idemgo/idem/consumer"
	"github.com/idemgo/idem/memstore"
)

// MemExecutor returns an Executor with opts on a new memstore.
func MemExecutor(t testing.TB, opts ...idem.Option) *idem.Executor {
	t.Helper()
	s, err := memstore.New()
	if err != nil {
		t.Fatal(err)
	}
	e, err := idem.New(s, opts...)
	if err != nil {
		t.Fatal(err)
	}
	return e
}

// MemProcessor returns a consumer.Processor with opts on MemExecutor, with
// the given lease.
func MemProcessor(t testing.TB, lease time.Duration, opts ...consumer.Option) *consumer.Processor {
	t.Helper()
	p, err := consumer.New(MemExecutor(t, idem.WithLease(lease)), opts...)
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// Start runs run (a consumer's Run) in a goroutine until the test ends or
// stop is called, and fails the test if it returns an error or does not
// return within 30s of its context's cancellation.
func Start(t testing.TB, run func(context.Context) error) (stop func()) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- run(ctx) }()
	var once sync.Once
	stop = func() {
		once.Do(func() {
			cancel()
			select {
			case err := <-done:
				if err != nil {
					t.Errorf("Run: %v", err)
				}
			case <-time.After(30 * time.Second):
				t.Errorf("Run did not return within 30s of its cancellation")
			}
		})
	}
	t.Cleanup(stop)
	return stop
}
