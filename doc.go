// Package idem makes a non-idempotent operation (charge a card, create an
// order, send a notification) take effect once per idempotency key, even
// when requests are retried, messages are redelivered, consumers crash, or
// two instances receive the same work at the same moment.
//
// A Store holds one record per key and moves it through a small state
// machine atomically (IN_PROGRESS, COMPLETED, RELEASED, FAILED); the
// redisstore package does it with one Lua script per transition on Redis,
// Valkey or a Redis Cluster, memstore in one process. An Executor runs
// operations on top of a Store:
//
//	store, _ := memstore.New() // or redisstore.New(redisClient)
//	exec, _ := idem.New(store)
//	res, err := exec.Do(ctx, idem.Key{Scope: "charge", ID: idempotencyKey}, fingerprint,
//		func(ctx context.Context) ([]byte, error) {
//			fence, _ := idem.FenceFrom(ctx)
//			return chargeCard(ctx, fence)
//		})
//	// res.Replayed tells a replayed result from a fresh one.
//
// # The API, by who uses it
//
// The user's path: New and its options; Do (or Typed for a Go value);
// Begin and the attempt's four endings for callers that cannot wrap their
// operation in a function; WithWait and WaitFor to wait for another
// caller's attempt on the same key instead of getting an InProgressError
// (Await to wait without calling again); FenceFrom and LeaseFrom in the
// operation's context; the errors of errors.go; WithOnLeaseLost to
// compensate work whose lease was lost. The endings, by what the record
// becomes: Commit, COMPLETED with the result; Fail, FAILED or RELEASED as
// the failure policy decides for the operation's error (FAILED whatever
// the policy on a last try, SetLastTry: the operation took effect, its
// result cannot be stored); Release, RELEASED without counting a failure
// (the operation did not start); Abandon, left IN_PROGRESS until the lease
// expires (the outcome is unknown) or until another writer records it.
//
// Adapter writers (broker consumers, middleware, the proxy, the commit
// gate) import package adapterkit too: the Executor's batch calls
// (BeginBatch, CommitBatch, and CommitBatchWith for a store call that
// completes more in the same atomic step, a stream acknowledgement), its
// settings and its result codec.
//
// Store writers import package storekit, the contract (storekit.Store, of
// which Store here is an alias), its optional capabilities, the record
// types, the validators and the errors a store returns; the storetest
// package is their conformance suite.
//
// # Guarantees
//
// Exactly one execution starts per key while the store holds the record,
// except after a lease expiry: an owner that stops extending its lease (it
// crashed, or it was paused for longer than the lease) can be taken over,
// and then two executions may overlap. The fencing token tells them apart:
// it strictly increases with every acquisition of a key, so a side effect
// that records the highest fence it has seen ("UPDATE ... WHERE fence < $1")
// rejects the stale owner. Exactly-once effects therefore need the fence to
// be checked by the side effect's own system, or the side effect to be
// idempotent itself.
//
// If the store loses a write (a Redis failover without WAIT, eviction, no
// persistence), a duplicate execution is possible. redisstore offers WAIT
// and WAITAOF durability options.
//
// # Keys and fingerprints
//
// A Key is a client's ID within a scope; stores only ever see its digest
// (Key.Digest), never the raw key. A fingerprint identifies the request's
// payload: the same key with another fingerprint is refused with
// ErrMismatch rather than replaying a result that belongs to another
// request.
//
// # Leases and heartbeats
//
// An execution holds its key for a lease (30s by default) that the Executor
// extends every third of it while the operation runs. If an extension finds
// that the key was taken over, the operation's context is cancelled with
// cause ErrLeaseLost and nothing is stored. Time is always the store's
// clock, never the caller's, for the record; the caller's own clock only
// bounds its side: the lease ends, as far as the caller can know, at the
// send time of the acquire (or of the last successful extension) plus the
// lease, which is no later than the store's end of it. So an operation
// never starts after that local deadline (a reply that comes later fails
// Do with ErrLeaseLost and releases the key), and its context is cancelled
// at it, with a cause wrapping ErrLeaseLost, unless an extension moved it
// in time (Attempt.LeaseDeadline reports it; the context's Deadline does not,
// because extensions move it).
//
// # Failures
//
// An operation that returns an error releases the key, so a retry runs it
// again, unless the error is terminal (see Terminal and WithFailurePolicy):
// then the key becomes FAILED and the error's text is replayed. After
// WithMaxAttempts acquisitions a key that keeps failing, panicking or
// losing its owner becomes FAILED too. A panic releases the key and
// continues.
package idem
