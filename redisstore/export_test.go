package redisstore

import (
	"context"
	"time"

	"github.com/idemgo/idem/redisstore/internal/backend"
	"github.com/idemgo/idem/storekit"
)

// AcquireSource returns the source of acquire.lua, for tests that call it
// with input the store would refuse.
func AcquireSource() string { return acquireScript.Src }

// ReplayCacheHits returns the number of acquires answered from rueidis's
// client-side cache so far, in every store of the process.
func ReplayCacheHits() int64 { return backend.CacheHits.Load() }

// CacheSize returns the entries and bytes of a go-redis store's replay
// cache.
func CacheSize(s *Store) (entries int, bytes int64) {
	if tc, ok := s.cached.(interface{ Size() (int, int64) }); ok {
		return tc.Size()
	}
	return 0, 0
}

// CacheState returns the generation of a go-redis store's replay cache
// (incremented by every flush) and whether its tracking connection is
// confirmed; tracked is false with rueidis (whose cache is rueidis's).
func CacheState(s *Store) (gen uint64, ready, tracked bool) {
	if tc, ok := s.cached.(interface{ State() (uint64, bool) }); ok {
		gen, ready = tc.State()
		return gen, ready, true
	}
	return 0, true, false
}

// DecodeRecord decodes a record as the replay cache does.
func DecodeRecord(v string) (state, fingerprint, result string, attempts int64, err error) {
	var r packedRecord
	err = r.decode(v)
	return r.state, r.fingerprint, r.result, r.attempts, err
}

// FakeNode is a server for CheckServer that answers INFO with info (or
// infoErr).
type FakeNode struct {
	Addr    string
	Info    string
	InfoErr error
	Config  map[string]string // CONFIG GET's answers
	// EarlyAOF makes WAITAOF acknowledge a write at once, fsynced or
	// not; otherwise it acknowledges a write only when given the probe's
	// first, long wait.
	EarlyAOF bool
	// Probes counts the writes WAITAOF was asked about.
	Probes *int
}

// fakeNode is a FakeNode as a backend.Node.
type fakeNode struct{ FakeNode }

func (n fakeNode) Addr() string                         { return n.FakeNode.Addr }
func (n fakeNode) Info(context.Context) (string, error) { return n.FakeNode.Info, n.InfoErr }
func (n fakeNode) ConfigGet(_ context.Context, name string) (string, error) {
	return n.Config[name], n.InfoErr
}

func (n fakeNode) SetWaitAOF(_ context.Context, _ string, timeout time.Duration) (int64, error) {
	if n.Probes != nil {
		*n.Probes++
	}
	if n.EarlyAOF || timeout >= probeFirstWait {
		return 1, nil
	}
	return 0, nil
}

func (n fakeNode) Exists(context.Context, string) error { return nil }
func (n fakeNode) Del(context.Context, string) error    { return nil }

// CheckServer runs the start check of New on nodes with opts.
func CheckServer(ctx context.Context, nodes []FakeNode, opts ...Option) error {
	var c config
	for _, o := range opts {
		o(&c)
	}
	if err := c.validate(); err != nil {
		return err
	}
	ns := make([]node, len(nodes))
	for i, n := range nodes {
		ns[i] = fakeNode{n}
	}
	return checkServer(ctx, ns, &c)
}

// Queued returns the number of calls a store has queued.
func Queued(s *Store) int {
	if q, ok := s.b.(interface{ Queued() int }); ok {
		return q.Queued()
	}
	return 0
}

// SetMaxQueueWait sets how long a queued call waits for a call in
// flight, until the test ends.
func SetMaxQueueWait(t interface{ Cleanup(func()) }, d time.Duration) {
	old := backend.MaxQueueWait
	backend.MaxQueueWait = d
	t.Cleanup(func() { backend.MaxQueueWait = old })
}

// RueidisRead returns how a rueidis store reads replays: "probe",
// "DoCache" or "Do".
func RueidisRead(s *Store) string {
	b, ok := s.cached.(interface{ ReadMode() string })
	if !ok {
		return ""
	}
	return b.ReadMode()
}

// ServerChecks returns the checks of WithServerCheck that reached the
// server so far.
func ServerChecks(s *Store) int64 {
	if s.monitor == nil {
		return 0
	}
	s.monitor.mu.Lock()
	defer s.monitor.mu.Unlock()
	return s.monitor.checks
}

// CachedReplay answers an acquire of key from the local replay cache, as
// Acquire does when the key is in the replay index.
func CachedReplay(ctx context.Context, s *Store, key, fingerprint string) (storekit.Acquisition, bool) {
	return s.cachedReplay(ctx, s.Key(key), fingerprint)
}

// MarkReplayed puts key in the replay index, as an acquire answered with a
// replay by its script does.
func MarkReplayed(s *Store, key string) { s.replays.add(s.Key(key)) }
