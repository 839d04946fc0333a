// Package prooftest holds what the broker adapters' tests share: the
// proof's size, a fenced sink that stands for the side effect, and helpers
// that build an Executor or Processor on a memstore and run a consumer.
//
// It lives in testkit, the packages that serve idem's own tests and those
// who write a store or a broker adapter for idem (docs/design.md#where-new-code-goes);
// its API is not covered by the modules' compatibility promise and may
// change in any release.
package prooftest

import (
	"os"
	"strconv"
	"sync"
	"testing"
)

// Messages returns the number of messages of a proof: the value of
// IDEM_PROOF_MESSAGES (make soak sets it), or def. A value that is not a
// number of at least 100 fails t.
func Messages(t testing.TB, def int) int {
	t.Helper()
	v := os.Getenv("IDEM_PROOF_MESSAGES")
	if v == "" {
		return def
	}
	n, err := strconv.Atoi(v)
	if err != nil || n < 100 {
		t.Fatalf("IDEM_PROOF_MESSAGES=%q: want an integer of at least 100", v)
	}
	return n
}

// Sink is the side effect of a proof: it applies an effect for a key only
// if the fence is above the highest it applied for that key, as
// "UPDATE … WHERE fence < $1" does, and counts what happened. Its methods
// are safe for concurrent use; read the fields once the run is over.
type Sink struct {
	mu    sync.Mutex
	fence map[string]int64

	// Applied counts the effects applied per key.
	Applied map[string]int
	// Executed counts the handler's runs per key.
	Executed map[string]int
	// Total is the number of effects applied.
	Total int
	// Stale is the number of writes refused by the fence.
	Stale int
}

// NewSink returns an empty Sink.
func NewSink() *Sink {
	return &Sink{fence: map[string]int64{}, Applied: map[string]int{}, Executed: map[string]int{}}
}

// Run counts one run of the handler for key.
func (s *Sink) Run(key string) {
	s.mu.Lock()
	s.Executed[key]++
	s.mu.Unlock()
}

// Apply applies the effect for key if fence is above the last one applied,
// and reports whether it did.
func (s *Sink) Apply(key string, fence int64) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if fence <= s.fence[key] {
		s.Stale++
		return false
	}
	s.fence[key] = fence
	s.Applied[key]++
	s.Total++
	return true
}

// AppliedKeys returns the number of keys with an applied effect.
func (s *Sink) AppliedKeys() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.Applied)
}
