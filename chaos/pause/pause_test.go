package pause

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/idemgo/idem"
	"github.com/idemgo/idem/adapterkit"
	"github.com/idemgo/idem/chaos/chaostest"
	"github.com/idemgo/idem/redisstore"
	"github.com/idemgo/idem/storekit"
	"github.com/redis/go-redis/v9"
)

// lease is the owners' lease. The pause is twice as long.
const lease = time.Second

// Bounds of the waits: generous, since the machine may be loaded.
const (
	lineTimeout = 60 * time.Second
	stopTimeout = 10 * time.Second
)

func TestMain(m *testing.M) {
	if role := chaostest.Role(); role != "" {
		os.Exit(runChild(role))
	}
	os.Exit(m.Run())
}

func runChild(role string) int {
	if role != "owner" {
		fmt.Fprintf(os.Stderr, "unknown role %q\n", role)
		return 2
	}
	if err := runOwner(os.Getenv("PAUSE_REDIS"), os.Getenv("PAUSE_KEY")); err != nil {
		fmt.Fprintln(os.Stderr, "owner:", err)
		return 1
	}
	return 0
}

// key returns the idempotency key of the scenario's key id.
func key(id string) idem.Key { return idem.Key{Scope: "pause", ID: id} }

// goList is the Redis list the parent pushes to when the paused owner may
// go on.
func goList(id string) string { return "go:{" + id + "}" }

// runOwner is the owner that gets paused (process A). In fn it says
// "in fn <fence>" and waits until the parent pushes to goList: by then it
// was stopped for twice its lease and another owner took the key over and
// completed it. It then does what a stale owner that does not notice its
// pause does: it writes its effect with its old fence to the fenced sink
// and to the unfenced one, and returns. It reports Do's error and the
// result of a raw Complete with its old lease, which the store must refuse:
//
//	result applied=<bool> unfenced=<n> do_lost=<bool> complete_lost=<bool> do_err=<quoted>
func runOwner(addr, id string) error {
	rdb := redis.NewClient(&redis.Options{Addr: addr})
	defer rdb.Close()
	store, err := redisstore.New(rdb)
	if err != nil {
		return err
	}
	exec, err := idem.New(store, idem.WithLease(lease))
	if err != nil {
		return err
	}
	sink := chaostest.NewRedisSink(rdb, "sink:")
	bg := context.Background()
	var (
		held     idem.Lease
		applied  bool
		unfenced int64
		fnErr    error
	)
	_, doErr := exec.Do(bg, key(id), "fp", func(ctx context.Context) ([]byte, error) {
		held, _ = idem.LeaseFrom(ctx)
		chaostest.Say("in fn %d", held.Fence)
		// Not ctx: a process that resumes from a pause is already past any
		// check of its context, in the middle of its work.
		if err := rdb.BLPop(bg, 0, goList(id)).Err(); err != nil {
			fnErr = err
			return nil, err
		}
		if applied, fnErr = sink.Apply(bg, id, held.Fence); fnErr != nil {
			return nil, fnErr
		}
		if unfenced, fnErr = sink.ApplyUnfenced(bg, id); fnErr != nil {
			return nil, fnErr
		}
		return []byte("stale owner's result"), nil
	})
	if fnErr != nil {
		return fnErr
	}
	cerr := store.Complete(bg, key(id).Digest(), held, []byte("stale owner's raw result"), time.Hour)
	chaostest.Say("result applied=%t unfenced=%d do_lost=%t complete_lost=%t do_err=%q",
		applied, unfenced, errors.Is(doErr, idem.ErrLeaseLost), errors.Is(cerr, idem.ErrLeaseLost), fmt.Sprint(doErr))
	return nil
}

// ownerResult is the parsed "result" line of an owner.
type ownerResult struct {
	applied      bool
	unfenced     int64
	doLost       bool
	completeLost bool
	doErr        string
}

func parseResult(t *testing.T, line string) ownerResult {
	t.Helper()
	var r ownerResult
	var doErr string
	_, err := fmt.Sscanf(line, "result applied=%t unfenced=%d do_lost=%t complete_lost=%t do_err=%q",
		&r.applied, &r.unfenced, &r.doLost, &r.completeLost, &doErr)
	if err != nil {
		t.Fatalf("owner's line %q: %v", line, err)
	}
	r.doErr = doErr
	return r
}

// takeOver runs fn for id on exec, waiting while the key is in progress,
// and returns Do's result.
func takeOver(ctx context.Context, exec *idem.Executor, id string, fn func(ctx context.Context) ([]byte, error)) (idem.Result, error) {
	for {
		res, err := exec.Do(ctx, key(id), "fp", fn)
		if !errors.Is(err, idem.ErrInProgress) {
			return res, err
		}
		if err := exec.Await(ctx, key(id)); err != nil {
			return res, err
		}
	}
}

// TestOwnerPause is scenario 3, owner pause. Per key, a child process A
// acquires the key through an Executor on a real redis-server (lease 1s)
// and, inside its operation, is stopped with SIGSTOP for twice the lease.
// Meanwhile the test's own Executor (B) takes the key over once the lease
// ended, writes its effect with its fence and completes. Then A is resumed
// with SIGCONT and, as a paused process does, goes on as if nothing had
// happened: it writes its effect with its old fence to a fenced sink and to
// an unfenced one, and completes.
//
// Asserted for every key: A's Do reports ErrLeaseLost and a raw Complete
// with A's lease is refused with ErrLeaseLost (100%); the fenced sink
// refuses A's write (100%) and holds B's fence with one applied write; the
// record is COMPLETED with B's fence and result; B's fence is above A's.
// The unfenced sink is the negative control: it must show A's duplicate
// for every key, proving the test can see one. K = 20 keys (IDEM_CHAOS=long:
// 200), 5 (long: 10) owners paused at a time.
func TestOwnerPause(t *testing.T) {
	k, batch := chaostest.Size(20, 200), chaostest.Size(5, 10)
	rdb, exec := chaostest.StartRedisExecutor(t, lease)
	sink := chaostest.NewRedisSink(rdb, "sink:")
	ctx := t.Context()

	var fenced, control chaostest.Counters
	var (
		staleCompletes, staleWrites int // refused
		takeovers, pauses           []time.Duration
	)
	start := time.Now()
	for first := 0; first < k; first += batch {
		n := min(batch, k-first)
		ids := make([]string, n)
		owners := make([]*chaostest.Proc, n)
		fenceA := make([]int64, n)
		stoppedAt := make([]time.Time, n)
		for i := range n {
			ids[i] = fmt.Sprintf("key-%d", first+i)
			owners[i] = chaostest.StartChild(t, "owner", "PAUSE_REDIS="+rdb.Options().Addr, "PAUSE_KEY="+ids[i])
			fenced.Attempted.Add(1)
			control.Attempted.Add(1)
		}
		// Stop each owner right after it said it is in its operation: the
		// gap is far below the lease, and a heartbeat in it only moves the
		// lease's end, which B waits for.
		for i, a := range owners {
			line := a.Expect("in fn ", lineTimeout)
			f, err := strconv.ParseInt(strings.TrimPrefix(line, "in fn "), 10, 64)
			if err != nil {
				t.Fatalf("owner %s: line %q: %v", ids[i], line, err)
			}
			a.Pause(stopTimeout)
			fenceA[i], stoppedAt[i] = f, time.Now()
			fenced.Executed.Add(1)
			control.Executed.Add(1)
		}
		// B takes every key over and completes it.
		fenceB := make([]int64, n)
		for i, id := range ids {
			res, err := takeOver(ctx, exec, id, func(ctx context.Context) ([]byte, error) {
				takeovers = append(takeovers, time.Since(stoppedAt[i]))
				fence, _ := idem.FenceFrom(ctx)
				fenced.Executed.Add(1)
				control.Executed.Add(1)
				if _, err := sink.Apply(ctx, id, fence); err != nil {
					return nil, err
				}
				if _, err := sink.ApplyUnfenced(ctx, id); err != nil {
					return nil, err
				}
				return []byte("B's result for " + id), nil
			})
			if err != nil || res.Replayed {
				t.Fatalf("takeover of %s: got %+v, %v; want an execution", id, res, err)
			}
			fenced.Acknowledged.Add(1)
			control.Acknowledged.Add(1)
			fenceB[i] = res.Fence
			if fenceB[i] <= fenceA[i] {
				t.Errorf("%s: B's fence %d is not above A's %d", id, fenceB[i], fenceA[i])
			}
		}
		// The pause itself: each owner stays stopped for twice the lease.
		if d := 2*lease - time.Since(stoppedAt[n-1]); d > 0 {
			time.Sleep(d)
		}
		for i, a := range owners {
			if err := rdb.RPush(ctx, goList(ids[i]), "go").Err(); err != nil {
				t.Fatal(err)
			}
			pauses = append(pauses, time.Since(stoppedAt[i]))
			a.Signal(syscall.SIGCONT)
		}
		for i, a := range owners {
			id := ids[i]
			r := parseResult(t, a.Expect("result ", lineTimeout))
			if err := a.Wait(lineTimeout); err != nil {
				t.Fatalf("owner %s: %v\n%s", id, err, a.Stderr())
			}
			if r.completeLost {
				staleCompletes++
			} else {
				t.Errorf("%s: the stale owner's raw Complete was not refused with ErrLeaseLost", id)
			}
			if !r.doLost {
				t.Errorf("%s: the stale owner's Do returned %s, want ErrLeaseLost", id, r.doErr)
			}
			if r.applied {
				t.Errorf("%s: the fenced sink applied the stale owner's write (fence %d after %d)", id, fenceA[i], fenceB[i])
			} else {
				staleWrites++
			}
			st, err := sink.State(ctx, id)
			if err != nil {
				t.Fatal(err)
			}
			fenced.Effects.Add(st.Applied)
			fenced.Duplicated.Add(max(0, st.Applied-1))
			control.Effects.Add(st.Unfenced)
			control.Duplicated.Add(max(0, st.Unfenced-1))
			if st.Applied != 1 || st.Fence != fenceB[i] || st.Stale != 1 {
				t.Errorf("%s: fenced sink holds %+v, want 1 applied write with B's fence %d and 1 refused", id, st, fenceB[i])
			}
			if st.Unfenced != 2 {
				t.Errorf("%s: unfenced sink has %d writes, want 2 (the control must see A's duplicate)", id, st.Unfenced)
			}
			rec, err := adapterkit.Store(exec).Get(ctx, key(id).Digest())
			if err != nil {
				t.Fatal(err)
			}
			if rec.State != storekit.StateCompleted || rec.Fence != fenceB[i] {
				fenced.Lost.Add(1)
				t.Errorf("%s: record %v fence %d, want COMPLETED with B's fence %d", id, rec.State, rec.Fence, fenceB[i])
				continue
			}
			if v, err := adapterkit.DecodeResult(exec, key(id).Digest(), rec.Result); err != nil || string(v) != "B's result for "+id {
				fenced.Lost.Add(1)
				t.Errorf("%s: stored result %q, %v; want B's", id, v, err)
			}
		}
	}
	elapsed := time.Since(start)

	command := "make chaos-long RUN=TestOwnerPause"
	chaostest.Report(t, "owner pause (fenced sink)", command, &fenced, map[string]string{
		"lease":                       lease.String(),
		"pause_p50":                   chaostest.Percentile(pauses, 50).Round(time.Millisecond).String(),
		"takeover_after_stop_p50":     chaostest.Percentile(takeovers, 50).Round(time.Millisecond).String(),
		"takeover_after_stop_p99":     chaostest.Percentile(takeovers, 99).Round(time.Millisecond).String(),
		"stale_complete_rejected":     fmt.Sprintf("%d/%d", staleCompletes, k),
		"stale_fenced_write_rejected": fmt.Sprintf("%d/%d", staleWrites, k),
		"wall":                        elapsed.Round(time.Millisecond).String(),
	})
	chaostest.Report(t, "owner pause (unfenced control)", command, &control, map[string]string{
		"duplicates_seen": fmt.Sprintf("%d/%d", control.Duplicated.Load(), k),
	})
	if got := fenced.Duplicated.Load() + fenced.Lost.Load(); got != 0 {
		t.Errorf("fenced sink: %d lost + duplicated, want 0", got)
	}
	if staleCompletes != k || staleWrites != k {
		t.Errorf("stale completes refused %d/%d, stale fenced writes refused %d/%d; want all", staleCompletes, k, staleWrites, k)
	}
	if got := control.Duplicated.Load(); got != int64(k) {
		t.Errorf("unfenced control: %d duplicates, want %d (one per key)", got, k)
	}
}
