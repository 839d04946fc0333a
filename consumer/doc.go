// Package consumer turns at-least-once delivery into one execution per
// message key. It holds the one consumer algorithm, Processor, that every
// broker adapter of this repository (consumer/redisstream, consumer/kafka,
// consumer/nats, consumer/rabbitmq, consumer/sqs) runs: an adapter turns
// broker messages into Messages and the Processor's Actions into the
// broker's acknowledgements, nothing more.
//
// Every adapter has one shape: New(<broker handles>, exec, handler,
// opts...) and Run(ctx). Options of one meaning are this package's (Option:
// WithScope, WithMaxDeliveries, WithRetryDelay, WithBatchSize,
// WithConcurrency, WithShutdownTimeout, WithDeadLetter, WithLogger,
// WithEventHook, WithOnLeaseLost, WithPassDuplicates), accepted by every
// adapter; an adapter's own options are made with AdapterOption, and New
// refuses what it cannot honour. Adapters build their Processor with Setup.
//
// The order of operations for each message is: acquire the key, run the
// handler (with the lease and fence in its context), complete the key, and
// only then acknowledge. So:
//
//   - a duplicate whose key is COMPLETED is acknowledged without running the
//     handler (Ack, Replayed);
//   - a duplicate whose key is IN_PROGRESS elsewhere is never acknowledged:
//     it is redelivered after the lease left (Retry);
//   - a handler error, a panic (recovered as ErrPanic), or an effect
//     (idem.SetEffect) that the store refused at the completion, releases
//     the key and the message is redelivered (Retry), until it was delivered
//     MaxDeliveries times (the larger of the broker's count and the record's
//     acquisitions in the store, so a restart loses no count): then the key
//     becomes FAILED and the message goes to the dead-letter path
//     (DeadLetter);
//   - an effect that failed after it wrote (idem.ErrEffectPartial: the
//     store ended the key FAILED) is dead-lettered at once, with that error
//     as the reason: a redelivery would apply its first writes again;
//   - a message without a key, or with a key or fingerprint over its limit,
//     is dead-lettered at once: redelivering it cannot fix it;
//   - a message whose key repeats an earlier message of the same batch
//     follows that message (see Processor.Process).
//
// When Run is told to stop, the handlers in flight get the shutdown timeout
// (WithShutdownTimeout) to finish; then their contexts are cancelled, and a
// handler that returns releases its key (its message is redelivered). A
// handler that ignores its context is waited for AbandonAfter (one second)
// more, then abandoned (ErrAbandoned, counted in Stats.Abandoned), so that
// Run returns within about the shutdown timeout plus a second, whatever
// the handlers do. An abandoned handler's key is not released, since the
// handler may still be doing its work: it is left to its lease (the
// record stays IN_PROGRESS under the handler's fence and the heartbeat
// stops), and once the lease ended the message's redelivery takes the key
// over with a higher fence. Its message is not acknowledged. Its goroutine
// runs on until the handler returns (it leaks until then); what the handler
// returns then is ignored (nothing is completed, released or acknowledged
// for it), but whatever else it did, a write after the takeover included,
// happened: side effects must check the fence (idem.FenceFrom), as for any
// owner paused past its lease.
//
// A crash anywhere before the acknowledgement leads to a redelivery, which
// the record turns into a replay (after completion) or a takeover (after the
// lease). Nothing is lost; effects happen once per key, within the limits
// of the idem package's guarantees (the fence, for owners that were paused
// past their lease).
//
// Every decision is counted in Stats, reported to the event hook
// (WithEventHook) and logged with log/slog under the key's digest, never
// the key.
package consumer
