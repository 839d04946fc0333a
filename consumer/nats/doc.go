// Package natsconsumer runs NATS JetStream messages through the idem
// consumer.Processor: one handler execution per message key, with nothing
// lost, on top of JetStream's at-least-once delivery. It uses the jetstream
// API of github.com/nats-io/nats.go (pull consumers, explicit ack).
//
// A Consumer fetches a batch (Fetch with up to consumer.WithBatchSize messages) and
// processes it with one Processor.Process call, then maps each outcome:
//
//   - Ack (the key is COMPLETED, now or before): msg.Ack. A duplicate of a
//     completed key is acked without running the handler.
//   - Retry (the key is IN_PROGRESS elsewhere, the handler failed, the store
//     is unreachable, or the lease was lost): msg.NakWithDelay with the
//     Result's delay (the remaining lease of the other owner, or the
//     processor's retry delay). The message is never acked, never dropped.
//   - DeadLetter (no key, payload mismatch, a terminal error, or the
//     processor's WithMaxDeliveries reached; the key is then FAILED): the
//     message is published to the dead-letter subject with the reason in
//     headers, the publish acknowledgement is awaited, then msg.Term.
//
// The key comes from the Nats-Msg-Id header by default (JetStream's own
// publish deduplication ID, whose server-side window is two minutes and
// does not cover redeliveries), or another header (WithKeyHeader) or any
// function of the message (WithKeyFunc). Deliveries come from
// msg.Metadata().NumDelivered.
//
// While a batch runs, each of its messages is marked in progress
// (msg.InProgress) every third of the consumer's AckWait, so that a long
// handler does not see its message redelivered; the idem lease is extended
// by the Executor at the same time, and a lost lease cancels the handler's
// context (the message is then retried, not acked).
//
// Run stops when its context is done: it stops fetching, lets the
// in-flight batch finish within the shutdown timeout (then cancels its
// handlers, whose keys are released and messages redelivered) and naks
// messages whose fetch was still under way. A handler that ignores its
// context's cancellation is abandoned consumer.AbandonAfter (one second)
// later (consumer.ErrAbandoned): its message is naked with the rest of the
// key's lease as delay, its key is left to that lease (IN_PROGRESS, no
// longer extended, then taken over with a higher fence by the redelivery),
// and its goroutine runs on until it returns; what it returns then is
// ignored.
//
// Example:
//
//	store, _ := redisstore.New(rdb) // errors elided
//	exec, _ := idem.New(store)
//	cons, _ := js.CreateOrUpdateConsumer(ctx, "ORDERS", jetstream.ConsumerConfig{
//		Durable: "billing", AckPolicy: jetstream.AckExplicitPolicy, MaxDeliver: -1,
//	})
//	c, err := natsconsumer.New(js, cons, exec, func(ctx context.Context, msg jetstream.Msg) error {
//		fence, _ := idem.FenceFrom(ctx)
//		return charge(ctx, msg.Data(), fence) // the side effect checks the fence
//	}, consumer.WithScope("orders"))
//	if err != nil {
//		return err
//	}
//	return c.Run(ctx) // returns ErrStopped after ctx is done
//
// Guarantees and limits are those of the consumer package, plus: the
// consumer should have MaxDeliver -1 (with a server-side limit, a message
// on its last delivery that would be retried is dead-lettered instead of
// being dropped), and a stream must capture the dead-letter subject. See
// the README for the full list.
//
// # Outbox messages
//
// Sender publishes the messages of the transactional outbox's relay
// (package pgoutbox of the postgres module, `idem relay --outbox
// nats://…`): the key in the header Nats-Msg-Id, which a Consumer reads by
// default, and in the header Idempotency-Key (OutboxKeyHeader). A Consumer
// set to read its key elsewhere reads the outbox's with
// WithKeyHeader(OutboxKeyHeader).
package natsconsumer
