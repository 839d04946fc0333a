package redisstore_test

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/idemgo/idem"
	"github.com/idemgo/idem/adapterkit"
	"github.com/idemgo/idem/consumer"
	"github.com/idemgo/idem/redisstore"
	"github.com/idemgo/idem/storekit"
	"github.com/idemgo/idem/testkit/redistest"
	"github.com/redis/go-redis/v9"
)

// The effects of these tests. Each checks its input before its first
// write.
var testEffects = []redisstore.Option{
	// count adds ARGV[1] to the counter KEYS[1] and appends the fence to
	// the list KEYS[2].
	redisstore.WithEffect("count", `
local n = tonumber(ARGV[1])
if not n then return redis.error_reply('not a number: ' .. tostring(ARGV[1])) end
redis.call('INCRBY', KEYS[1], n)
redis.call('RPUSH', KEYS[2], FENCE)`),
	// half_written writes, then fails: what "validate before the first
	// write" guards against.
	redisstore.WithEffect("half_written", `
redis.call('SET', KEYS[1], 'written')
redis.call('HSET', KEYS[2], 'f', 'v')
redis.call('INCR', KEYS[2])`),
	// half adds 1 to the counter KEYS[1], then fails as ARGV[1] says: a
	// command that Redis refuses (a hash command on the counter), an
	// error reply of its own, or a Lua error.
	redisstore.WithEffect("half", `
redis.call('INCR', KEYS[1])
if ARGV[1] == 'wrongtype' then redis.call('HSET', KEYS[1], 'f', 'v') end
if ARGV[1] == 'reply' then return redis.error_reply('refused after the write') end
error('a Lua error after the write')`),
	// checked reads the counter KEYS[1] and refuses before any write.
	redisstore.WithEffect("checked", `
local n = redis.call('GET', KEYS[1])
redis.pcall('HGET', KEYS[1], 'f')
if not n then return redis.error_reply('no counter') end
redis.call('INCR', KEYS[1])`),
}

// emptyResult is the Executor's encoding of an empty value.
var emptyResult = []byte{0}

func effectStore(t *testing.T, c client, m mode, opts ...redisstore.Option) *redisstore.Store {
	t.Helper()
	all := append(append(append([]redisstore.Option{}, m.opts...), testEffects...), opts...)
	return c.newStore(t, all...)
}

// rawClient returns a go-redis client on the test's standalone server or
// Cluster, for reading what the effects wrote.
func rawClient(t *testing.T, c client, standalone *redistest.Server, cluster *redistest.Cluster) redis.UniversalClient {
	if strings.HasPrefix(c.name, "cluster") {
		r := redis.NewClusterClient(&redis.ClusterOptions{Addrs: cluster.Addrs()})
		t.Cleanup(func() { r.Close() })
		return r
	}
	return goRedisClient(t, standalone.Addr())
}

// count is the effect "count" for key, on keys named after it (a store
// with a hash tag gives every record the same tag).
func count(t *testing.T, s *redisstore.Store, key idem.Key) storekit.Effect {
	name := key.Scope + "/" + key.ID
	return storekit.Effect{Name: "count", Keys: []string{s.EffectKey(key, name+":counter"), s.EffectKey(key, name+":fences")}, Args: []string{"1"}}
}

// TestEffectAppliedOnce applies an effect with the completion, repeats the
// completion as after a lost reply, and runs the key again through the
// Executor: the effect is applied once, with the fence of its completion.
func TestEffectAppliedOnce(t *testing.T) {
	t.Parallel()
	standalone := redistest.Start(t)
	cluster := redistest.StartCluster(t, 3)
	for _, c := range clients(t, standalone, cluster) {
		for _, m := range modes {
			t.Run(c.name+"/"+m.name, func(t *testing.T) {
				t.Parallel()
				s := effectStore(t, c, m)
				raw := rawClient(t, c, standalone, cluster)
				ctx := t.Context()
				key := idem.Key{Scope: c.name + m.name, ID: "once"}
				e := count(t, s, key)
				a := acquire(t, s, key.Digest())
				for i := range 3 {
					if err := s.CompleteEffect(ctx, key.Digest(), a.Lease, emptyResult, time.Hour, e); err != nil {
						t.Fatalf("CompleteEffect #%d: %v", i+1, err)
					}
				}
				exec, err := idem.New(s)
				if err != nil {
					t.Fatal(err)
				}
				res, err := exec.Do(ctx, key, "fp", func(ctx context.Context) ([]byte, error) {
					t.Error("the operation ran again")
					return nil, nil
				})
				if err != nil || !res.Replayed {
					t.Fatalf("Do after the completion: got %+v, %v, want a replay", res, err)
				}
				if n, _ := raw.Get(ctx, e.Keys[0]).Int(); n != 1 {
					t.Fatalf("counter: got %d, want 1", n)
				}
				fences, _ := raw.LRange(ctx, e.Keys[1], 0, -1).Result()
				if want := fmt.Sprint(a.Lease.Fence); len(fences) != 1 || fences[0] != want {
					t.Fatalf("fences: got %v, want [%s]", fences, want)
				}
				rec, err := s.Get(ctx, key.Digest())
				if err != nil || rec.State != storekit.StateCompleted || string(rec.Result) != string(emptyResult) {
					t.Fatalf("record: got %+v, %v", rec, err)
				}
			})
		}
	}
}

// TestEffectThroughDo attaches the effect with idem.SetEffect in Do and
// Typed.Do; duplicates apply nothing.
func TestEffectThroughDo(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t)
	for _, c := range clients(t, srv, nil) {
		for _, m := range modes {
			t.Run(c.name+"/"+m.name, func(t *testing.T) {
				s := effectStore(t, c, m)
				raw := goRedisClient(t, srv.Addr())
				exec, err := idem.New(s)
				if err != nil {
					t.Fatal(err)
				}
				key := idem.Key{Scope: c.name + m.name, ID: "do"}
				typed := idem.Typed[int]{Executor: exec}
				for range 5 {
					v, _, err := typed.Do(t.Context(), key, "", func(ctx context.Context) (int, error) {
						return 42, idem.SetEffect(ctx, count(t, s, key))
					})
					if err != nil || v != 42 {
						t.Fatalf("Typed.Do: got %d, %v", v, err)
					}
				}
				if n, _ := raw.Get(t.Context(), count(t, s, key).Keys[0]).Int(); n != 1 {
					t.Fatalf("counter: got %d, want 1", n)
				}
			})
		}
	}
}

// TestEffectStaleOwner lets a lease expire and another owner take the key
// over: the stale owner's completion applies nothing and writes nothing.
func TestEffectStaleOwner(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t)
	for _, c := range clients(t, srv, nil) {
		for _, m := range modes {
			t.Run(c.name+"/"+m.name, func(t *testing.T) {
				s := effectStore(t, c, m)
				raw := goRedisClient(t, srv.Addr())
				ctx := t.Context()
				key := idem.Key{Scope: c.name + m.name, ID: "stale"}
				req := func(owner string) storekit.AcquireRequest {
					return storekit.AcquireRequest{Fingerprint: "fp", Owner: owner, Lease: 20 * time.Millisecond, Retention: time.Hour}
				}
				old, err := s.Acquire(ctx, key.Digest(), req("old"))
				if err != nil || old.Outcome != storekit.Acquired {
					t.Fatalf("Acquire: %+v, %v", old, err)
				}
				var taken storekit.Acquisition
				for deadline := time.Now().Add(5 * time.Second); taken.Outcome != storekit.TakenOver; {
					if time.Now().After(deadline) {
						t.Fatalf("no takeover: last %+v", taken)
					}
					if taken, err = s.Acquire(ctx, key.Digest(), req("new")); err != nil {
						t.Fatal(err)
					}
				}
				e := count(t, s, key)
				err = s.CompleteEffect(ctx, key.Digest(), old.Lease, []byte("old"), time.Hour, e)
				if !errors.Is(err, idem.ErrLeaseLost) {
					t.Fatalf("stale CompleteEffect: got %v, want ErrLeaseLost", err)
				}
				if n, _ := raw.Exists(ctx, e.Keys...).Result(); n != 0 {
					t.Fatalf("the stale owner's effect was applied: %d keys exist", n)
				}
				if err := s.CompleteEffect(ctx, key.Digest(), taken.Lease, []byte("new"), time.Hour, e); err != nil {
					t.Fatalf("new owner's CompleteEffect: %v", err)
				}
				if n, _ := raw.Get(ctx, e.Keys[0]).Int(); n != 1 {
					t.Fatalf("counter: got %d, want 1", n)
				}
			})
		}
	}
}

// TestEffectErrorWritesNoCompletion: an effect that refuses (error reply)
// or reads and refuses before its first write, and one whose first write
// Redis refuses, leave the record IN_PROGRESS, write nothing and answer
// idem.ErrEffect; one that fails after it wrote (Redis keeps what it wrote)
// ends the record FAILED in the same call and answers
// idem.ErrEffectPartial, again when the call is repeated.
func TestEffectErrorWritesNoCompletion(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t)
	for _, c := range clients(t, srv, nil) {
		for _, m := range modes {
			t.Run(c.name+"/"+m.name, func(t *testing.T) {
				s := effectStore(t, c, m)
				raw := goRedisClient(t, srv.Addr())
				ctx := t.Context()
				half := func(how string) func(key idem.Key) storekit.Effect {
					return func(key idem.Key) storekit.Effect {
						return storekit.Effect{Name: "half", Keys: []string{s.EffectKey(key, "n")}, Args: []string{how}}
					}
				}
				for _, tc := range []struct {
					name    string
					effect  func(key idem.Key) storekit.Effect
					setup   func(key idem.Key)
					message string
					partial bool
					kept    int64 // keys of the effect that exist after
				}{
					{"refused", func(key idem.Key) storekit.Effect {
						e := count(t, s, key)
						e.Args = []string{"many"}
						return e
					}, nil, "not a number: many", false, 0},
					{"read and refused", func(key idem.Key) storekit.Effect {
						return storekit.Effect{Name: "checked", Keys: []string{s.EffectKey(key, "n")}}
					}, nil, "no counter", false, 0},
					{"first write raised", func(key idem.Key) storekit.Effect { return count(t, s, key) }, func(key idem.Key) {
						raw.HSet(ctx, count(t, s, key).Keys[0], "not", "a counter")
					}, "WRONGTYPE", false, 1},
					{"half written", func(key idem.Key) storekit.Effect {
						return storekit.Effect{Name: "half_written", Keys: []string{s.EffectKey(key, "a"), s.EffectKey(key, "b")}}
					}, nil, "WRONGTYPE", true, 2},
					{"raised after a write", half("wrongtype"), nil, "WRONGTYPE", true, 1},
					{"refused after a write", half("reply"), nil, "refused after the write", true, 1},
					{"Lua error after a write", half("lua"), nil, "a Lua error after the write", true, 1},
				} {
					key := idem.Key{Scope: c.name + m.name, ID: tc.name}
					if tc.setup != nil {
						tc.setup(key)
					}
					e := tc.effect(key)
					a := acquire(t, s, key.Digest())
					for call := range 2 {
						err := s.CompleteEffect(ctx, key.Digest(), a.Lease, []byte("r"), time.Hour, e)
						var ee *storekit.EffectError
						if !errors.As(err, &ee) || ee.Name != e.Name || (call == 0 && !strings.Contains(ee.Message, tc.message)) {
							t.Fatalf("%s, call %d: got %v, want an *storekit.EffectError with %q", tc.name, call, err, tc.message)
						}
						if ee.Partial != tc.partial || errors.Is(err, idem.ErrEffectPartial) != tc.partial || !errors.Is(err, idem.ErrEffect) {
							t.Fatalf("%s, call %d: got %v (partial %t), want partial %t", tc.name, call, err, ee.Partial, tc.partial)
						}
						if storekit.OutcomeUnknown(err) {
							t.Fatalf("%s: an effect error leaves the outcome unknown", tc.name)
						}
						if !tc.partial {
							break
						}
					}
					want := storekit.StateInProgress
					if tc.partial {
						want = storekit.StateFailed
					}
					rec, err := s.Get(ctx, key.Digest())
					if err != nil || rec.State != want {
						t.Fatalf("%s: record: got %v, %v, want %v", tc.name, rec.State, err, want)
					}
					if n, _ := raw.Exists(ctx, e.Keys...).Result(); n != tc.kept {
						t.Fatalf("%s: got %d keys of the effect, want %d", tc.name, n, tc.kept)
					}
				}
			})
		}
	}
}

// TestEffectFailedHalfWayRunsOnce: an operation whose effect fails after
// its first write, retried through Do, runs (and applies that write) once:
// the first call returns idem.ErrEffectPartial marked terminal, the
// retries a replayed *idem.FailedError that says so. Through Do and
// CommitBatch.
func TestEffectFailedHalfWayRunsOnce(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t)
	const retries = 3
	for _, c := range clients(t, srv, nil) {
		for _, m := range modes {
			t.Run(c.name+"/"+m.name, func(t *testing.T) {
				s := effectStore(t, c, m)
				raw := goRedisClient(t, srv.Addr())
				exec, err := idem.New(s)
				if err != nil {
					t.Fatal(err)
				}
				ctx := t.Context()
				for _, how := range []string{"wrongtype", "reply", "lua"} {
					key := idem.Key{Scope: c.name + m.name, ID: how}
					counter := s.EffectKey(key, "n")
					runs := 0
					for i := range retries {
						_, err := exec.Do(ctx, key, "fp", func(ctx context.Context) ([]byte, error) {
							runs++
							return []byte("v"), idem.SetEffect(ctx, storekit.Effect{Name: "half", Keys: []string{counter}, Args: []string{how}})
						})
						var fe *idem.FailedError
						switch {
						case i == 0 && (!errors.Is(err, idem.ErrEffectPartial) || !idem.IsTerminal(err)):
							t.Fatalf("%s: first Do: got %v, want a terminal ErrEffectPartial", how, err)
						case i > 0 && (!errors.As(err, &fe) || !fe.Replayed || !strings.Contains(fe.Message, "may have partly applied")):
							t.Fatalf("%s: Do #%d: got %v, want a replayed *idem.FailedError that says the effect may have partly applied", how, i+1, err)
						}
					}
					if n, _ := raw.Get(ctx, counter).Int(); n != 1 || runs != 1 {
						t.Fatalf("%s: %d runs, counter %d after %d tries; want 1 and 1", how, runs, n, retries)
					}
				}

				// CommitBatch: the attempt whose effect fails half way gets
				// ErrEffectPartial and its key FAILED; the other completes.
				keys := []idem.Key{{Scope: c.name + m.name + "batch", ID: "half"}, {Scope: c.name + m.name + "batch", ID: "ok"}}
				for round := range retries {
					began := adapterkit.BeginBatch(ctx, exec, keys, []string{"fp", "fp"})
					var attempts []*idem.Attempt
					for i, b := range began {
						attempts = append(attempts, b.Attempt)
						if round == 0 && b.Err != nil {
							t.Fatalf("BeginBatch: %v", b.Err)
						}
						if round > 0 {
							continue
						}
						e := count(t, s, keys[i])
						if i == 0 {
							e = storekit.Effect{Name: "half", Keys: []string{s.EffectKey(keys[0], "n")}, Args: []string{"wrongtype"}}
						}
						if err := idem.SetEffect(b.Ctx, e); err != nil {
							t.Fatal(err)
						}
					}
					errs := adapterkit.CommitBatch(ctx, exec, attempts, [][]byte{[]byte("v"), []byte("v")})
					if round == 0 && (!errors.Is(errs[0], idem.ErrEffectPartial) || !idem.IsTerminal(errs[0]) || errs[1] != nil) {
						t.Fatalf("CommitBatch: got %v, want a terminal ErrEffectPartial and nil", errs)
					}
					if round > 0 && (!errors.Is(began[0].Err, idem.ErrFailed) || !began[1].Attempt.Replayed()) {
						t.Fatalf("BeginBatch #%d: got %v and %v, want FAILED and a replay", round+1, began[0].Err, began[1].Err)
					}
				}
				if n, _ := raw.Get(ctx, s.EffectKey(keys[0], "n")).Int(); n != 1 {
					t.Fatalf("CommitBatch: counter %d after %d rounds, want 1", n, retries)
				}
			})
		}
	}
}

// TestEffectKeysOutsideTheSlot: on a Cluster, an effect key without the
// record's hash tag is refused before anything is sent (the stores are
// built, which checks the servers, and then every node is killed: a call
// that sent anything would fail to connect), and so is an unknown effect.
func TestEffectKeysOutsideTheSlot(t *testing.T) {
	t.Parallel()
	cluster := redistest.StartCluster(t, 3)
	nowhere := redis.NewClusterClient(&redis.ClusterOptions{Addrs: cluster.Addrs(), MaxRetries: -1})
	t.Cleanup(func() { nowhere.Close() })
	stores := make(map[string]*redisstore.Store)
	for _, tag := range []string{"", "orders"} {
		var opts []redisstore.Option
		if tag != "" {
			opts = append(opts, redisstore.WithHashTag(tag))
		}
		s, err := redisstore.New(nowhere, append(opts, testEffects...)...)
		if err != nil {
			t.Fatal(err)
		}
		stores[tag] = s
	}
	for _, n := range cluster.Nodes() {
		n.Kill(t)
	}
	for _, tag := range []string{"", "orders"} {
		s := stores[tag]
		key := idem.Key{ID: "k"}
		lease := storekit.Lease{Owner: "o", Fence: 1}
		for _, e := range []storekit.Effect{
			{Name: "count", Keys: []string{"counter", s.EffectKey(key, "fences")}, Args: []string{"1"}},
			{Name: "count", Keys: []string{s.EffectKey(idem.Key{ID: "other"}, "counter")}, Args: []string{"1"}},
			{Name: "count", Keys: []string{"{other}counter"}, Args: []string{"1"}},
			{Name: "count", Keys: []string{s.Key(key.Digest())}},
			{Name: "nope"},
		} {
			if tag != "" && e.Keys != nil && e.Keys[0] == s.EffectKey(idem.Key{ID: "other"}, "counter") {
				continue // with a store tag every record shares it
			}
			err := s.CompleteEffect(t.Context(), key.Digest(), lease, []byte("r"), time.Hour, e)
			if !errors.Is(err, idem.ErrInvalid) {
				t.Fatalf("tag %q, effect %+v: got %v, want ErrInvalid", tag, e, err)
			}
		}
		if err := s.CheckEffect(key.Digest(), count(t, s, key)); err != nil {
			t.Fatalf("tag %q: a key from EffectKey: %v", tag, err)
		}
	}
}

func TestWithEffectValidation(t *testing.T) {
	c := redis.NewClient(&redis.Options{Addr: "127.0.0.1:1"})
	t.Cleanup(func() { c.Close() })
	for _, opts := range [][]redisstore.Option{
		{redisstore.WithEffect("", "return 1")},
		{redisstore.WithEffect("a-b", "return 1")},
		{redisstore.WithEffect(strings.Repeat("a", redisstore.MaxEffectNameLen+1), "return 1")},
		{redisstore.WithEffect("a", " ")},
		{redisstore.WithEffect("a", "return 1"), redisstore.WithEffect("a", "return 2")},
	} {
		if _, err := redisstore.New(c, opts...); !errors.Is(err, idem.ErrInvalid) {
			t.Errorf("got %v, want ErrInvalid", err)
		}
	}
}

// TestCompleteAndAckEffect completes, applies the effect and acknowledges
// the entry in one call; repeated, nothing is applied twice; a failed
// effect acknowledges nothing, and one that failed after a write ends its
// record FAILED (idem.ErrEffectPartial) and applies nothing again when
// repeated.
func TestCompleteAndAckEffect(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t)
	for _, c := range clients(t, srv, nil) {
		for _, m := range modes {
			t.Run(c.name+"/"+m.name, func(t *testing.T) {
				s := effectStore(t, c, m, redisstore.WithHashTag("t"))
				raw := goRedisClient(t, srv.Addr())
				ctx := t.Context()
				stream := "{t}stream-" + c.name + m.name
				if err := raw.XGroupCreateMkStream(ctx, stream, "g", "0").Err(); err != nil {
					t.Fatal(err)
				}
				var ids []string
				for range 3 {
					id, _ := raw.XAdd(ctx, &redis.XAddArgs{Stream: stream, Values: []string{"k", "v"}}).Result()
					ids = append(ids, id)
				}
				if err := raw.XReadGroup(ctx, &redis.XReadGroupArgs{Group: "g", Consumer: "c", Streams: []string{stream, ">"}}).Err(); err != nil {
					t.Fatal(err)
				}
				k1, k2, k3 := idem.Key{Scope: stream, ID: "1"}, idem.Key{Scope: stream, ID: "2"}, idem.Key{Scope: stream, ID: "3"}
				a1, a2, a3 := acquire(t, s, k1.Digest()), acquire(t, s, k2.Digest()), acquire(t, s, k3.Digest())
				good := count(t, s, k1)
				bad := count(t, s, k2)
				bad.Args = []string{"x"}
				half := storekit.Effect{Name: "half", Keys: []string{s.EffectKey(k3, stream+":n")}, Args: []string{"wrongtype"}}
				acks := []redisstore.StreamAck{
					{Key: k1.Digest(), Lease: a1.Lease, Result: []byte("r"), ID: ids[0], Effect: &good},
					{Key: k2.Digest(), Lease: a2.Lease, Result: []byte("r"), ID: ids[1], Effect: &bad},
					{Key: k3.Digest(), Lease: a3.Lease, Result: []byte("r"), ID: ids[2], Effect: &half},
				}
				for range 2 {
					errs := s.CompleteAndAckBatch(ctx, stream, "g", time.Hour, acks)
					if errs[0] != nil || !errors.Is(errs[1], idem.ErrEffect) || errors.Is(errs[1], idem.ErrEffectPartial) || !errors.Is(errs[2], idem.ErrEffectPartial) {
						t.Fatalf("CompleteAndAckBatch: got %v, want nil, an effect error and ErrEffectPartial", errs)
					}
				}
				for _, k := range []string{good.Keys[0], half.Keys[0]} {
					if n, _ := raw.Get(ctx, k).Int(); n != 1 {
						t.Fatalf("counter %s: got %d, want 1", k, n)
					}
				}
				if rec, err := s.Get(ctx, k3.Digest()); err != nil || rec.State != storekit.StateFailed {
					t.Fatalf("record of the effect that failed half way: got %v, %v, want FAILED", rec.State, err)
				}
				pending, _ := raw.XPendingExt(ctx, &redis.XPendingExtArgs{Stream: stream, Group: "g", Start: "-", End: "+", Count: 10}).Result()
				if len(pending) != 2 || pending[0].ID != ids[1] || pending[1].ID != ids[2] {
					t.Fatalf("pending: got %+v, want only the entries whose effect failed", pending)
				}
			})
		}
	}
}

// TestCommitBatchWithEffects: adapterkit.CommitBatch of attempts with and
// without effects applies every effect once, with its completion, in a
// few round trips (not one per effect); the attempt whose effect fails
// gets an *storekit.EffectError and its key released, the others complete.
func TestCommitBatchWithEffects(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t)
	for _, m := range modes {
		t.Run(m.name, func(t *testing.T) {
			rdb := goRedisClient(t, srv.Addr())
			trips := &roundTrips{}
			rdb.AddHook(trips)
			s, err := redisstore.New(rdb, append(append([]redisstore.Option{}, m.opts...), testEffects...)...)
			if err != nil {
				t.Fatal(err)
			}
			exec, err := idem.New(s)
			if err != nil {
				t.Fatal(err)
			}
			ctx := t.Context()
			// batch acquires n keys and attaches the count effect to all but
			// the last two; the first gets an argument the effect refuses.
			const n = 13
			batch := func(round string) ([]idem.Key, []*idem.Attempt) {
				keys := make([]idem.Key, n)
				for i := range keys {
					keys[i] = idem.Key{Scope: m.name + round, ID: strconv.Itoa(i)}
				}
				attempts := make([]*idem.Attempt, n)
				for i, b := range adapterkit.BeginBatch(ctx, exec, keys, make([]string, n)) {
					if b.Err != nil {
						t.Fatal(b.Err)
					}
					attempts[i] = b.Attempt
					if i >= n-2 {
						continue
					}
					e := count(t, s, keys[i])
					if i == 0 {
						e.Args = []string{"x"}
					}
					if err := idem.SetEffect(b.Ctx, e); err != nil {
						t.Fatal(err)
					}
				}
				return keys, attempts
			}
			values := make([][]byte, n)
			for i := range values {
				values[i] = []byte("v")
			}
			_, warm := batch("warm-up")
			adapterkit.CommitBatch(ctx, exec, warm, values) // loads the scripts or the library
			keys, attempts := batch("")
			trips.mu.Lock()
			trips.names = nil
			trips.mu.Unlock()
			errs := adapterkit.CommitBatch(ctx, exec, attempts, values)
			trips.mu.Lock()
			if len(trips.names) > 3 {
				t.Errorf("round trips for a batch of %d, %d with effects: %q; want 3 at most", n, n-2, trips.names)
			}
			trips.mu.Unlock()
			var ee *storekit.EffectError
			if !errors.As(errs[0], &ee) {
				t.Fatalf("key 0: got %v, want an *storekit.EffectError", errs[0])
			}
			if rec, err := s.Get(ctx, keys[0].Digest()); err != nil || rec.State != storekit.StateReleased {
				t.Fatalf("key 0: %v %v, want RELEASED", rec.State, err)
			}
			for i := 1; i < n; i++ {
				if errs[i] != nil {
					t.Fatalf("key %d: %v", i, errs[i])
				}
				if rec, err := s.Get(ctx, keys[i].Digest()); err != nil || rec.State != storekit.StateCompleted {
					t.Fatalf("key %d: %v %v, want COMPLETED", i, rec.State, err)
				}
				if i >= n-2 {
					continue
				}
				if v, err := rdb.Get(ctx, count(t, s, keys[i]).Keys[0]).Int(); err != nil || v != 1 {
					t.Fatalf("key %d: counter %d %v, want 1", i, v, err)
				}
			}
			if v, err := rdb.Exists(ctx, count(t, s, keys[0]).Keys[0]).Result(); err != nil || v != 0 {
				t.Fatalf("key 0: the refused effect wrote its counter (%d, %v)", v, err)
			}
		})
	}
}

// TestConsumerDeadLettersPartialEffect: a broker consumer whose handler's
// effect fails after its first write dead-letters the message at its first
// delivery, with an error that says the effect may have partly applied,
// and a redelivered copy is dead-lettered without running the handler: the
// write happened once.
func TestConsumerDeadLettersPartialEffect(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t)
	for _, c := range clients(t, srv, nil) {
		t.Run(c.name, func(t *testing.T) {
			s := effectStore(t, c, modes[0])
			raw := goRedisClient(t, srv.Addr())
			exec, err := idem.New(s)
			if err != nil {
				t.Fatal(err)
			}
			p, err := consumer.New(exec, consumer.WithMaxDeliveries(5))
			if err != nil {
				t.Fatal(err)
			}
			ctx := t.Context()
			counter := "consumer-counter-" + c.name
			runs := 0
			h := func(ctx context.Context, _ int) error {
				runs++
				return idem.SetEffect(ctx, storekit.Effect{Name: "half", Keys: []string{counter}, Args: []string{"wrongtype"}})
			}
			for delivery := 1; delivery <= 3; delivery++ {
				r := p.Process(ctx, []consumer.Message{{Key: "k-" + c.name, Deliveries: delivery}}, h)[0]
				if r.Action != consumer.DeadLetter || !errors.Is(r.Err, idem.ErrEffectPartial) && !errors.Is(r.Err, idem.ErrFailed) {
					t.Fatalf("delivery %d: got %v (%v), want DeadLetter with ErrEffectPartial", delivery, r.Action, r.Err)
				}
				if delivery == 1 && !strings.Contains(r.Err.Error(), "may have partly applied") {
					t.Fatalf("delivery 1: the reason %q does not say the effect may have partly applied", r.Err)
				}
			}
			if n, _ := raw.Get(ctx, counter).Int(); n != 1 || runs != 1 {
				t.Fatalf("%d runs, counter %d after 3 deliveries; want 1 and 1", runs, n)
			}
		})
	}
}
