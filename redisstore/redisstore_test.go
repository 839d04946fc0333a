package redisstore_test

import (
	"context"
	"errors"
	"net"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idemgo/idem"
	"github.com/idemgo/idem/adapterkit"
	"github.com/idemgo/idem/redisstore"
	"github.com/idemgo/idem/redisstore/redisinfo"
	"github.com/idemgo/idem/storekit"
	"github.com/idemgo/idem/storetest"
	"github.com/idemgo/idem/testkit/redistest"
	"github.com/redis/go-redis/v9"
	"github.com/redis/rueidis"
)

// client is one way to reach a server: a go-redis or a rueidis client, on a
// standalone server or a Cluster.
type client struct {
	name     string
	newStore func(t *testing.T, opts ...redisstore.Option) *redisstore.Store
}

// newStore is redisstore.New on c; it fails the test, and only it, when
// the constructor refuses the server (an unsupported version, an evicting
// policy).
func newStore(t testing.TB, c redis.UniversalClient, opts ...redisstore.Option) *redisstore.Store {
	t.Helper()
	s, err := redisstore.New(c, opts...)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// newExec is idem.New on s; it fails the test on an error.
func newExec(t testing.TB, s storekit.Store, opts ...idem.Option) *idem.Executor {
	t.Helper()
	e, err := idem.New(s, opts...)
	if err != nil {
		t.Fatal(err)
	}
	return e
}

func goRedisClient(t *testing.T, addr string) *redis.Client {
	c := redis.NewClient(&redis.Options{Addr: addr, MaxRetries: -1})
	t.Cleanup(func() { c.Close() })
	return c
}

func clients(t *testing.T, standalone *redistest.Server, cluster *redistest.Cluster) []client {
	var out []client
	if standalone != nil {
		addr := standalone.Addr()
		out = append(out,
			client{"standalone/go-redis", func(t *testing.T, opts ...redisstore.Option) *redisstore.Store {
				s, err := redisstore.New(goRedisClient(t, addr), opts...)
				if err != nil {
					t.Fatal(err)
				}
				return s
			}},
		)
		for _, rc := range ruClients {
			out = append(out,
				client{"standalone/" + rc.name, func(t *testing.T, opts ...redisstore.Option) *redisstore.Store {
					return rc.mustStore(t, ruOptions{addrs: []string{addr}}, opts...)
				}},
				// With its client-side cache on: the store's replay cache
				// serves replays locally (replaycache.go).
				client{"standalone/" + rc.name + "-cached", func(t *testing.T, opts ...redisstore.Option) *redisstore.Store {
					return rc.mustStore(t, ruOptions{addrs: []string{addr}, cache: true}, opts...)
				}})
		}
	}
	if cluster != nil {
		addrs := cluster.Addrs()
		out = append(out,
			client{"cluster/go-redis", func(t *testing.T, opts ...redisstore.Option) *redisstore.Store {
				c := redis.NewClusterClient(&redis.ClusterOptions{Addrs: addrs})
				t.Cleanup(func() { c.Close() })
				s, err := redisstore.New(c, opts...)
				if err != nil {
					t.Fatal(err)
				}
				return s
			}},
		)
		for _, rc := range ruClients {
			out = append(out, client{"cluster/" + rc.name, func(t *testing.T, opts ...redisstore.Option) *redisstore.Store {
				return rc.mustStore(t, ruOptions{addrs: addrs}, opts...)
			}})
		}
	}
	return out
}

// mode is how a store runs its transitions: cached scripts (the default)
// or Redis Functions.
type mode struct {
	name string
	opts []redisstore.Option
}

var modes = []mode{{"scripts", nil}, {"functions", []redisstore.Option{redisstore.WithFunctions()}}}

// TestConformance runs the conformance suite on a real standalone
// redis-server and a real 3-master Redis Cluster, through both clients, in
// script mode and in Functions mode.
func TestConformance(t *testing.T) {
	t.Parallel()
	standalone := redistest.Start(t)
	cluster := redistest.StartCluster(t, 3)
	for _, c := range clients(t, standalone, cluster) {
		for _, m := range modes {
			t.Run(c.name+"/"+m.name, func(t *testing.T) {
				t.Parallel()
				s := c.newStore(t, m.opts...)
				storetest.Run(t, func(*testing.T) storekit.Store { return s })
			})
		}
	}
}

func acquire(t *testing.T, s storekit.Store, key string) storekit.Acquisition {
	t.Helper()
	a, err := s.Acquire(t.Context(), key, storekit.AcquireRequest{Fingerprint: "fp", Owner: "o-" + key, Lease: time.Minute, Retention: time.Hour})
	if err != nil {
		t.Fatalf("Acquire: %v", err)
	}
	return a
}

// TestScriptFlush flushes the server's script cache between calls: every
// call must go through the EVAL fallback and succeed.
func TestScriptFlush(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t, "--appendonly", "no")
	redistest.Start(t, "--replicaof", "127.0.0.1", strings.TrimPrefix(srv.Addr(), "127.0.0.1:"))
	waitReplica(t, srv)
	for _, c := range clients(t, srv, nil) {
		for _, durable := range []bool{false, true} {
			name := c.name
			var opts []redisstore.Option
			if durable {
				name += "/wait"
				opts = append(opts, redisstore.WithWait(1, 5*time.Second))
			}
			t.Run(name, func(t *testing.T) {
				s := c.newStore(t, opts...)
				for i := range 5 {
					key := idem.Key{Scope: name, ID: string(rune('a' + i))}.Digest()
					if _, err := srv.Command("SCRIPT", "FLUSH"); err != nil {
						t.Fatal(err)
					}
					a := acquire(t, s, key)
					if a.Outcome != storekit.Acquired {
						t.Fatalf("Acquire after SCRIPT FLUSH: got %v, want Acquired", a.Outcome)
					}
					if _, err := srv.Command("SCRIPT", "FLUSH"); err != nil {
						t.Fatal(err)
					}
					if err := s.Complete(t.Context(), key, a.Lease, []byte("r"), time.Hour); err != nil {
						t.Fatalf("Complete after SCRIPT FLUSH: %v", err)
					}
					if _, err := srv.Command("SCRIPT", "FLUSH"); err != nil {
						t.Fatal(err)
					}
					if rec, err := s.Get(t.Context(), key); err != nil || rec.State != storekit.StateCompleted {
						t.Fatalf("Get after SCRIPT FLUSH: got %+v, %v", rec, err)
					}
				}
			})
		}
	}
}

func waitReplica(t *testing.T, primary *redistest.Server) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		info, err := primary.Command("INFO", "replication")
		if err == nil && strings.Contains(info, "connected_slaves:1") && strings.Contains(info, "state=online") {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("replica did not come online: %s %v", info, err)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// TestWait checks the WAIT durability option against a real replica: with
// the replica up, acquire and complete are acknowledged; with the replica
// paused they still happen on the primary and report ErrNotDurable.
func TestWait(t *testing.T) {
	t.Parallel()
	primary := redistest.Start(t)
	replica := redistest.Start(t, "--replicaof", "127.0.0.1", strings.TrimPrefix(primary.Addr(), "127.0.0.1:"))
	waitReplica(t, primary)
	for _, c := range clients(t, primary, nil) {
		t.Run(c.name, func(t *testing.T) {
			s := c.newStore(t, redisstore.WithWait(1, 2*time.Second))
			key := idem.Key{Scope: c.name, ID: "durable"}.Digest()
			a := acquire(t, s, key)
			if a.Outcome != storekit.Acquired {
				t.Fatalf("Acquire: got %v", a.Outcome)
			}
			if err := s.Complete(t.Context(), key, a.Lease, []byte("r"), time.Hour); err != nil {
				t.Fatalf("Complete with a live replica: %v", err)
			}
			// The replica holds the completed record: read it there.
			onReplica := newStore(t, goRedisClient(t, replica.Addr()))
			if rec, err := onReplica.Get(t.Context(), key); err != nil || rec.State != storekit.StateCompleted || string(rec.Result) != "r" {
				t.Fatalf("record on the replica: got %+v, %v, want COMPLETED \"r\"", rec, err)
			}
		})
	}
	replica.Pause(t)
	defer replica.Resume(t)
	for _, c := range clients(t, primary, nil) {
		t.Run(c.name+"/replica-paused", func(t *testing.T) {
			s := c.newStore(t, redisstore.WithWait(1, 100*time.Millisecond))
			key := idem.Key{Scope: c.name, ID: "not durable"}.Digest()
			a, err := s.Acquire(t.Context(), key, storekit.AcquireRequest{Fingerprint: "fp", Owner: "o", Lease: time.Minute, Retention: time.Hour})
			if !errors.Is(err, idem.ErrNotDurable) {
				t.Fatalf("Acquire with the replica paused: got %v, want ErrNotDurable", err)
			}
			if a.Outcome != storekit.Acquired {
				t.Fatalf("Acquire outcome: got %v, want Acquired (it happened on the primary)", a.Outcome)
			}
			err = s.Complete(t.Context(), key, a.Lease, []byte("r"), time.Hour)
			if !errors.Is(err, idem.ErrNotDurable) {
				t.Fatalf("Complete with the replica paused: got %v, want ErrNotDurable", err)
			}
		})
	}
}

// TestWaitAOFUnsupported checks that a store with WithWaitAOF is refused
// on a server older than 7.2, which lacks WAITAOF, with a *VersionError
// that says so, instead of failing every acquire; and, on 7.2 and later,
// that New and NewRueidis agree with CheckWaitAOF (what idem doctor
// reports): a server whose WAITAOF acknowledges early under appendfsync
// everysec is refused, and accepted under always.
func TestWaitAOFUnsupported(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t, "--appendonly", "yes", "--appendfsync", "everysec")
	version, _ := srv.Command("INFO", "server")
	if !strings.Contains(version, "redis_version:7.0") && !strings.Contains(version, "redis_version:7.1") {
		chk, err := redisstore.CheckWaitAOF(t.Context(), goRedisClient(t, srv.Addr()), "idem:")
		if err != nil {
			t.Fatal(err)
		}
		t.Logf("CheckWaitAOF: %+v", chk)
		if name, v := redisinfo.Server(redisinfo.Parse(version)); redisinfo.EarlyWAITAOF(name, v) != chk.Known {
			t.Errorf("CheckWaitAOF on %s %s: got %+v, want Known %t", name, v, chk, !chk.Known)
		}
		if chk.Early {
			ru := srv.Rueidis(t)
			_, grErr := redisstore.New(goRedisClient(t, srv.Addr()), redisstore.WithWaitAOF(1, 0, time.Second))
			_, ruErr := redisstore.NewRueidis(ru, redisstore.WithWaitAOF(1, 0, time.Second))
			for _, err := range []error{grErr, ruErr} {
				var we *redisstore.WaitAOFError
				if !errors.As(err, &we) || we.Server != chk.Server {
					t.Errorf("WithWaitAOF on %s with appendfsync everysec: got %v, want a *WaitAOFError", chk.Server, err)
				}
			}
			srv.Do(t, "CONFIG", "SET", "appendfsync", "always")
		}
		// On 7.2 and later WAITAOF works: check it acknowledges.
		for _, c := range clients(t, srv, nil) {
			s := c.newStore(t, redisstore.WithWaitAOF(1, 0, time.Second))
			key := idem.Key{Scope: c.name, ID: "aof"}.Digest()
			if a := acquire(t, s, key); a.Outcome != storekit.Acquired {
				t.Fatalf("Acquire: got %v", a.Outcome)
			}
		}
		return
	}
	ru := srv.Rueidis(t)
	for name, newStore := range map[string]func() (*redisstore.Store, error){
		"go-redis": func() (*redisstore.Store, error) {
			return redisstore.New(goRedisClient(t, srv.Addr()), redisstore.WithWaitAOF(1, 0, time.Second))
		},
		"rueidis": func() (*redisstore.Store, error) {
			return redisstore.NewRueidis(ru, redisstore.WithWaitAOF(1, 0, time.Second))
		},
		"valkey": func() (*redisstore.Store, error) {
			return ruClients[1].store(t, ruOptions{addrs: []string{srv.Addr()}}, redisstore.WithWaitAOF(1, 0, time.Second))
		},
	} {
		_, err := newStore()
		var ve *redisstore.VersionError
		if !errors.As(err, &ve) || ve.Need != "7.2" || !strings.Contains(err.Error(), "WAITAOF") {
			t.Errorf("%s: WithWaitAOF on Redis 7.0: got %v, want a *VersionError that needs 7.2 for WAITAOF", name, err)
		}
	}
}

// TestAcquireNewKeyRepliesItsFence checks the short reply of acquire.lua
// for a new key, its most frequent call: the fence alone, an integer (a
// table costs Redis more per call; BENCHMARKS.md), which the store reads as
// Acquired with one attempt and the record holds.
func TestAcquireNewKeyRepliesItsFence(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t)
	c := goRedisClient(t, srv.Addr())
	s := newStore(t, c)
	key := idem.Key{ID: "new"}.Digest()
	v, err := c.Eval(t.Context(), redisstore.AcquireSource(), []string{s.Key(key)}, "fp", "owner", "60000", "120000").Result()
	if err != nil {
		t.Fatal(err)
	}
	fence, ok := v.(int64)
	if !ok || fence <= 0 {
		t.Fatalf("acquire.lua on a new key replied %#v, want the fence alone (a positive integer)", v)
	}
	rec, err := s.Get(t.Context(), key)
	if err != nil {
		t.Fatal(err)
	}
	if rec.State != storekit.StateInProgress || rec.Fence != fence || rec.Attempts != 1 || rec.Owner != "owner" {
		t.Fatalf("record after the new key's acquire: got %+v, want IN_PROGRESS, fence %d, 1 attempt, owner %q", rec, fence, "owner")
	}
	// The same owner's repeated call (a lost reply) gets the long form.
	a, err := s.Acquire(t.Context(), key, storekit.AcquireRequest{Fingerprint: "fp", Owner: "owner", Lease: time.Minute, Retention: time.Minute})
	if err != nil || a.Outcome != storekit.Acquired || a.Lease.Fence != fence || a.Attempts != 1 {
		t.Fatalf("repeated acquire: got %+v, %v; want Acquired, fence %d, 1 attempt", a, err, fence)
	}
}

// TestScriptErrorWritesNothing runs a script with arguments that Go would
// never send (validation stops them first): the script fails before its
// first write, so no half-written record is left.
func TestScriptErrorWritesNothing(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t)
	c := goRedisClient(t, srv.Addr())
	s := newStore(t, c)
	key := idem.Key{ID: "bad"}.Digest()
	// Lease "abc": acquire.lua fails at tonumber arithmetic.
	err := c.Eval(t.Context(), redisstore.AcquireSource(), []string{s.Key(key)}, "fp", "owner", "abc", "1000").Err()
	if err == nil {
		t.Fatal("acquire.lua with a non-numeric lease succeeded")
	}
	if n, _ := c.Exists(t.Context(), s.Key(key)).Result(); n != 0 {
		t.Fatalf("a failed script left a record: EXISTS = %d", n)
	}
	// A value in another format is refused, not misread or overwritten.
	if err := c.Set(t.Context(), s.Key(key), "garbage", 0).Err(); err != nil {
		t.Fatal(err)
	}
	_, err = s.Acquire(t.Context(), key, storekit.AcquireRequest{Fingerprint: "fp", Owner: "o", Lease: time.Minute, Retention: time.Hour})
	if err == nil || !strings.Contains(err.Error(), "unknown record format") {
		t.Fatalf("Acquire over a foreign value: got %v, want an unknown-format error", err)
	}
	if v, _ := c.Get(t.Context(), s.Key(key)).Result(); v != "garbage" {
		t.Fatalf("the foreign value was overwritten: %q", v)
	}
	c.Del(t.Context(), s.Key(key))
	// And the store refuses such input before Redis sees it.
	calls := commandCalls(t, srv)
	if _, err := s.Acquire(t.Context(), key, storekit.AcquireRequest{Fingerprint: "fp", Owner: "o", Lease: 0, Retention: time.Hour}); !errors.Is(err, idem.ErrInvalid) {
		t.Fatalf("Acquire with zero lease: got %v, want ErrInvalid", err)
	}
	if got := commandCalls(t, srv); got != calls {
		t.Fatalf("bad input reached Redis: %d commands before, %d after", calls, got)
	}
}

// commandCalls returns the number of EVAL and EVALSHA calls the server ran.
func commandCalls(t *testing.T, srv *redistest.Server) int {
	t.Helper()
	info, err := srv.Command("INFO", "commandstats")
	if err != nil {
		t.Fatal(err)
	}
	total := 0
	for _, line := range strings.Split(info, "\n") {
		if strings.HasPrefix(line, "cmdstat_eval") {
			i := strings.Index(line, "calls=")
			var n int
			for _, r := range line[i+6:] {
				if r < '0' || r > '9' {
					break
				}
				n = n*10 + int(r-'0')
			}
			total += n
		}
	}
	return total
}

// TestServerRestart kills redis-server during a run: calls fail with a
// clear, wrapped error and do not hang; after the restart the store works
// again and the completed records survived (appendonly); no goroutine is
// left behind once the stores and the clients are closed.
func TestServerRestart(t *testing.T) {
	srv := redistest.Start(t, "--appendonly", "yes", "--appendfsync", "always")
	before := runtime.NumGoroutine()
	func() {
		gr := redis.NewClient(&redis.Options{Addr: srv.Addr(), MaxRetries: -1, DialTimeout: 200 * time.Millisecond})
		defer gr.Close()
		ru, err := rueidis.NewClient(rueidis.ClientOption{InitAddress: []string{srv.Addr()}, DisableCache: true, Dialer: net.Dialer{Timeout: 200 * time.Millisecond}})
		if err != nil {
			t.Fatal(err)
		}
		defer ru.Close()
		s1 := newStore(t, gr)
		defer s1.Close() // its replay cache's tracking connection
		s2, err := redisstore.NewRueidis(ru)
		if err != nil {
			t.Fatal(err)
		}
		for _, s := range []*redisstore.Store{s1, s2} {
			exec := newExec(t, s)
			done := idem.Key{ID: "before the crash"}
			// The two stores share the server: the second replays.
			if _, err := exec.Do(t.Context(), done, "", func(context.Context) ([]byte, error) { return []byte("kept"), nil }); err != nil {
				t.Fatal(err)
			}
		}
		srv.Kill(t)
		for _, s := range []*redisstore.Store{s1, s2} {
			ctx, cancel := context.WithTimeout(t.Context(), 5*time.Second)
			start := time.Now()
			_, err := s.Acquire(ctx, idem.Key{ID: "during"}.Digest(), storekit.AcquireRequest{Fingerprint: "", Owner: "o", Lease: time.Second, Retention: time.Hour})
			cancel()
			if err == nil || !strings.Contains(err.Error(), "redisstore: acquire:") {
				t.Fatalf("Acquire with the server down: got %v, want a wrapped error", err)
			}
			if time.Since(start) > 5*time.Second {
				t.Fatalf("Acquire with the server down took %v", time.Since(start))
			}
		}
		srv.Restart(t)
		// A client finds out that a connection of before the restart is
		// dead when it next uses it (rueidis spreads calls over several
		// connections at random): each call is repeated until it succeeds,
		// for at most 10s.
		for _, s := range []*redisstore.Store{s1, s2} {
			rec, err := untilNoError(func() (storekit.Record, error) {
				return s.Get(t.Context(), idem.Key{ID: "before the crash"}.Digest())
			})
			if err != nil || rec.State != storekit.StateCompleted {
				t.Fatalf("after restart: got %+v, %v, want the COMPLETED record", rec, err)
			}
			key := idem.Key{ID: "after"}.Digest()
			a, err := untilNoError(func() (storekit.Acquisition, error) {
				return s.Acquire(t.Context(), key, storekit.AcquireRequest{Fingerprint: "fp", Owner: "o-" + key, Lease: time.Minute, Retention: time.Hour})
			})
			if err != nil {
				t.Fatalf("Acquire after restart: %v", err)
			}
			if a.Outcome != storekit.Acquired && a.Outcome != storekit.InProgress {
				t.Fatalf("Acquire after restart: got %v", a.Outcome)
			}
		}
	}()
	deadline := time.Now().Add(10 * time.Second)
	for runtime.NumGoroutine() > before {
		if time.Now().After(deadline) {
			buf := make([]byte, 1<<16)
			n := runtime.Stack(buf, true)
			t.Fatalf("goroutines: %d before, %d after closing the clients\n%s", before, runtime.NumGoroutine(), buf[:n])
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// untilNoError calls f until it returns no error, for at most 10s, and
// returns its last answer.
func untilNoError[T any](f func() (T, error)) (T, error) {
	deadline := time.Now().Add(10 * time.Second)
	for {
		v, err := f()
		if err == nil || time.Now().After(deadline) {
			return v, err
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// TestAwaitIsWokenByNotification holds a key in one process-like executor
// and awaits it from another store on another connection: the waiter wakes
// when the owner completes, long before the lease would end.
func TestAwaitIsWokenByNotification(t *testing.T) {
	t.Parallel()
	standalone := redistest.Start(t)
	cluster := redistest.StartCluster(t, 3)
	for _, c := range clients(t, standalone, cluster) {
		t.Run(c.name, func(t *testing.T) {
			owner := newExec(t, c.newStore(t), idem.WithLease(time.Minute))
			waiter := newExec(t, c.newStore(t), idem.WithLease(time.Minute))
			key := idem.Key{Scope: c.name, ID: "awaited"}
			_, a, err := owner.Begin(t.Context(), key, "")
			if err != nil {
				t.Fatal(err)
			}
			woke := make(chan time.Duration, 1)
			var started sync.WaitGroup
			started.Add(1)
			go func() {
				started.Done()
				start := time.Now()
				if err := waiter.Await(t.Context(), key); err != nil {
					t.Error(err)
				}
				woke <- time.Since(start)
			}()
			started.Wait()
			// Let the waiter subscribe; Await must return only after the
			// commit, whenever it subscribed.
			time.Sleep(50 * time.Millisecond)
			select {
			case d := <-woke:
				t.Fatalf("Await returned after %v while the key was held", d)
			default:
			}
			if err := a.Commit(t.Context(), []byte("done")); err != nil {
				t.Fatal(err)
			}
			select {
			case d := <-woke:
				if d > 900*time.Millisecond {
					t.Fatalf("Await took %v: woken by its fallback timer, not the notification", d)
				}
			case <-time.After(5 * time.Second):
				t.Fatal("Await did not return after the commit")
			}
			r, err := waiter.Do(t.Context(), key, "", func(context.Context) ([]byte, error) { return nil, errors.New("ran twice") })
			if err != nil || !r.Replayed || string(r.Value) != "done" {
				t.Fatalf("Do after Await: got %+v, %v, want the replay", r, err)
			}
		})
	}
}

// TestRawKeysNeverReachRedis checks the layout: one hash per key at
// <prefix>{<digest>}, short fixed fields, and no trace of the raw key.
func TestRawKeysNeverReachRedis(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t)
	c := goRedisClient(t, srv.Addr())
	s := newStore(t, c, redisstore.WithPrefix("app:"))
	exec := newExec(t, s)
	raw := "customer-42/secret-order-id"
	if _, err := exec.Do(t.Context(), idem.Key{Scope: "charges", ID: raw}, "fp", func(context.Context) ([]byte, error) { return []byte("ok"), nil }); err != nil {
		t.Fatal(err)
	}
	keys, err := c.Keys(t.Context(), "*").Result()
	if err != nil {
		t.Fatal(err)
	}
	want := "app:{" + idem.Key{Scope: "charges", ID: raw}.Digest() + "}"
	if len(keys) != 1 || keys[0] != want {
		t.Fatalf("keys: got %v, want [%s]", keys, want)
	}
	if typ, err := c.Type(t.Context(), want).Result(); err != nil || typ != "string" {
		t.Fatalf("record type: got %q, %v, want a string", typ, err)
	}
	value, err := c.Get(t.Context(), want).Result()
	if err != nil {
		t.Fatal(err)
	}
	if strings.Contains(value, raw) || strings.Contains(value, "charges") {
		t.Errorf("the record holds the raw key or scope: %q", value)
	}
	if len(value) > 120 {
		t.Errorf("a completed record with a 2-byte result takes %d bytes, want a compact record", len(value))
	}
	if ttl, _ := c.PTTL(t.Context(), want).Result(); ttl <= 0 || ttl > adapterkit.DefaultRetention {
		t.Errorf("TTL of a completed record: got %v, want (0, %v]", ttl, adapterkit.DefaultRetention)
	}
	if _, err := redisstore.New(c, redisstore.WithPrefix("bad{")); !errors.Is(err, idem.ErrInvalid) {
		t.Errorf("prefix with a brace: got %v, want ErrInvalid", err)
	}
}

// TestConcurrentExecutors runs many executors on separate connections
// against one key space: each key's function runs exactly once.
func TestConcurrentExecutors(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t)
	for _, c := range clients(t, srv, nil) {
		t.Run(c.name, func(t *testing.T) {
			var runs [20]atomic.Int32
			var wg sync.WaitGroup
			for w := range 8 {
				exec := newExec(t, c.newStore(t))
				wg.Add(1)
				go func() {
					defer wg.Done()
					for i := range 20 * 10 {
						k := i % 20
						key := idem.Key{Scope: c.name, ID: string(rune('A' + k))}
						for {
							_, err := exec.Do(t.Context(), key, "", func(context.Context) ([]byte, error) {
								runs[k].Add(1)
								return []byte{byte(w)}, nil
							})
							if errors.Is(err, idem.ErrInProgress) {
								if err := exec.Await(t.Context(), key); err != nil {
									t.Error(err)
									return
								}
								continue
							}
							if err != nil {
								t.Error(err)
								return
							}
							break
						}
					}
				}()
			}
			wg.Wait()
			for k := range runs {
				if n := runs[k].Load(); n != 1 {
					t.Errorf("key %d ran %d times, want 1", k, n)
				}
			}
		})
	}
}

// TestList lists records with SCAN on a standalone server and a Cluster,
// through both clients: every record of the store's prefix and nothing
// else, up to the limit.
func TestList(t *testing.T) {
	t.Parallel()
	standalone := redistest.Start(t)
	cluster := redistest.StartCluster(t, 3)
	for _, c := range clients(t, standalone, cluster) {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			// A prefix with glob characters: unescaped, its pattern would
			// also match the neighbour's records.
			prefix := "ls*" + c.name + ":"
			s := c.newStore(t, redisstore.WithPrefix(prefix))
			neighbour := c.newStore(t, redisstore.WithPrefix("lsX"+c.name+":"))
			want := map[string]storekit.State{}
			for i := range 25 {
				key := idem.Key{Scope: "list", ID: string(rune('a' + i))}.Digest()
				a := acquire(t, s, key)
				want[key] = storekit.StateInProgress
				if i%2 == 0 {
					if err := s.Complete(t.Context(), key, a.Lease, []byte("r"), time.Hour); err != nil {
						t.Fatal(err)
					}
					want[key] = storekit.StateCompleted
				}
				acquire(t, neighbour, key)
			}
			if _, err := s.List(t.Context(), 0); !errors.Is(err, idem.ErrInvalid) {
				t.Errorf("List(0): got %v, want ErrInvalid", err)
			}
			all, err := s.List(t.Context(), 1000)
			if err != nil {
				t.Fatal(err)
			}
			if len(all) != len(want) {
				t.Fatalf("List: got %d entries, want %d", len(all), len(want))
			}
			for _, e := range all {
				st, ok := want[e.Key]
				if !ok || e.Record.State != st || e.Record.Fence <= 0 {
					t.Errorf("entry %s: got %v fence %d, want %v (listed: %v)", e.Key, e.Record.State, e.Record.Fence, st, ok)
				}
				if st == storekit.StateCompleted && string(e.Record.Result) != "r" {
					t.Errorf("entry %s: got result %q, want \"r\"", e.Key, e.Record.Result)
				}
			}
			some, err := s.List(t.Context(), 3)
			if err != nil || len(some) != 3 {
				t.Errorf("List(3): got %d entries, %v, want 3", len(some), err)
			}
		})
	}
}

// TestListPipelinesReads: List (and so the store's gauges, which read a
// sample of up to StatsSample records per scrape) reads the records it
// found in pipelines, not one round trip per record.
func TestListPipelinesReads(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t)
	c := redis.NewClient(&redis.Options{Addr: srv.Addr()})
	t.Cleanup(func() { _ = c.Close() })
	s, err := redisstore.New(c)
	if err != nil {
		t.Fatal(err)
	}
	const n = 600
	for i := range n {
		acquire(t, s, idem.Key{Scope: "lp", ID: strconv.Itoa(i)}.Digest())
	}
	if _, err := s.Get(t.Context(), idem.Key{Scope: "lp", ID: "0"}.Digest()); err != nil {
		t.Fatal(err) // loads the get script, so that no NOSCRIPT retry is counted
	}
	rt := &roundTrips{}
	c.AddHook(rt)
	all, err := s.List(t.Context(), n)
	if err != nil {
		t.Fatal(err)
	}
	if len(all) != n {
		t.Fatalf("List: got %d entries, want %d", len(all), n)
	}
	var gets, pipelines int
	for _, name := range rt.names {
		switch {
		case strings.HasPrefix(name, "pipeline of") && strings.HasSuffix(name, " evalsha"):
			pipelines++
		case name == "evalsha" || name == "eval":
			gets++
		}
	}
	if gets != 0 || pipelines > (n+255)/256 {
		t.Errorf("List read %d records with %d calls of their own and %d pipelines, want none and at most %d: %v", n, gets, pipelines, (n+255)/256, rt.names)
	}
}
