package storetest

import (
	"bytes"
	"errors"
	"fmt"
	mrand "math/rand/v2"
	"sync"
	"testing"

	"github.com/idemgo/idem"
	"github.com/idemgo/idem/storekit"
)

// model is a sequential model of the state machine of
// docs/design.md#the-state-machine for leases that do not expire.
type model struct {
	recs      map[string]*modelRec
	lastFence map[string]int64 // survives deletion
}

type modelRec struct {
	state       storekit.State
	fingerprint string
	owner       string
	fence       int64
	attempts    int
	result      []byte
}

// owns reports whether l owns key's record in the model.
func (m *model) owns(key string, l storekit.Lease) (*modelRec, bool) {
	r := m.recs[key]
	return r, r != nil && r.state == storekit.StateInProgress && r.owner == l.Owner && r.fence == l.Fence
}

// testSequentialModel runs random operations, some by stale owners, from
// several goroutines on a few keys, one at a time, and checks every reply and
// every record against the model. The operations are serialized so that the
// model's order is the store's order; what is tested is that each
// transition, whoever makes it and in whatever sequence, is the model's.
func testSequentialModel(t *testing.T, s storekit.Store) {
	ctx := t.Context()
	const (
		workers = 6
		ops     = 120
		nkeys   = 3
	)
	keys := make([]string, nkeys)
	for i := range keys {
		keys[i] = newKey(t)
	}
	m := &model{recs: map[string]*modelRec{}, lastFence: map[string]int64{}}
	var mu sync.Mutex // serializes store call + model update
	fail := func(format string, args ...any) {
		t.Helper()
		t.Errorf(format, args...)
	}
	var wg sync.WaitGroup
	for w := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			rng := mrand.New(mrand.NewPCG(uint64(w), 42))
			type held struct {
				key   string
				lease storekit.Lease
			}
			var leases []held
			pick := func() (held, bool) {
				if len(leases) == 0 {
					return held{}, false
				}
				return leases[rng.IntN(len(leases))], true
			}
			for i := range ops {
				if t.Failed() {
					return
				}
				key := keys[rng.IntN(nkeys)]
				op := rng.IntN(10)
				mu.Lock()
				switch {
				case op < 4: // acquire
					fp := []string{"a", "b"}[rng.IntN(5)/4] // mostly "a"
					maxAttempts := []int{0, 3}[rng.IntN(2)]
					r := req(fp, longLease)
					r.MaxAttempts = maxAttempts
					a, err := s.Acquire(ctx, key, r)
					if err != nil {
						fail("op %d Acquire: %v", i, err)
						break
					}
					rec := m.recs[key]
					switch {
					case rec == nil:
						if a.Outcome != storekit.Acquired || a.Attempts != 1 {
							fail("Acquire of absent key: got %v attempts %d, want Acquired attempts 1", a.Outcome, a.Attempts)
							break
						}
						m.recs[key] = &modelRec{state: storekit.StateInProgress, fingerprint: fp, owner: r.Owner, attempts: 1}
					case rec.fingerprint != fp:
						if a.Outcome != storekit.Mismatch {
							fail("Acquire with another fingerprint: got %v, want Mismatch", a.Outcome)
						}
					case rec.state == storekit.StateCompleted || rec.state == storekit.StateFailed:
						if a.Outcome != storekit.Replay || a.State != rec.state || !bytes.Equal(a.Result, rec.result) {
							fail("Acquire of %v key: got %v %v %q, want Replay %v %q", rec.state, a.Outcome, a.State, a.Result, rec.state, rec.result)
						}
					case rec.state == storekit.StateInProgress:
						if a.Outcome != storekit.InProgress {
							fail("Acquire of held key: got %v, want InProgress", a.Outcome)
						}
					case maxAttempts > 0 && rec.attempts >= maxAttempts:
						if a.Outcome != storekit.Replay || a.State != storekit.StateFailed || len(a.Result) != 0 {
							fail("Acquire past max attempts: got %v %v %q, want Replay FAILED with no result", a.Outcome, a.State, a.Result)
						}
						rec.state, rec.result = storekit.StateFailed, nil
					default: // released
						if a.Outcome != storekit.Acquired || a.Attempts != rec.attempts+1 {
							fail("Acquire of released key: got %v attempts %d, want Acquired attempts %d", a.Outcome, a.Attempts, rec.attempts+1)
							break
						}
						rec.state, rec.owner = storekit.StateInProgress, r.Owner
						rec.attempts++
					}
					if a.Outcome == storekit.Acquired {
						if a.Lease.Fence <= m.lastFence[key] {
							fail("fence %d not above the previous %d", a.Lease.Fence, m.lastFence[key])
						}
						m.lastFence[key] = a.Lease.Fence
						m.recs[key].fence = a.Lease.Fence
						leases = append(leases, held{key, a.Lease})
					}
				case op < 6: // complete
					h, ok := pick()
					if !ok {
						break
					}
					res := []byte(fmt.Sprintf("w%d-%d", w, i))
					err := s.Complete(ctx, h.key, h.lease, res, retention)
					if rec, owns := m.owns(h.key, h.lease); owns {
						if err != nil {
							fail("Complete by the owner: %v", err)
							break
						}
						rec.state, rec.result = storekit.StateCompleted, res
					} else if !errors.Is(err, idem.ErrLeaseLost) {
						fail("Complete by a stale owner: got %v, want ErrLeaseLost", err)
					}
				case op < 7: // fail
					h, ok := pick()
					if !ok {
						break
					}
					f := storekit.Failure{Result: []byte("failure"), Terminal: rng.IntN(3) == 0, Retention: retention, MaxAttempts: []int{0, 2}[rng.IntN(2)]}
					st, err := s.Fail(ctx, h.key, h.lease, f)
					if rec, owns := m.owns(h.key, h.lease); owns {
						want := storekit.StateReleased
						if f.Terminal || (f.MaxAttempts > 0 && rec.attempts >= f.MaxAttempts) {
							want = storekit.StateFailed
						}
						if err != nil || st != want {
							fail("Fail by the owner: got %v, %v, want %v", st, err, want)
							break
						}
						rec.state = want
						rec.result = nil
						if want == storekit.StateFailed {
							rec.result = f.Result
						}
					} else if rec := m.recs[h.key]; rec != nil && (rec.state == storekit.StateReleased || rec.state == storekit.StateFailed) && rec.fence == h.lease.Fence {
						// The lease that ended the attempt, repeating itself.
						if err != nil || st != rec.state {
							fail("repeated Fail: got %v, %v, want %v", st, err, rec.state)
						}
					} else if !errors.Is(err, idem.ErrLeaseLost) {
						fail("Fail by a stale owner: got %v, want ErrLeaseLost", err)
					}
				case op < 8: // release or extend
					h, ok := pick()
					if !ok {
						break
					}
					release := rng.IntN(2) == 0
					var err error
					if release {
						err = s.Release(ctx, h.key, h.lease, retention)
					} else {
						err = s.Extend(ctx, h.key, h.lease, longLease)
					}
					if rec, owns := m.owns(h.key, h.lease); owns {
						if err != nil {
							fail("Release/Extend by the owner: %v", err)
							break
						}
						if release {
							rec.state = storekit.StateReleased
						}
					} else if rec := m.recs[h.key]; release && rec != nil && rec.state == storekit.StateReleased && rec.fence == h.lease.Fence {
						if err != nil {
							fail("repeated Release: %v", err)
						}
					} else if !errors.Is(err, idem.ErrLeaseLost) {
						fail("Release/Extend by a stale owner: got %v, want ErrLeaseLost", err)
					}
				case op < 9: // delete, rarely
					if rng.IntN(4) != 0 {
						break
					}
					if err := s.Delete(ctx, key); err != nil {
						fail("Delete: %v", err)
						break
					}
					delete(m.recs, key)
				default: // get
					rec, err := s.Get(ctx, key)
					want := m.recs[key]
					if want == nil {
						if !errors.Is(err, storekit.ErrNotFound) {
							fail("Get of absent key: got %+v, %v, want ErrNotFound", rec, err)
						}
						break
					}
					if err != nil {
						fail("Get: %v", err)
						break
					}
					if rec.State != want.state || rec.Fence != want.fence || rec.Attempts != want.attempts || rec.Fingerprint != want.fingerprint {
						fail("Get: got state %v fence %d attempts %d fingerprint %q, want %v %d %d %q",
							rec.State, rec.Fence, rec.Attempts, rec.Fingerprint, want.state, want.fence, want.attempts, want.fingerprint)
					}
					if (want.state == storekit.StateCompleted || want.state == storekit.StateFailed) && !bytes.Equal(rec.Result, want.result) {
						fail("Get result: got %q, want %q", rec.Result, want.result)
					}
				}
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
}
