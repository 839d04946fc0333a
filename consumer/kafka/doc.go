// Package kafka runs a Kafka consumer group, with franz-go, at most once per
// idempotency key and commits each record only after its key is COMPLETED,
// so that at-least-once delivery becomes one execution per key with
// nothing lost.
//
// Each poll is split by partition, and each partition's records into
// batches of consumer.WithBatchSize records; a batch is handled in offset order by
// one consumer.Processor call, a partition's batches one after the other,
// partitions concurrently (consumer.WithConcurrency). Then, for each record of a
// batch in order:
//
//   - completed now or before (a duplicate is replayed without running the
//     handler): marked for commit (kgo.AutoCommitMarks);
//   - dead-lettered (no key, handler failed consumer.WithMaxDeliveries times, key
//     reused with another fingerprint, key FAILED): produced to the
//     dead-letter topic ("<topic>.dlq" by default) with its headers plus
//     HeaderError and friends, the produce acknowledged, then marked;
//   - to retry (key in progress elsewhere, handler error, store error):
//     Kafka cannot nack one record, so the partition stops there: nothing
//     from that record on is marked, the partition is paused, its offset
//     set back to the record, and fetching resumes after the delay. The
//     record and the ones after it come again in order; those that had
//     completed are replayed.
//
// When a partition is revoked or lost, the contexts of its in-flight
// handlers are cancelled, its records are no longer marked, and what was
// marked before is committed (on revoke) before the partition moves.
// Run's shutdown stops fetching, lets in-flight batches finish (at most
// consumer.WithShutdownTimeout), commits and leaves the group.
//
// A handler that ignores its context's cancellation (at the shutdown
// timeout, or at a revoke) is abandoned consumer.AbandonAfter (one second)
// later (consumer.ErrAbandoned): Run, or the rebalance, goes on without
// it, its record is not committed, and its key is left to its lease (the
// record stays IN_PROGRESS and is no longer extended), so that the member
// that consumes the partition next takes the key over with a higher fence
// once the lease ended. The handler's goroutine runs on until it returns;
// what it returns then is ignored.
//
// Example:
//
//	store, _ := redisstore.New(rdb)
//	exec, _ := idem.New(store)
//	kopts := []kgo.Opt{kgo.SeedBrokers("localhost:9092"),
//		kgo.ConsumerGroup("billing"), kgo.ConsumeTopics("orders")}
//	c, err := kafka.New(kopts, exec, func(ctx context.Context, r *kgo.Record) error {
//		fence, _ := idem.FenceFrom(ctx)
//		return charge(ctx, r.Value, fence) // UPDATE … WHERE fence < $fence
//	}, kafka.WithKeyHeader("Idempotency-Key"), consumer.WithScope("billing"))
//	if err != nil {
//		return err
//	}
//	return c.Run(ctx)
//
// # Limits
//
//   - Kafka keeps no delivery count: the count of consumer.WithMaxDeliveries is the
//     larger of the handler runs this member saw and the acquisitions of
//     the key in the store, which survive a restart or a rebalance. A
//     handler that panics does not crash the consumer: the panic is the
//     record's error (consumer.ErrPanic).
//   - The idempotency key comes from the header Idempotency-Key by default
//     (WithKeyHeader, WithKeyFunc with KeyField or KeyHash); a record
//     without one is dead-lettered. The record key is a choice to make
//     explicitly (WithRecordKey): record keys are usually partition keys,
//     and two different events with the same one would be taken for
//     duplicates.
//   - Kafka has no per-record timer to extend: the group session is kept
//     alive by franz-go's background heartbeats, and the idempotency lease
//     by the Executor's heartbeat while the handler runs. If the lease is
//     lost anyway (another owner took the key over after the store was
//     unreachable for a lease), the handler's context is cancelled and its
//     record is not committed.
//   - Order: handlers of one partition run in offset order, but a record
//     that must be retried does not stop the records after it in the same
//     batch from running (the Processor acquires a whole batch at once);
//     it is redelivered after them. Effects of different keys can thus be
//     reordered around a retry.
//   - A record after which the process crashes (handler done, key
//     COMPLETED, offset not committed) is redelivered and replayed: the
//     handler does not run again. A crash between the side effect and the
//     completion leaves the key IN_PROGRESS until the lease expires; the
//     next owner runs the handler again with a higher fence, so the side
//     effect must check the fence (or be idempotent) for exactly-once
//     effects.
//   - The next poll waits for every partition of the current one: a slow
//     partition delays the others of this member.
//
// # Outbox messages
//
// Sender produces the messages of the transactional outbox's relay
// (package pgoutbox of the postgres module, `idem relay --outbox
// kafka://…`): the key in the header Idempotency-Key, which a Consumer
// reads by default, and as the record key. A Consumer set to read its key
// elsewhere reads the outbox's with WithKeyHeader(DefaultKeyHeader).
package kafka
