package netfault

import (
	"context"
	"errors"
	"fmt"
	"net"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idemgo/idem"
	"github.com/idemgo/idem/chaos/chaostest"
	"github.com/idemgo/idem/storekit"
	"github.com/idemgo/idem/testkit/redistest"
	"github.com/redis/go-redis/v9"
)

// TestStartAfterLease is scenario 5, start after the lease: every reply
// from Redis to owner A takes 1.5s (toxiproxy latency), with a 1s lease.
// For each key, A calls Do; its acquire reaches Redis at once, but its
// reply comes after the lease has ended, by which time owner B (straight
// to Redis) has taken the key over and run the operation. Asserted: A's
// operation never starts (Do fails with ErrLeaseLost), so every key runs
// once. The negative control makes A's acquire and runs the operation
// when the reply comes, as Begin did before it checked the lease's local
// deadline: A's operation starts after its lease ended, with a live
// context, and every key runs twice.
func TestStartAfterLease(t *testing.T) {
	const (
		lease = time.Second
		delay = 1500 * time.Millisecond
	)
	keys := chaostest.Size(20, 200)
	srv := redistest.Start(t)
	px := chaostest.StartNetProxy(t, srv.Addr())
	// The slow client counts its dials: a connection dialed during a run
	// has its handshake's reply delayed too, so the calls it carries reach
	// Redis only after the lease, and the scenario is not the one tested.
	var dials atomic.Int64
	slowClient := redis.NewClient(&redis.Options{
		Addr: px.Addr(), ReadTimeout: 10 * time.Second, PoolSize: 2 * keys,
		// Pipelines on the same pool as single calls (go-redis has a
		// separate pipeline pool by default), so that the warm-up below
		// opens every connection a call may use.
		PipelinePoolSize: -1,
		Dialer: func(ctx context.Context, network, addr string) (net.Conn, error) {
			dials.Add(1)
			var d net.Dialer
			return d.DialContext(ctx, network, addr)
		},
	})
	slow := chaostest.GoRedisStore(t, slowClient)
	direct := goRedisStore(t, srv.Addr())
	a, err := idem.New(slow, idem.WithLease(lease))
	if err != nil {
		t.Fatal(err)
	}
	b, err := idem.New(direct, idem.WithLease(lease))
	if err != nil {
		t.Fatal(err)
	}
	// The scripts cached on the server before the delay, so that an
	// acquire is one round trip.
	if _, err := a.Do(t.Context(), idem.Key{ID: "warm-up"}, "", func(context.Context) ([]byte, error) { return nil, nil }); err != nil {
		t.Fatal(err)
	}
	// Open every connection of the slow client's pool, handshakes done,
	// before the delay, so that every acquire reaches Redis at once: only
	// its reply is late. Each connection is held by a BLPOP that times out
	// (a PING returns too soon to make the pool open more than a few). The
	// store sends a call alone or in a pipeline, one connection each, and
	// under CPU load it splits the same calls into more pipelines: without
	// this, a run that needed one connection more than the pool had dialed
	// it, and the calls on it reached Redis after the lease.
	// The pool may drop a connection while it fills (beside other test
	// processes one was seen closed by go-redis's own hook): fill it
	// again until every connection is there, a few times at most.
	for attempt := 1; ; attempt++ {
		var wg sync.WaitGroup
		for i := range 2 * keys {
			wg.Go(func() {
				err := slowClient.BLPop(t.Context(), 100*time.Millisecond, "warm-"+strconv.Itoa(i)).Err()
				if err != nil && !errors.Is(err, redis.Nil) {
					t.Error(err)
				}
			})
		}
		wg.Wait()
		n := slowClient.PoolStats().IdleConns
		if n >= uint32(2*keys) {
			break
		}
		if attempt == 5 {
			t.Fatalf("the slow client has %d idle connections after %d fills, want %d", n, attempt, 2*keys)
		}
		t.Logf("fill %d: the slow client has %d idle connections, want %d; filling again", attempt, n, 2*keys)
	}
	px.AddToxic(t, "latency", "downstream", map[string]any{"latency": delay.Milliseconds()})

	for _, control := range []bool{false, true} {
		name := "protected"
		if control {
			name = "control"
		}
		var c chaostest.Counters
		var late, liveLate, ranA, refusedA atomic.Int64
		var mu sync.Mutex
		runs := map[string]int{}
		run := func(key string) {
			mu.Lock()
			runs[key]++
			mu.Unlock()
			c.Executed.Add(1)
		}
		dials0 := dials.Load()
		var wg sync.WaitGroup
		for i := range keys {
			key := idem.Key{Scope: name, ID: fmt.Sprintf("late-%d", i)}
			c.Attempted.Add(2)
			// Owner A, through the delay.
			wg.Go(func() {
				sent := time.Now()
				op := func(ctx context.Context) {
					if time.Since(sent) >= lease {
						late.Add(1)
						if ctx.Err() == nil {
							liveLate.Add(1)
						}
					}
					ranA.Add(1)
					run(key.ID)
				}
				if control {
					// Begin as it was: acquire, and run on the reply.
					owner := fmt.Sprintf("control-%d", i)
					acq, err := slow.Acquire(t.Context(), key.Digest(), storekit.AcquireRequest{Owner: owner, Lease: lease, Retention: time.Hour})
					if err == nil && (acq.Outcome == storekit.Acquired || acq.Outcome == storekit.TakenOver) {
						op(t.Context())
						c.Acknowledged.Add(1)
					}
					return
				}
				res, err := a.Do(t.Context(), key, "", func(ctx context.Context) ([]byte, error) {
					op(ctx)
					return []byte("a"), nil
				})
				if err == nil && res.Replayed {
					t.Errorf("owner A, %s: replayed: its acquire reached Redis late", key.ID)
				}
				switch {
				case err == nil:
					c.Acknowledged.Add(1)
				case errors.Is(err, idem.ErrLeaseLost):
					refusedA.Add(1)
				case !errors.Is(err, idem.ErrInProgress):
					t.Errorf("owner A, %s: %v", key.ID, err)
				}
			})
			// Owner B, straight to Redis, once A's lease has ended on the
			// server (A's acquire reached it at once).
			wg.Go(func() {
				time.Sleep(lease + 100*time.Millisecond) // until the server's lease of A has ended
				deadline := time.Now().Add(time.Minute)
				for {
					res, err := b.Do(t.Context(), key, "", func(ctx context.Context) ([]byte, error) {
						run(key.ID)
						return []byte("b"), nil
					})
					if err == nil {
						_ = res
						c.Acknowledged.Add(1)
						return
					}
					if !errors.Is(err, idem.ErrInProgress) || time.Now().After(deadline) {
						t.Errorf("owner B, %s: %v", key.ID, err)
						return
					}
					time.Sleep(50 * time.Millisecond) // until A's lease ends
				}
			})
		}
		wg.Wait()
		if n := dials.Load() - dials0; n > 0 {
			t.Errorf("%s: the slow client dialed %d connections during the run: calls on them reached Redis late", name, n)
		}
		var dups int64
		for _, n := range runs {
			dups += int64(max(n-1, 0))
		}
		c.Effects.Store(int64(len(runs)))
		c.Duplicated.Store(dups)
		scenario := "start after lease"
		if control {
			scenario += " (control: no local deadline)"
		}
		chaostest.Report(t, scenario, command("TestStartAfterLease"), &c, map[string]string{
			"lease":                            lease.String(),
			"reply_delay":                      delay.String(),
			"owner_a_ran":                      strconv.FormatInt(ranA.Load(), 10),
			"owner_a_refused_late_reply":       strconv.FormatInt(refusedA.Load(), 10),
			"started_after_lease":              strconv.FormatInt(late.Load(), 10),
			"started_after_lease_live_context": strconv.FormatInt(liveLate.Load(), 10),
		})
		if control {
			if late.Load() == 0 || dups == 0 {
				t.Errorf("control: %d late starts and %d duplicates, want both > 0: the scenario cannot see the fault", late.Load(), dups)
			}
			continue
		}
		if late.Load() != 0 || dups != 0 || refusedA.Load() != int64(keys) {
			t.Errorf("%d operations started after their lease ended, %d keys ran twice, %d late replies refused: want 0, 0 and %d", late.Load(), dups, refusedA.Load(), keys)
		}
	}
}
