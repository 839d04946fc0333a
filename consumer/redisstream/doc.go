// Package redisstream consumes a Redis stream in a consumer group and runs a
// handler at most once per idempotency key, with idempotency records in a
// redisstore.Store on the same Redis (or Cluster).
//
//	store, _ := redisstore.New(rdb, redisstore.WithHashTag("orders"))
//	exec, _ := idem.New(store, idem.WithLease(time.Minute))
//	c, _ := redisstream.New(rdb, "{orders}:created", "billing", "billing-1", exec,
//		func(ctx context.Context, msg redis.XMessage) error {
//			fence, _ := idem.FenceFrom(ctx)
//			return charge(ctx, msg.Values["key"], fence)
//		}, consumer.WithScope("orders"))
//	err := c.Run(ctx)
//
// # The loop
//
// Run fetches batches: first entries idle for longer than the claim idle
// time (XAUTOCLAIM: entries of crashed consumers, and entries left pending
// for a retry), then new entries (XREADGROUP … COUNT batch BLOCK block).
// Each batch goes through a consumer.Processor, the one consumer algorithm
// of this repository (see package consumer for its rules); this package
// only translates entries in and actions out:
//
//   - every key is acquired before any handler runs, with one
//     adapterkit.BeginBatch on the consumer's own Executor: one script call
//     per 128 keys (redisstore.Store.AcquireBatch), so a batch costs about
//     two round trips; a key repeated within the batch follows its first
//     occurrence instead of being acquired again;
//   - handlers run in stream order, with the lease and fence in their
//     context (idem.FenceFrom), cancelled if the lease is lost; a panic is
//     recovered as consumer.ErrPanic;
//   - the successful ones are completed and acknowledged in one script call
//     per 128 entries (redisstore.Store.CompleteAndAckBatch, called by the
//     Processor's commit hook through adapterkit.CommitBatchWith, so the
//     Executor encodes, compresses and seals the result as configured):
//     each record becomes COMPLETED and its entry is XACKed in the same
//     script, so no crash can fall between the two;
//   - a duplicate whose key is COMPLETED is acknowledged (one XACK for the
//     batch) without running the handler;
//   - a duplicate whose key is IN_PROGRESS elsewhere, a handler error, a
//     store error or a lost lease leave the entry pending, never
//     acknowledged: it is claimed again once idle for the claim idle time;
//   - after consumer.WithMaxDeliveries deliveries (the larger of the group's
//     delivery counter and the record's acquisitions), or for an error
//     marked idem.Terminal, the key becomes FAILED and the entry is copied
//     to the dead-letter stream ("<stream>:dlq", with "dlq-error", "dlq-id"
//     and "dlq-deliveries" fields) and acknowledged, in one script;
//   - an entry without a key (WithKeyFunc), or with a key or fingerprint over
//     its limit, is dead-lettered at once and counted in Stats.Invalid;
//     fingerprint mismatches are dead-lettered too.
//
// While handlers run, the lease heartbeat of the Executor extends each
// record, and the consumer touches its batch's pending entries (XCLAIM …
// JUSTID to itself, which resets their idle time without counting a
// delivery) every third of the claim idle time, so that other consumers do
// not claim entries whose handler is still running.
//
// # Shutdown
//
// When Run's context is cancelled it stops fetching, lets the batch in
// flight finish for up to consumer.WithShutdownTimeout, then cancels the handlers'
// contexts; their keys are released and their entries stay pending for
// another consumer. A handler that ignores its context's cancellation is
// abandoned consumer.AbandonAfter (one second) later
// (consumer.ErrAbandoned): its entry stays pending, its key is left to its
// lease (IN_PROGRESS, no longer extended), and the consumer that claims the
// entry takes the key over with a higher fence once the lease ended. The
// handler's goroutine runs on until it returns; what it returns then is
// ignored: its completion, which would acknowledge the entry in the same
// script, is never made.
//
// # Redis Cluster
//
// A Lua script touches one slot, so the stream, its dead-letter stream and
// the records must share a hash tag: create the store with
// redisstore.WithHashTag(tag) and name the streams "{tag}…". All records of
// that store then live in one slot, on one primary: a stream's idempotency
// records do not spread over the Cluster. Use one store (tag) per stream to
// spread several streams. New refuses a configuration whose names cannot
// share a script.
//
// # Guarantees and limits
//
// One execution per key while the store holds the record (its retention),
// except after a lease expiry, which the fence tells apart. A crash after a
// handler's side effect but before its batch's complete-and-ack runs the
// handler again (with a higher fence) when the entry is claimed: exactly
// once effects need the side effect's own system to be idempotent or to
// record the key. Retried entries come back after max(delay, claim idle),
// not at the exact delay. Stores with WithWait or WithWaitAOF cannot be
// used (the pipelined script calls do not wait for replicas).
//
// # Outbox messages
//
// Sender appends the messages of the transactional outbox's relay (package
// pgoutbox of the postgres module, `idem relay --outbox redis-stream://…`):
// the key in the field key, which a Consumer reads by default, the payload
// in the field payload (PayloadField), each header in a field of its name.
// A Consumer set to read its key elsewhere reads the outbox's with
// WithKeyFunc(KeyField(DefaultKeyField)).
package redisstream
