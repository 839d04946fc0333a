package redisstore_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"

	"github.com/idemgo/idem"
	"github.com/idemgo/idem/adapterkit"
	"github.com/idemgo/idem/storekit"
	"github.com/idemgo/idem/testkit/redistest"
	"github.com/redis/go-redis/v9"
)

// roundTrips counts the commands and pipelines a go-redis client sends.
type roundTrips struct {
	mu    sync.Mutex
	names []string
}

func (h *roundTrips) DialHook(next redis.DialHook) redis.DialHook { return next }
func (h *roundTrips) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		h.mu.Lock()
		h.names = append(h.names, cmd.Name())
		h.mu.Unlock()
		return next(ctx, cmd)
	}
}
func (h *roundTrips) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		h.mu.Lock()
		h.names = append(h.names, fmt.Sprintf("pipeline of %d %s", len(cmds), cmds[0].Name()))
		h.mu.Unlock()
		return next(ctx, cmds)
	}
}

// TestBatchRoundTrips runs a batch of 100 keys through the executor: the
// acquisitions take one script call and the completions one more.
func TestBatchRoundTrips(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t)
	c := goRedisClient(t, srv.Addr())
	// Load the scripts, so that the count below has no NOSCRIPT retry.
	we := newExec(t, newStore(t, c))
	wb := adapterkit.BeginBatch(t.Context(), we, []idem.Key{{ID: "warm1"}, {ID: "warm2"}}, []string{"", ""})
	adapterkit.CommitBatch(t.Context(), we, []*idem.Attempt{wb[0].Attempt, wb[1].Attempt}, [][]byte{nil, nil})
	hook := &roundTrips{}
	c.AddHook(hook)
	exec := newExec(t, newStore(t, c))
	keys := make([]idem.Key, 100)
	fps := make([]string, 100)
	for i := range keys {
		keys[i] = idem.Key{Scope: "batch", ID: fmt.Sprint(i)}
	}
	began := adapterkit.BeginBatch(t.Context(), exec, keys, fps)
	attempts := make([]*idem.Attempt, len(began))
	values := make([][]byte, len(began))
	for i, b := range began {
		if b.Err != nil || b.Attempt.Replayed() {
			t.Fatalf("key %d: %+v", i, b)
		}
		attempts[i], values[i] = b.Attempt, []byte(fmt.Sprint("v", i))
	}
	for i, err := range adapterkit.CommitBatch(t.Context(), exec, attempts, values) {
		if err != nil {
			t.Fatalf("commit %d: %v", i, err)
		}
	}
	// Count the store's own round trips (a new connection's HELLO and
	// CLIENT SETINFO go through the hooks too).
	var ours []string
	for _, n := range hook.names {
		if strings.Contains(n, "eval") {
			ours = append(ours, n)
		}
	}
	if len(ours) != 2 || ours[0] != "pipeline of 1 evalsha" || ours[1] != "pipeline of 1 evalsha" {
		t.Fatalf("round trips for a batch of 100: %v, want two script calls", ours)
	}
	again := adapterkit.BeginBatch(t.Context(), exec, keys, fps)
	for i, b := range again {
		if b.Err != nil || !b.Attempt.Replayed() || string(b.Attempt.Value()) != fmt.Sprint("v", i) {
			t.Fatalf("replay %d: %+v", i, b)
		}
	}
}

// TestBatchAllClients checks batches on every client and topology,
// including keys spread over the Cluster's nodes and a stale lease.
func TestBatchAllClients(t *testing.T) {
	t.Parallel()
	standalone := redistest.Start(t)
	cluster := redistest.StartCluster(t, 3)
	for _, c := range clients(t, standalone, cluster) {
		t.Run(c.name, func(t *testing.T) {
			s := c.newStore(t)
			keys := []string{}
			leases := []storekit.Lease{}
			for i := range 20 {
				key := idem.Key{Scope: c.name, ID: fmt.Sprint(i)}.Digest()
				a, err := s.Acquire(t.Context(), key, storekit.AcquireRequest{Owner: "o", Lease: adapterkit.DefaultLease, Retention: adapterkit.DefaultRetention})
				if err != nil {
					t.Fatal(err)
				}
				keys, leases = append(keys, key), append(leases, a.Lease)
			}
			leases[3].Fence++ // a stale lease
			results := make([][]byte, len(keys))
			errs := s.CompleteBatch(t.Context(), keys, leases, results, adapterkit.DefaultRetention)
			for i, err := range errs {
				if i == 3 {
					if !errors.Is(err, idem.ErrLeaseLost) {
						t.Fatalf("stale lease: got %v, want ErrLeaseLost", err)
					}
					continue
				}
				if err != nil {
					t.Fatalf("complete %d: %v", i, err)
				}
			}
			if rec, _ := s.Get(t.Context(), keys[3]); rec.State != storekit.StateInProgress {
				t.Fatalf("the stale lease's key: got %v, want IN_PROGRESS", rec.State)
			}
		})
	}
}
