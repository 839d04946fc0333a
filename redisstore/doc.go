// Package redisstore is the production idem.Store: Redis, Valkey or a Redis
// Cluster, through the caller's own go-redis v9 client (*redis.Client,
// *redis.ClusterClient), rueidis client or valkey-go client.
//
//	rdb := redis.NewClient(&redis.Options{Addr: "127.0.0.1:6379"})
//	store, err := redisstore.New(rdb)
//	// or: store, err := redisstore.NewRueidis(rueidisClient)
//	// or: store, err := redisstore.NewValkey(valkeyClient)
//	exec, err := idem.New(store)
//
// It needs Redis 7.0 or later, or Valkey: a Cluster store notifies with
// SPUBLISH, and the batch acquire writes with SET … NX GET (see Batches).
// The tests run on Redis 7.0. Figures measured on the store are in
// BENCHMARKS.md.
//
// # Choosing the options
//
//   - Client: New for go-redis (standalone, Sentinel failover client,
//     Cluster), NewRueidis for rueidis, NewValkey for valkey-go (Valkey's
//     own client, a fork of rueidis: its store is a rueidis store's, with
//     its names). All behave the same (the conformance suite runs on
//     each); the local replay cache differs (see Local replay cache).
//   - Durability: WithWait or WithWaitAOF when a failover or a crash must
//     not lose an acknowledged record (see Durability); the default is not
//     to wait.
//   - Script or Functions mode: the default runs cached scripts; choose
//     WithFunctions where scripts may not be sent (an ACL that denies
//     EVAL), where the script cache is flushed, or to see idem's code in
//     FUNCTION LIST.
//   - Redis-side effects: WithEffect, for work on data in the same Redis
//     that must happen once per key.
//   - Cluster: WithHashTag when one script must touch several keys of the
//     store (a Redis Streams consumer, effects on shared data, batches in
//     one script).
//   - WithReplayCache(false) where replays are rare and the cache's own
//     connections are not wanted (see Local replay cache);
//     WithNotify(false) where no caller waits; WithServerCheck to keep
//     checking the server while the store runs; WithAllowEviction only
//     where duplicates are acceptable.
//
// # Start check
//
// New and NewRueidis check the server before they return (INFO, on every
// node the client knows; within StartCheckTimeout): a server older than
// Redis 7.0 (7.2 with WithWaitAOF) is refused with a *VersionError, and one
// whose maxmemory-policy is not noeviction with an *EvictionError, unless
// WithAllowEviction. With WithWaitAOF, a server whose WAITAOF counts
// writes as fsynced before they are (Redis 7.4.0 and 7.4.1, Valkey 8.0.0
// and 8.0.1 by their version; others, such as Redis 8.0-M01 and unstable
// builds, from a watched write: CheckWaitAOF, which idem doctor --wait-aof
// reports) is refused with a *WaitAOFError while it runs appendfsync
// everysec. Every other policy can evict idem's records (they all carry a
// time to live, so the volatile-* policies too), and a retried request
// whose record was evicted runs again (RELIABILITY.md, evicting Redis).
// Where INFO is refused the policy is read with CONFIG GET; where both are
// refused (ACLs, managed services that rename CONFIG), the store is built
// and one warning is logged (WithLogger). A server that cannot be reached
// is an error: the store would fail every call. So building a store does
// I/O, bounded by StartCheckTimeout, with no context.
//
// A server's configuration can change while the store runs (CONFIG SET
// maxmemory-policy allkeys-lru, a restart with another configuration file,
// a failover to a replica configured otherwise). WithServerCheck repeats
// the check in the background, every interval and as soon as the server
// answers again after a call could not reach it; Health returns what the
// last check found (for a readiness probe: idem proxy's /readyz), and each
// check that finds the server unfit logs an error that names the fix.
//
// # Layout
//
// One record per idempotency key, at <prefix>{<digest>}: the digest is
// idem.Key.Digest, so raw keys never reach Redis, and the braces make it a
// Cluster hash tag, so every script touches one slot. With WithHashTag(tag)
// the key is <prefix>{<tag>}{<digest>}: every record of that store shares
// the tag's slot, which a Redis Streams consumer needs on a Cluster so that
// one script can complete a record and XACK the stream entry. The record is
// a string holding a few MessagePack values, packed and unpacked by the
// scripts with Redis's built-in cmsgpack: a format version, the state,
// fingerprint, owner, fence, lease end (µs), attempts, creation time (an
// offset from the fence, one byte for a key taken once) and the result. The result is an opaque blob made by the Executor; Lua
// never looks inside it. A string, not a hash: SET … PX writes the record
// and its expiry in one call and one GET reads it. A value in another
// format is refused with an error, never misread.
//
// Each transition is one Lua script (lua/*.lua, embedded), run with EVALSHA
// and EVAL after NOSCRIPT, or as a Redis Function (see Functions mode).
// Calls that would wait anyway are sent in pipelines, with either client
// (on a rueidis Cluster client, rueidis's own pipelining alone): a call
// made while another is in flight is queued, and the queue goes out as one
// pipeline, sent by the first call in flight to return or, while fewer than
// two are in flight, by the caller of its first call once the callers ready
// to run have queued theirs too (a lone caller's calls go out alone, at
// once); a queued call waits at most 1 ms for that, then
// the queue is sent at once, so that a slow network does not delay it by a
// whole round trip. go-redis (v9.23 and later) sends pipelines on a pool
// of their own, Options.PipelinePoolSize connections (10 by default, with
// 128 KiB buffers each), beside the PoolSize connections of lone calls:
// size both for your load, or set PipelinePoolSize to -1 to send pipelines
// on the main pool. rueidis and valkey-go send a lone call on one of the
// client's dedicated connections (ClientOption.BlockingPoolSize), which
// the caller writes and reads itself, rather than on the shared
// connection, where the client hands each call to a writer and a reader
// goroutine: so a lone call, once sent, waits for its reply even if its
// context is canceled, bounded by the context's deadline if it has one,
// else by the client's ConnWriteTimeout. Scripts read the server's clock
// with TIME. Every input
// is validated in Go before a script runs, and every script does all its
// checks before its only write, so a script error never leaves a
// half-written record.
//
// Each client library is driven by one internal package (internal/goredis,
// internal/rueidis, and internal/valkey, generated from internal/rueidis)
// behind one seam (internal/backend); this package holds
// what is the same for all: the transitions, scripts and Functions
// libraries, effects, streams, batches, the watches' shared connection and
// the start checks.
//
// # Functions mode
//
// With WithFunctions the same Lua files run as Redis Functions: every
// embedded script of the package (a script added later included, with no
// other change) is a function of one library, idem_<version>, where the
// version is a digest of the code, so that two versions of idem can run
// side by side during a rolling deploy. Writes are called with FCALL, reads
// (Get) with FCALL_RO. The library is loaded (FUNCTION LOAD, never
// FUNCTION FLUSH) when a call finds it missing: at first use, on every
// primary of a Cluster, and again on a node that lost it; a library of its
// name that holds other code is replaced (CheckLibrary). A restart with
// AOF or RDB keeps it. LoadedLibraries and idem doctor report what is
// loaded. The two modes cost the same Redis time per call (make
// bench-functions); see WithFunctions for when to choose which mode and
// for the ACL rights each needs.
//
// # Redis-side effects
//
// An effect is work on data in the same Redis (a stock counter, an order
// hash, an event appended to a stream) that must happen exactly once per
// key. Register its Lua body when the store is built (WithEffect); the
// operation attaches it, with its arguments, to its attempt with
// idem.SetEffect; the completion then runs, in one script or function
// call: the owner and fence check, the effect, the COMPLETED write (and
// for the Redis Streams consumer the XACK). A stale owner's effect never
// runs; a completion repeated after a lost reply finds its own COMPLETED
// record and runs nothing; an effect that fails leaves no COMPLETED record
// and a *storekit.EffectError. A script that fails half way is not undone by
// Redis, so an effect checks its input before its first write: one that
// fails before it leaves the key to the failure policy (released by
// default), one that fails after it ends the key FAILED in the same call
// (idem.ErrEffectPartial), so that no retry applies its first writes
// again. On a Cluster every key of an effect carries the record's hash tag
// (EffectKey; CheckEffect refuses others before anything is sent): data
// shared by many keys, such as a stock counter, needs a store with
// WithHashTag.
//
// # Batches
//
// AcquireBatch, CompleteBatch and CompleteAndAckBatch (used by
// adapterkit.BeginBatch and CommitBatch, and so by the broker consumers)
// send one script call for up to 128 keys (acquire_many.lua,
// complete_many.lua, complete_ack_many.lua) when the keys may share a
// script: on a standalone server, and on a Cluster when the store has a
// hash tag (WithHashTag). A batch script applies, key by key and in order,
// the same Lua function as the one-key script (acquire.lib.lua,
// complete.lib.lua), and each key keeps its own outcome; a key whose value
// is foreign fails alone. The per-call work (parsing, script lookup, TIME)
// is paid once per batch. On a Cluster without a hash tag, a batch is a
// pipeline of one-key scripts, split by node.
//
// Records whose attempt carries an effect (CompleteEffectBatch, used by
// CommitBatch for a batch with effects, and CompleteAndAckBatch) are not
// packed into a batch script: each is one call of its effect's script or
// function, and those calls go in one pipeline per registered effect, so a
// consumer's batch still completes in one or two round trips, each
// record's check, effect and completion one atomic call as with
// CompleteEffect.
//
// An IN_PROGRESS record expires one lease plus storekit.InProgressGrace after
// its lease ends; COMPLETED, RELEASED and FAILED records after the
// retention. The fence is seeded as max(previous + 1, server time in µs),
// so it still grows after a record was deleted or expired.
//
// # Retries
//
// Every script is safe to repeat after a lost reply: acquire with the same
// owner returns the fence it handed out, complete with the same lease and
// result succeeds again, fail and release likewise. So a client library
// that retries on a broken connection never executes anything twice.
//
// # Durability
//
// WithWait and WithWaitAOF send WAIT or WAITAOF after acquire and complete,
// on the same connection as the script; too few acknowledgements yield an
// error wrapping idem.ErrNotDurable. With appendfsync everysec, WAITAOF
// returns at the next fsync: up to a second per acquire and complete
// (appendfsync always pays the fsync in the write instead), on a server
// whose WAITAOF waits for the fsync, which Redis 7.4.1 and Valkey 8.0.1 do
// not (refused at start; idem doctor --wait-aof probes other releases).
// Without them, a failover that loses the last writes can let a key run
// twice. Run Redis with noeviction and persistence (appendonly yes) for
// idempotency records.
//
// # Notifications
//
// Complete, fail and release publish on <prefix>{<digest>}:w (PUBLISH on a
// standalone server, SPUBLISH on a Cluster), so that idem.Executor.Await
// wakes across processes; Watch subscribes and returns after the server
// confirmed the subscription (a standalone store's watches share one
// connection). WithNotify(false) turns the publish off.
//
// # Local replay cache
//
// Acquire answers the replay of a COMPLETED or terminal FAILED record from
// a local cache, with no round trip: such a record does not change until it
// is deleted or expires. The server keeps the cache consistent (client
// tracking): a write or a delete of the key by any client (idem rm
// included) invalidates the entry as soon as the server's message arrives;
// the entry's local end is the key's PTTL read with it (at most a minute),
// counted from before the read was sent, less 10 ms, so it never outlives
// the record's retention, however long the reply took to arrive (rueidis
// dates its own entries from the reply's arrival: the store keeps its own
// date of each entry and serves it only before then); when the connection
// that carries the invalidations breaks, every entry is dropped. An
// IN_PROGRESS record is never served from the cache, and the fingerprint
// is checked as the script checks it (Mismatch). Only a key whose acquire
// returned a replay is read through the cache (one GET, then local hits),
// so new keys cost nothing more.
//
// With rueidis (and valkey-go alike) the cache is the client's own
// client-side cache (RESP3 tracking on its own connections), an LRU bounded in bytes per connection
// (ClientOption.CacheSizeEachConn); a client built with DisableCache reads
// the key from the server each time, which is correct and a little cheaper
// than the script. On a Cluster client without a cache rueidis's DoCache
// panics in its own goroutine when the server answers ASK, and rueidis does
// not say whether a client has a cache; so on a Cluster the store learns it
// from the first replays' replies, read until then through
// rueidis.MGetCache.
//
// With a go-redis *redis.Client (standalone or Sentinel) the store keeps
// the cache itself: an LRU bounded in bytes (WithReplayCacheBytes, 32 MiB by
// default), with connections of its own opened with the client's options,
// in RESP2: one tracking connection (named idem-tracking in CLIENT LIST),
// subscribed to __redis__:invalidate, and up to 4 reader connections
// (idem-tracking-reader), which turn on CLIENT TRACKING redirected to the
// tracking connection and send the cache's GET and PTTL. The server then
// remembers which keys the readers read and reports a write of those keys
// only, by any client: a key never read through the cache (every new key)
// costs no invalidation. In RESP2 the server forgets what a connection
// read when it closes, without a message, so the store reads each reader
// connection at all times and drops every entry as soon as one ends
// (CLIENT KILL, the server's timeout, an error, a canceled read); when the
// tracking connection ends, its readers are closed too and new ones open
// with the next. Nothing is cached or served until the tracking
// connection's subscription is confirmed and a reader turned tracking on;
// a read in flight when its key is invalidated is not cached; a FLUSHALL,
// a broken connection or a ping unanswered for 3 s drops every entry. The
// tracking connection follows the client: the store adds a dial hook to the
// client (AddHook), and when the client (or a reader) connects to another
// server (after a Sentinel failover, the new primary) every entry is
// dropped at once and the tracking connection moves there. go-redis
// connects to a new primary only when it sends a command, so the store
// PINGs through the client once a second. If the server refuses CLIENT
// TRACKING (an ACL), the store logs one warning and reads replays from the
// server. Store.Close ends these connections (a store that is collected
// without Close ends them too).
//
// The cache is on by default, and off with WithWait or WithWaitAOF (those
// callers asked that each acquire wait for replicas) and on a go-redis
// Cluster; WithReplayCache(false) turns it off. The store's index of
// replayed keys holds at most 65,536 of them.
//
// # Listing
//
// List, for admin tools (idem ls), walks the key space with SCAN MATCH
// <prefix>{*} TYPE string, on every primary of a Cluster; it never sends
// KEYS.
package redisstore
