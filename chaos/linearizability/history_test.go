package linearizability

import (
	"context"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"os"
	"sync"
	"testing"
	"time"

	"github.com/anishathalye/porcupine"
	"github.com/idemgo/idem"
	"github.com/idemgo/idem/chaos/chaostest"
	"github.com/idemgo/idem/storekit"
)

// Leases and retention of the histories: long enough that no lease expires
// and no record is dropped while a history is recorded, so the model needs
// no clock.
const (
	lease     = 10 * time.Minute
	retention = time.Hour
	maxTries  = 3 // max attempts passed to some acquires and fails
)

// workload is the shape of a recorded history.
type workload struct {
	keys, clients, opsPerKey int
	// callTimeout bounds one store call.
	callTimeout time.Duration
}

// recorder collects the operations of a history. It is safe for concurrent
// use.
type recorder struct {
	start time.Time
	mu    sync.Mutex
	ops   []porcupine.Operation
	// unknown counts the calls whose outcome was unknown (recorded as never
	// returning) and that were repeated.
	unknown int
}

func (r *recorder) now() int64 { return int64(time.Since(r.start)) }

func (r *recorder) add(client int, in input, call int64, out output) {
	ret := r.now()
	if out.unknown {
		ret = math.MaxInt64 // it may take effect at any point after its call
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if out.unknown {
		r.unknown++
	}
	r.ops = append(r.ops, porcupine.Operation{ClientId: client, Input: in, Call: call, Output: out, Return: ret})
}

// tally counts some answers of the history, to show that it exercises the
// state machine: acquisitions, replays, keys found in progress, refused
// stale leases, completions.
func (r *recorder) tally() map[string]int {
	n := map[string]int{"acquired": 0, "replayed": 0, "in_progress": 0, "lease_lost": 0, "completed": 0}
	for _, op := range r.ops {
		in, out := op.Input.(input), op.Output.(output)
		switch {
		case out.unknown:
		case out.err == errLeaseLost:
			n["lease_lost"]++
		case in.kind == opAcquire && out.outcome == storekit.Acquired:
			n["acquired"]++
		case in.kind == opAcquire && out.outcome == storekit.Replay:
			n["replayed"]++
		case in.kind == opAcquire && out.outcome == storekit.InProgress:
			n["in_progress"]++
		case in.kind == opComplete && out.err == errNone:
			n["completed"]++
		}
	}
	return n
}

// heldLease is a lease a client got, for the key it holds.
type heldLease struct {
	key   string
	lease idem.Lease
}

// record runs the workload against store and returns the history. Each
// client picks a key and an operation at random: with a lease on the key, it
// completes, fails, releases or extends it; otherwise it acquires the key
// (mostly with the key's usual fingerprint), reads it, deletes it now and
// then, or uses one of its stale leases. A call with an unknown outcome is
// repeated with the same arguments until it gets an answer.
func (w workload) record(t *testing.T, store idem.Store) *recorder {
	t.Helper()
	rec := &recorder{start: time.Now()}
	keys := make([]string, w.keys)
	for i := range keys {
		keys[i] = idem.Key{Scope: "linearizability", ID: fmt.Sprintf("%s-%d", t.Name(), i)}.Digest()
		if err := store.Delete(t.Context(), keys[i]); err != nil {
			t.Fatalf("clearing key %d: %v", i, err)
		}
	}
	if f, ok := store.(*faultyStore); ok {
		f.begin()
	}
	perClient := w.keys * w.opsPerKey / w.clients
	var wg sync.WaitGroup
	errs := make(chan error, w.clients)
	for c := range w.clients {
		wg.Go(func() {
			if err := w.client(t.Context(), store, rec, c, keys, perClient); err != nil {
				errs <- fmt.Errorf("client %d: %w", c, err)
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	return rec
}

func (w workload) client(ctx context.Context, store idem.Store, rec *recorder, c int, keys []string, n int) error {
	rnd := rand.New(rand.NewPCG(uint64(c), uint64(time.Now().UnixNano())))
	held := map[string]idem.Lease{}
	var stale []heldLease
	seq := 0
	for range n {
		key := keys[rnd.IntN(len(keys))]
		seq++
		in := input{key: key}
		if l, ok := held[key]; ok {
			in.owner, in.fence = l.Owner, l.Fence
			switch p := rnd.IntN(100); {
			case p < 45:
				in.kind, in.result = opComplete, fmt.Sprintf("result %d.%d", c, seq)
			case p < 60:
				in.kind, in.result, in.terminal, in.max = opFail, fmt.Sprintf("failure %d.%d", c, seq), rnd.IntN(3) == 0, maxTries
			case p < 75:
				in.kind = opRelease
			case p < 90:
				in.kind = opExtend
			default:
				in.kind, in.owner, in.fence = opGet, "", 0
			}
			if in.kind != opExtend && in.kind != opGet {
				delete(held, key)
				stale = append(stale, heldLease{key, l})
			}
		} else {
			switch p := rnd.IntN(100); {
			case p < 60:
				in.kind, in.fp, in.owner = opAcquire, "fp", fmt.Sprintf("c%d.%d", c, seq)
				if rnd.IntN(10) == 0 {
					in.fp = "other-fp"
				}
				if rnd.IntN(2) == 0 {
					in.max = maxTries
				}
			case p < 75:
				in.kind = opGet
			case p < 87:
				in.kind = opDelete
			default:
				if len(stale) == 0 {
					in.kind = opGet
					break
				}
				s := stale[rnd.IntN(len(stale))]
				in.key, in.owner, in.fence = s.key, s.lease.Owner, s.lease.Fence
				in.kind = []kind{opComplete, opRelease, opExtend, opFail}[rnd.IntN(4)]
				in.result = fmt.Sprintf("stale %d.%d", c, seq)
			}
		}
		out, err := w.call(ctx, store, rec, c, in)
		if err != nil {
			return err
		}
		if in.kind == opAcquire && out.err == errNone && out.outcome == storekit.Acquired {
			held[in.key] = idem.Lease{Owner: in.owner, Fence: out.fence}
		}
	}
	// Leave no key held: complete what is still held, so the last
	// operations are checked too.
	for key, l := range held {
		if _, err := w.call(ctx, store, rec, c, input{kind: opComplete, key: key, owner: l.Owner, fence: l.Fence, result: "last"}); err != nil {
			return err
		}
	}
	return nil
}

// call makes one call, recording it, and repeats it while its outcome is
// unknown, for at most a minute.
func (w workload) call(ctx context.Context, store idem.Store, rec *recorder, c int, in input) (output, error) {
	deadline := time.Now().Add(time.Minute)
	for {
		call := rec.now()
		cctx, cancel := context.WithTimeout(ctx, w.callTimeout)
		out, err := do(cctx, store, in)
		cancel()
		if err != nil {
			out = output{unknown: true}
		}
		rec.add(c, in, call, out)
		if err == nil {
			return out, nil
		}
		if time.Now().After(deadline) || ctx.Err() != nil {
			return out, fmt.Errorf("%v still failing: %w", in.kind, err)
		}
		time.Sleep(time.Duration(1+rand.IntN(10)) * time.Millisecond) // back off before repeating
	}
}

// do calls the store method of in. A nil error means a definite answer
// (ErrLeaseLost and ErrNotFound are answers); any other error leaves the
// outcome unknown.
func do(ctx context.Context, s idem.Store, in input) (output, error) {
	l := idem.Lease{Owner: in.owner, Fence: in.fence}
	var out output
	var err error
	switch in.kind {
	case opAcquire:
		var a storekit.Acquisition
		a, err = s.Acquire(ctx, in.key, storekit.AcquireRequest{Fingerprint: in.fp, Owner: in.owner, Lease: lease, Retention: retention, MaxAttempts: in.max})
		out = output{outcome: a.Outcome, fence: a.Lease.Fence, attempts: a.Attempts, state: a.State, result: string(a.Result)}
		if a.Outcome == storekit.InProgress || a.Outcome == storekit.Mismatch {
			out.state, out.result = 0, ""
		}
	case opComplete:
		err = s.Complete(ctx, in.key, l, []byte(in.result), retention)
	case opFail:
		out.state, err = s.Fail(ctx, in.key, l, storekit.Failure{Result: []byte(in.result), Terminal: in.terminal, Retention: retention, MaxAttempts: in.max})
	case opRelease:
		err = s.Release(ctx, in.key, l, retention)
	case opExtend:
		err = s.Extend(ctx, in.key, l, lease)
	case opGet:
		var r storekit.Record
		r, err = s.Get(ctx, in.key)
		out = output{state: r.State, fp: r.Fingerprint, fence: r.Fence, attempts: r.Attempts, result: string(r.Result)}
		if r.State == storekit.StateInProgress {
			out.owner = r.Owner
		}
	case opDelete:
		err = s.Delete(ctx, in.key)
	}
	switch {
	case err == nil:
		return out, nil
	case errors.Is(err, idem.ErrLeaseLost):
		return output{err: errLeaseLost}, nil
	case errors.Is(err, storekit.ErrNotFound):
		return output{err: errNotFound}, nil
	}
	return output{}, err
}

// check runs porcupine on the history (for at most 1 minute, 5 in the long
// variant) and returns its verdict. On a verdict other than want it writes
// porcupine's HTML visualization to a temporary file and logs its path.
func check(t *testing.T, rec *recorder, want porcupine.CheckResult) porcupine.CheckResult {
	t.Helper()
	res, info := porcupine.CheckOperationsVerbose(model, rec.ops, time.Duration(chaostest.Size(1, 5))*time.Minute)
	if res != want {
		f, err := os.CreateTemp("", "idem-linearizability-*.html")
		if err == nil {
			if verr := porcupine.Visualize(model, info, f); verr == nil {
				t.Logf("porcupine visualization: %s", f.Name())
			}
			f.Close()
		}
	}
	return res
}
