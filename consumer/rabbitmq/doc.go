// Package rabbitmq consumes a RabbitMQ queue (github.com/rabbitmq/amqp091-go)
// with the idempotency layer of consumer.Processor: the handler runs at
// most once per message key, and a message is acknowledged only after its
// key is COMPLETED (or after a copy of it was safely published to the retry
// or dead-letter queue).
//
//	exec, _ := idem.New(redisStore)
//	c, err := rabbitmq.New("amqp://guest:guest@127.0.0.1:5672/", "orders", exec,
//		func(ctx context.Context, d *amqp.Delivery) error {
//			fence, _ := idem.FenceFrom(ctx)
//			return charge(ctx, d.MessageId, d.Body, fence)
//		}, consumer.WithScope("orders"))
//	err = c.Run(ctx) // until ctx is cancelled; reconnects by itself
//
// # Flow
//
// Run consumes with manual acknowledgements and a prefetch (basic.qos, see
// WithPrefetch). It takes a batch of deliveries (consumer.WithBatchSize, WithBatchWait), reads each
// one's key (WithKeyFunc; the default is the message-id property) and hands
// the batch to one Processor.Process call, then settles every delivery by
// its consumer.Action (consumer.WithConcurrency processes several batches at once):
//
//   - Ack: the handler ran and the key is COMPLETED, or the key was
//     COMPLETED before (a duplicate; the handler did not run). The delivery
//     is acked (one multiple ack for a batch that is all acks).
//   - Retry: a duplicate whose key is IN_PROGRESS elsewhere, a handler or
//     store error (the key was released), or a lost lease. A copy of the
//     message is published to the retry queue with a per-message
//     expiration of the Result's Delay (capped by WithMaxDelay); once its
//     publisher confirm arrives, the original is acked. The copy comes back
//     to the queue when it expires.
//   - DeadLetter: a message without a valid key, a key whose fingerprint
//     differs, or a handler that failed the processor's MaxDeliveries
//     times (the key is FAILED then). A copy with the headers x-idem-error
//     and x-idem-queue is published to the dead-letter queue; once
//     confirmed, the original is acked.
//
// If a copy cannot be published or is not confirmed, the original is
// rejected with requeue instead, so it is never dropped.
//
// # Topology
//
// On every (re)connection Run declares, all durable:
//
//   - the queue, with the arguments of WithQueueArgs;
//   - the retry queue <queue>.retry (WithRetryQueue), without consumers,
//     with x-dead-letter-exchange "" and x-dead-letter-routing-key <queue>:
//     expired copies return to the queue through the default exchange;
//   - the dead-letter queue <queue>.dlq (consumer.WithDeadLetter), unless
//     WithDeadLetterExchange names an exchange of the user's instead.
//
// Why a retry queue and not a nack with requeue after sleeping: RabbitMQ
// has no per-message delay on nack, a held delivery occupies a prefetch
// slot and counts against the broker's consumer_timeout, and a requeued
// message carries no count of its attempts. A published copy frees the
// consumer at once and carries its count in a header.
//
// # Delivery count
//
// The processor needs the number of deliveries to dead-letter a message
// that keeps failing. The Consumer keeps it in the header
// x-idem-deliveries, incremented on each retry copy after a failed attempt
// (not after an in-progress duplicate, which did not try), and adds
// x-delivery-count, which RabbitMQ sets on quorum queues when it
// redelivers a message itself (after a consumer crashed). On classic
// queues such broker redeliveries are not counted.
//
// # Connection loss and shutdown
//
// When the connection or the channel closes, Run reconnects with
// exponential backoff and jitter (WithBackoff), re-declares the topology,
// and consumes again. RabbitMQ requeues every delivery that was not acked,
// and the record of each key decides what a redelivery does: a replay if
// the key completed before the loss, a fresh run if it was released.
//
// A refusal that reconnecting cannot heal ends Run with that error (see
// Run for the list): wrong credentials or a missing permission
// (ACCESS_REFUSED), a missing vhost (NOT_ALLOWED), a dead-letter exchange
// that does not exist (NOT_FOUND), a queue declared elsewhere with other
// arguments or an invalid argument (PRECONDITION_FAILED, before
// consuming).
//
// When Run's context is cancelled, it stops taking deliveries, waits for the
// handlers of the batch in flight (their context is cancelled after
// consumer.WithShutdownTimeout, which releases their keys), settles that batch and
// closes the connection: the prefetched deliveries no handler saw go back
// to the queue. A handler that ignores its context's cancellation is
// abandoned consumer.AbandonAfter (one second) later
// (consumer.ErrAbandoned): its delivery is settled as a Retry, whose copy
// expires after the rest of the key's lease; the key is left to that
// lease (IN_PROGRESS, no longer extended, then taken over with a higher
// fence by the copy's delivery); the handler's goroutine runs on until it
// returns, and what it returns then is ignored (it must not ack the
// delivery itself: the channel is closed by then).
//
// # Guarantees and limits
//
// Effects happen once per key within the limits of the idem package: a
// handler paused past its lease can run concurrently with a takeover, so
// side effects should check the fencing token (idem.FenceFrom), for example
// "UPDATE ... WHERE fence < $1". RabbitMQ has no per-message timer to
// extend while a handler runs: the idempotency lease is extended by the
// Executor's heartbeat, and a handler must finish within the broker's
// consumer_timeout (30 minutes by default) or the channel is closed and the
// message redelivered. A retry copy's expiration only takes effect at the
// head of the retry queue, so a short delay can wait behind a longer one
// (at most WithMaxDelay). Message order is not kept across retries. A
// retry copy that RabbitMQ confirmed but whose original's ack was lost (a
// connection loss in between) yields two copies; the record makes the
// second one a replay. Likewise the dead-letter queue can receive a
// message twice. A dead-letter exchange of the user's that routes nowhere
// loses the dead letter: publisher confirms do not tell.
//
// # Outbox messages
//
// Sender publishes the messages of the transactional outbox's relay
// (package pgoutbox of the postgres module, `idem relay --outbox
// amqp://…`): the key in the message-id property, which a Consumer reads
// by default (MessageIDKey), and in the header Idempotency-Key
// (OutboxKeyHeader). A Consumer set to read its key elsewhere reads the
// outbox's with WithKeyHeader(OutboxKeyHeader).
package rabbitmq
