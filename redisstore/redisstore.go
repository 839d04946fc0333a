package redisstore

import (
	"context"
	"fmt"
	"log/slog"
	"runtime"
	"strconv"
	"sync/atomic"
	"time"
	"unsafe"

	"github.com/idemgo/idem"
	"github.com/idemgo/idem/redisstore/internal/backend"
	"github.com/idemgo/idem/redisstore/internal/goredis"
	rueidisbackend "github.com/idemgo/idem/redisstore/internal/rueidis"
	valkeybackend "github.com/idemgo/idem/redisstore/internal/valkey"
	"github.com/idemgo/idem/storekit"
	"github.com/idemgo/idem/storekit/statemachine"
	"github.com/redis/go-redis/v9"
	"github.com/redis/rueidis"
	"github.com/valkey-io/valkey-go"
)

// DefaultPrefix is the default key prefix.
const DefaultPrefix = "idem:"

// Option configures a Store.
type Option func(*config)

type config struct {
	prefix       string
	notify       bool
	wait         *waitConfig
	cluster      bool
	clusterKnown bool
	hashTag      string      // WithHashTag, in hashtag.go
	functions    bool        // WithFunctions, in functions.go
	effects      []effectDef // WithEffect, in effect.go
	replayCache  *bool       // WithReplayCache, in replaycache.go; nil: the default
	// WithReplayCacheBytes, in replaycache.go
	replayCacheBytes int64

	allowEviction bool          // WithAllowEviction, in check.go
	logger        *slog.Logger  // WithLogger, in check.go
	serverCheck   time.Duration // WithServerCheck, in check.go
}

// waitConfig is a durability requirement checked after acquire and complete.
type waitConfig = backend.Wait

// WithPrefix sets the prefix of record keys (and notification channels):
// records are stored at <prefix>{<digest>}. The default is DefaultPrefix
// ("idem:"). It must not contain '{' or '}', which would change the Cluster
// hash tag.
func WithPrefix(p string) Option { return func(c *config) { c.prefix = p } }

// WithNotify sets whether complete, fail and release publish a notification
// on the record's channel (<prefix>{<digest>}:w, PUBLISH on a standalone
// server, SPUBLISH on a Cluster) so that Executor.Await is woken across
// processes. The default is true; turn it off to save the publish when no
// caller waits.
func WithNotify(on bool) Option { return func(c *config) { c.notify = on } }

// WithWait makes acquire and complete wait, on the same connection as the
// script, until numReplicas replicas acknowledged the write (WAIT
// numReplicas timeout). When fewer acknowledge within timeout, the call
// returns an error wrapping idem.ErrNotDurable: the transition happened on
// the primary but may be lost on failover. With as many replicas as
// numReplicas, one node down makes every acquire and complete return
// ErrNotDurable until it is back (measured: RELIABILITY.md, Sentinel
// failover): wait for fewer replicas than you run. A primary partitioned
// from its replicas answers ErrNotDurable instead of acknowledging writes
// that the failover would lose (measured: RELIABILITY.md, Sentinel
// partition). The default is not to wait.
func WithWait(numReplicas int, timeout time.Duration) Option {
	return func(c *config) {
		c.wait = &waitConfig{Replicas: numReplicas, Timeout: timeout}
	}
}

// WithWaitAOF makes acquire and complete wait until the write was fsynced to
// the AOF of numLocal (0 or 1) primaries and numReplicas replicas (WAITAOF,
// Redis 7.2 and later: New refuses an older server), on the same connection
// as the script. Errors as for WithWait. With appendfsync everysec the
// server fsyncs once a second, so each acquire and complete may wait up to
// a second, holding its connection meanwhile (a go-redis client's PoolSize
// bounds the calls that wait at once). The default is not to wait.
//
// The guarantee is the server's: under appendfsync everysec, Redis 7.4.0
// and 7.4.1, the 8.0 milestones and unstable builds of late 2024, and
// Valkey 8.0.0 and 8.0.1 count a write as fsynced one event loop tick
// after it, fsynced or not (fixed upstream by redis/redis#13793), and a
// write their WAITAOF acknowledged can be lost with the machine. New and
// NewRueidis make the check CheckWaitAOF makes (and idem doctor --wait-aof
// reports) on every primary under appendfsync everysec, and refuse such a
// server (*WaitAOFError): the known releases from their version, others
// that may (Redis 7.4 and later, Valkey 8 and later) after watching a
// write, which adds 0.4 to 0.5 s to New. With appendfsync always, every
// write is fsynced before its reply.
//
// What a call costs, measured on one machine (a SET and WAITAOF 1 0, one
// after the other, medians of 3 × 21): with appendfsync always, 0.2 ms on
// Redis 7.4.1, 8.0-M01 and unstable and Valkey 8.0.1, but 101 ms on Redis
// 7.2.6 and Valkey 7.2.7, whose WAITAOF answers at the server's next cron
// tick (hz 10) rather than after the fsync: about 200 ms per Do (an
// acquire and a complete) even with appendfsync always. With appendfsync
// everysec, 1.0 s on 7.2 (the next fsync), and 100 ms on the releases
// refused above (the early acknowledgement).
func WithWaitAOF(numLocal, numReplicas int, timeout time.Duration) Option {
	return func(c *config) {
		c.wait = &waitConfig{AOF: true, Local: numLocal, Replicas: numReplicas, Timeout: timeout}
	}
}

func (c *config) validate() error {
	for _, r := range c.prefix {
		if r == '{' || r == '}' {
			return fmt.Errorf("%w: prefix %q contains a brace", idem.ErrInvalid, c.prefix)
		}
	}
	if len(c.prefix) > 64 {
		return fmt.Errorf("%w: prefix is %d bytes, over the limit of 64", idem.ErrInvalid, len(c.prefix))
	}
	if c.serverCheck < 0 {
		return fmt.Errorf("%w: negative server check interval %v", idem.ErrInvalid, c.serverCheck)
	}
	if c.replayCacheBytes < 0 {
		return fmt.Errorf("%w: replay cache bound of %d bytes, want more than 0 (WithReplayCache(false) turns the cache off)", idem.ErrInvalid, c.replayCacheBytes)
	}
	if w := c.wait; w != nil {
		if w.Replicas < 0 || w.Local < 0 || w.Local > 1 {
			return fmt.Errorf("%w: wait for %d local and %d replicas", idem.ErrInvalid, w.Local, w.Replicas)
		}
		if w.Timeout < 0 {
			return fmt.Errorf("%w: negative wait timeout %v", idem.ErrInvalid, w.Timeout)
		}
		if w.Replicas == 0 && w.Local == 0 {
			return fmt.Errorf("%w: a wait for nothing", idem.ErrInvalid)
		}
		w.TimeoutArg = strconv.FormatInt(w.Timeout.Milliseconds(), 10)
	}
	return nil
}

// Store is a storekit.Store on Redis, Valkey or a Redis Cluster. Every state
// transition is one Lua script on the record's hash; time is the server's.
// It is safe for concurrent use.
type Store struct {
	b      backend.Backend // the client library (redisstore/internal/backend)
	hub    *hub            // the watches' shared connection; nil: Backend.Watch
	prefix string
	pub    string // notification command, "" for none
	wait   *waitConfig
	tag    string // WithHashTag; prefix already ends with {tag}
	fcall  bool   // WithFunctions
	// effects are the registered effects (WithEffect) by name.
	effects map[string]*script
	// cached and replays are the local replay cache (replaycache.go),
	// nil when it is off.
	cached  backend.CachedGetter
	replays *replayIndex
	// monitor runs the checks of WithServerCheck (check.go), nil without.
	monitor *monitor
}

var (
	_ storekit.Store   = (*Store)(nil)
	_ storekit.Watcher = (*Store)(nil)
	_ storekit.Relayer = (*Store)(nil)
)

func newStore(b backend.Backend, opts []Option) (*Store, error) {
	c := config{prefix: DefaultPrefix, notify: true}
	for _, o := range opts {
		o(&c)
	}
	if err := c.validate(); err != nil {
		return nil, err
	}
	if err := validateHashTag(c.hashTag); err != nil {
		return nil, err
	}
	s := &Store{b: b, prefix: c.prefix + hashTagPart(c.hashTag), tag: c.hashTag, wait: c.wait, fcall: c.functions}
	if c.notify {
		s.pub = "PUBLISH"
		if b.Cluster() {
			s.pub = "SPUBLISH"
		}
	}
	if open := b.Subscriber(); open != nil {
		s.hub = &hub{open: open}
	}
	if c.functions {
		coreLibrary()
	}
	effects, err := buildEffects(c.effects, c.functions)
	if err != nil {
		return nil, err
	}
	s.effects = effects
	// The options are valid: now the server.
	ctx, cancel := context.WithTimeout(context.Background(), StartCheckTimeout)
	defer cancel()
	nodes, err := b.Nodes(ctx)
	if err != nil {
		return nil, fmt.Errorf("redisstore: cannot check the server at start: %w", err)
	}
	if err := checkServer(ctx, nodes, &c); err != nil {
		return nil, err
	}
	cacheOn := c.wait == nil
	if c.replayCache != nil {
		cacheOn = *c.replayCache
	}
	if cacheOn {
		size := c.replayCacheBytes
		if size == 0 {
			size = DefaultReplayCacheBytes
		}
		s.cached = b.ReplayCache(backend.CacheConfig{Prefix: s.prefix, MaxBytes: size, Log: c.log(), Keep: keepRecord})
	}
	if s.cached != nil {
		s.replays = newReplayIndex(replayIndexSize)
		// A store dropped without Close ends what its cache runs (the
		// go-redis tracking connection) when it is collected.
		runtime.AddCleanup(s, func(g backend.CachedGetter) { go g.Close() }, s.cached)
	}
	if c.serverCheck > 0 {
		s.monitor = startMonitor(b, c)
		runtime.AddCleanup(s, func(m *monitor) { go m.stop() }, s.monitor)
	}
	return s, nil
}

// New returns a Store on a go-redis client: a *redis.Client (standalone,
// Sentinel failover client) or a *redis.ClusterClient. The store does not own
// the client and does not close it.
//
// New checks the server, within StartCheckTimeout: every node the client
// knows (a Cluster's primaries and replicas) must run Redis 7.0 or later, or
// Valkey (*VersionError), and have maxmemory-policy noeviction
// (*EvictionError, unless WithAllowEviction). A server that cannot be
// reached is an error too; one that refuses INFO and CONFIG GET (ACLs,
// managed services) is accepted with one warning logged (WithLogger).
func New(client redis.UniversalClient, opts ...Option) (*Store, error) {
	var b backend.Backend
	switch c := client.(type) {
	case *redis.Client:
		b = goredis.New(c)
	case *redis.ClusterClient:
		b = goredis.NewCluster(c)
	case nil:
		return nil, fmt.Errorf("%w: nil client", idem.ErrInvalid)
	default:
		return nil, fmt.Errorf("%w: unsupported client type %T (use *redis.Client or *redis.ClusterClient)", idem.ErrInvalid, client)
	}
	return newStore(b, opts)
}

// NewRueidis returns a Store on a rueidis client (standalone, Sentinel or
// Cluster). The store does not own the client and does not close it. It
// checks the server as New does.
func NewRueidis(client rueidis.Client, opts ...Option) (*Store, error) {
	if client == nil {
		return nil, fmt.Errorf("%w: nil client", idem.ErrInvalid)
	}
	return newStore(rueidisbackend.New(client), opts)
}

// NewValkey returns a Store on a valkey-go client (standalone, Sentinel or
// Cluster), Valkey's own Go client. The store does not own the client and
// does not close it. It checks the server as New does, and behaves as a
// store of NewRueidis (valkey-go is a fork of rueidis): the replay cache is
// the client's own (ClientOption.CacheSizeEachConn).
func NewValkey(client valkey.Client, opts ...Option) (*Store, error) {
	if client == nil {
		return nil, fmt.Errorf("%w: nil client", idem.ErrInvalid)
	}
	return newStore(valkeybackend.New(client), opts)
}

// Close ends what the store runs in the background: the tracking
// connection of its replay cache with go-redis (see the package
// documentation, "Local replay cache") and the checks of WithServerCheck.
// It does not close the client. The store must not be used after Close.
func (s *Store) Close() error {
	if s.cached != nil {
		s.cached.Close()
	}
	if s.monitor != nil {
		s.monitor.stop()
	}
	return nil
}

// Key returns the Redis key of the record for a store key (a digest).
func (s *Store) Key(key string) string { return s.prefix + "{" + key + "}" }

func (s *Store) channel(key string) string { return s.prefix + "{" + key + "}:w" }

// recordArgs returns the record key of key (Key), its notification
// channel and fence in decimal, made in one allocation: the calls that end
// an attempt send all three, and at 64 callers of the hybrid commit gate
// each allocation of a key's calls counts.
func (s *Store) recordArgs(key string, fence int64) (rkey, channel, fenceArg string) {
	b := make([]byte, 0, len(s.prefix)+len(key)+4+20)
	b = append(append(append(append(b, s.prefix...), '{'), key...), "}:w"...)
	n := len(b)
	b = strconv.AppendInt(b, fence, 10)
	all := unsafe.String(unsafe.SliceData(b), len(b))
	return all[:n-2], all[:n], all[n:]
}

// ms formats d in milliseconds. The Executor passes the same few durations
// on every call, so the last ones formatted are kept, in a slot chosen by
// a multiplicative hash: round durations are multiples of 16 ms more often
// than not (30s, 10s, 1h, 24h), so n modulo the number of slots would put
// the lease and the retention in the same slot, and each call would evict
// the other.
func ms(d time.Duration) string {
	n := d.Milliseconds()
	slot := &msCache[(uint64(n)*0x9e3779b97f4a7c15)>>(64-msCacheBits)]
	if c := slot.Load(); c != nil && c.n == n {
		return c.s
	}
	c := &msString{n: n, s: strconv.FormatInt(n, 10)}
	slot.Store(c)
	return c.s
}

type msString struct {
	n int64
	s string
}

const msCacheBits = 4

var msCache [1 << msCacheBits]atomic.Pointer[msString]

// bytesArg passes b to the client library without a copy. The library has
// written it to the connection when the call returns, and the store's
// callers do not modify a result during the call.
func bytesArg(b []byte) string { return unsafe.String(unsafe.SliceData(b), len(b)) }

// inProgressTTL is the time to live of an IN_PROGRESS record with lease d:
// the lease, one more lease, and storekit.InProgressGrace.
func inProgressTTL(d time.Duration) string { return ms(2*d + storekit.InProgressGrace) }

// acquireCall returns the KEYS and ARGV of acquire.lua for the record rkey
// and req, the two halves of one slice (one allocation for both): the
// record; then fingerprint, owner, lease and the IN_PROGRESS time to live,
// then max attempts and retention only when there is an attempt limit
// (each argument costs Redis a Lua string; acquire.lua).
func acquireCall(rkey string, req storekit.AcquireRequest) (keys, args []string) {
	var a []string
	if req.MaxAttempts == 0 {
		a = []string{rkey, req.Fingerprint, req.Owner, ms(req.Lease), inProgressTTL(req.Lease)}
	} else {
		a = []string{rkey, req.Fingerprint, req.Owner, ms(req.Lease), inProgressTTL(req.Lease), strconv.Itoa(req.MaxAttempts), ms(req.Retention)}
	}
	return a[:1:1], a[1:]
}

func (s *Store) run(ctx context.Context, sc *script, key string, args []string, durable bool) (any, error) {
	return s.runKeys(ctx, sc, []string{s.Key(key)}, args, durable)
}

// runKeys runs sc with keys and args (keys[0] is a record). In Functions
// mode, a node that has not the library gets it, and the call is made
// again.
func (s *Store) runKeys(ctx context.Context, sc *script, keys, args []string, durable bool) (any, error) {
	var w *waitConfig
	if durable {
		w = s.wait
	}
	reply, acks, err := s.b.Run(ctx, &sc.Script, keys, args, w, s.fcall)
	if s.fcall && functionNotFound(err) {
		if lerr := s.load(ctx, sc.lib); lerr != nil {
			return nil, lerr
		}
		reply, acks, err = s.b.Run(ctx, &sc.Script, keys, args, w, s.fcall)
	}
	if err != nil {
		if s.monitor != nil && backend.Unreachable(err) {
			s.monitor.kick() // check the server again once it answers
		}
		return nil, fmt.Errorf("redisstore: %s: %w", sc.Name, err)
	}
	if w != nil && acks < int64(w.Replicas) {
		return reply, fmt.Errorf("%w: %s acknowledged by %d of %d", idem.ErrNotDurable, sc.Name, acks, w.Replicas)
	}
	return reply, nil
}

// Acquire implements storekit.Store.
func (s *Store) Acquire(ctx context.Context, key string, req storekit.AcquireRequest) (storekit.Acquisition, error) {
	if err := storekit.ValidateStoreKey(key); err != nil {
		return storekit.Acquisition{}, err
	}
	if err := req.Validate(); err != nil {
		return storekit.Acquisition{}, err
	}
	if s.replays != nil && s.replays.has(s.Key(key)) {
		if a, ok := s.cachedReplay(ctx, s.Key(key), req.Fingerprint); ok {
			return a, nil
		}
	}
	keys, args := acquireCall(s.Key(key), req)
	reply, err := s.runKeys(ctx, acquireScript, keys, args, true)
	if reply == nil {
		return storekit.Acquisition{}, err
	}
	a, perr := parseAcquire(reply)
	if perr != nil {
		return storekit.Acquisition{}, perr
	}
	if a.Outcome == storekit.Acquired || a.Outcome == storekit.TakenOver {
		a.Lease.Owner = req.Owner
	}
	if a.Outcome == storekit.Replay && s.replays != nil {
		s.replays.add(s.Key(key))
	}
	return a, err // err is nil or ErrNotDurable
}

// Complete implements storekit.Store. Repeating a Complete that succeeded (same
// lease and result), for example after its reply was lost, succeeds again.
// result must not be modified during the call.
func (s *Store) Complete(ctx context.Context, key string, lease storekit.Lease, result []byte, retention time.Duration) error {
	if err := statemachine.CheckLease(key, lease); err != nil {
		return err
	}
	if err := storekit.ValidateDuration("retention", retention); err != nil {
		return err
	}
	rkey, ch, fence := s.recordArgs(key, lease.Fence)
	// KEYS and ARGV in one slice: one allocation for both.
	call := []string{rkey, lease.Owner, fence, bytesArg(result), ms(retention), s.pub, ch}
	reply, err := s.runKeys(ctx, completeScript, call[:1:1], call[1:], true)
	if reply == nil {
		return err
	}
	if perr := parseOK("complete", reply); perr != nil {
		return perr
	}
	return err
}

// RelayCompletion implements storekit.Relayer (relay.lua). result must not be
// modified during the call.
func (s *Store) RelayCompletion(ctx context.Context, key string, c storekit.Completion) error {
	if err := storekit.ValidateStoreKey(key); err != nil {
		return err
	}
	if err := c.Validate(); err != nil {
		return err
	}
	rkey, ch, fence := s.recordArgs(key, c.Fence)
	reply, err := s.runKeys(ctx, relayScript, []string{rkey}, []string{
		c.Fingerprint, fence, bytesArg(c.Result), ms(c.Retention), s.pub, ch,
	}, true)
	if reply == nil {
		return err
	}
	if perr := parseRelay(reply); perr != nil {
		return perr
	}
	return err // nil or ErrNotDurable
}

// Fail implements storekit.Store.
func (s *Store) Fail(ctx context.Context, key string, lease storekit.Lease, f storekit.Failure) (storekit.State, error) {
	if err := statemachine.CheckLease(key, lease); err != nil {
		return 0, err
	}
	if err := f.Validate(); err != nil {
		return 0, err
	}
	terminal := "0"
	if f.Terminal {
		terminal = "1"
	}
	rkey, ch, fence := s.recordArgs(key, lease.Fence)
	reply, err := s.runKeys(ctx, failScript, []string{rkey}, []string{
		lease.Owner, fence, bytesArg(f.Result), ms(f.Retention), terminal,
		strconv.Itoa(f.MaxAttempts), s.pub, ch,
	}, false)
	if err != nil {
		return 0, err
	}
	return parseFail(reply)
}

// Extend implements storekit.Store.
func (s *Store) Extend(ctx context.Context, key string, lease storekit.Lease, d time.Duration) error {
	if err := statemachine.CheckLease(key, lease); err != nil {
		return err
	}
	if err := storekit.ValidateDuration("lease", d); err != nil {
		return err
	}
	reply, err := s.run(ctx, extendScript, key, []string{lease.Owner, strconv.FormatInt(lease.Fence, 10), ms(d), inProgressTTL(d)}, false)
	if err != nil {
		return err
	}
	return parseOK("extend", reply)
}

// Release implements storekit.Store.
func (s *Store) Release(ctx context.Context, key string, lease storekit.Lease, retention time.Duration) error {
	if err := statemachine.CheckLease(key, lease); err != nil {
		return err
	}
	if err := storekit.ValidateDuration("retention", retention); err != nil {
		return err
	}
	rkey, ch, fence := s.recordArgs(key, lease.Fence)
	reply, err := s.runKeys(ctx, releaseScript, []string{rkey}, []string{
		lease.Owner, fence, ms(retention), s.pub, ch,
	}, false)
	if err != nil {
		return err
	}
	return parseOK("release", reply)
}

// Get implements storekit.Store.
func (s *Store) Get(ctx context.Context, key string) (storekit.Record, error) {
	if err := storekit.ValidateStoreKey(key); err != nil {
		return storekit.Record{}, err
	}
	reply, err := s.run(ctx, getScript, key, nil, false)
	if err != nil {
		return storekit.Record{}, err
	}
	return parseGet(reply)
}

// Delete implements storekit.Store. With notifications on, it wakes the key's
// waiters (PUBLISH or SPUBLISH after the DEL, in the same round trip), so
// that they look at the key again at once, not at their next periodic look
// (Executor.Await looks at least every second).
func (s *Store) Delete(ctx context.Context, key string) error {
	if err := storekit.ValidateStoreKey(key); err != nil {
		return err
	}
	if s.replays != nil {
		// The server's invalidation of the cached record may arrive after
		// the reply to the DEL (Redis 7.0 sends a client's own after it):
		// the next acquire here must not read the cache before it does.
		// Forgotten before the DEL, for the acquires while it runs, and
		// again after its reply (or its failure): a read of the cache that
		// the server answered before the DEL, and whose reply came after
		// the first forget, would otherwise keep the deleted record until
		// the invalidation arrives (TestReplayCacheDeleteRacingRead).
		s.forgetReplay(key)
		defer s.forgetReplay(key)
	}
	if err := s.b.Del(ctx, s.Key(key), s.pub, s.channel(key)); err != nil {
		return fmt.Errorf("redisstore: delete: %w", err)
	}
	return nil
}

// forgetReplay drops key from the replay index and its record from the
// local cache, and cancels the cache's reads of it in flight.
func (s *Store) forgetReplay(key string) {
	s.replays.remove(s.Key(key))
	s.cached.Forget(s.Key(key))
}

// Watch implements storekit.Watcher: it subscribes to the record's channel on a
// connection of its own and returns once the server confirmed the
// subscription, so that no notification published after Watch returns is
// missed.
func (s *Store) Watch(ctx context.Context, key string) (<-chan struct{}, func(), error) {
	if err := storekit.ValidateStoreKey(key); err != nil {
		return nil, nil, err
	}
	if s.pub == "" {
		// Notifications are off: nothing will be sent; the caller falls
		// back to its timer.
		return nil, func() {}, nil
	}
	watch := s.b.Watch
	if s.hub != nil {
		watch = s.hub.watch
	}
	ch, stop, err := watch(ctx, s.channel(key))
	if err != nil {
		return nil, nil, fmt.Errorf("redisstore: watch: %w", err)
	}
	return ch, stop, nil
}
