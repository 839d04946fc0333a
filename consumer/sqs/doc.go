// Package sqsconsumer runs Amazon SQS message handlers at most once per
// message key, on top of an idem.Executor and the shared consumer.Processor.
// SQS delivers at least once; this package turns that into one completed
// execution per key, with nothing lost.
//
// For every received batch (up to 100 messages, received ten at a time):
//
//   - the key comes from a KeyFunc (default: MessageDeduplicationId, else the
//     message attribute "idempotency-key"); a message without one is sent
//     to the dead-letter queue and counted in Stats.Invalid; one whose key
//     the store refuses (idem.ErrInvalid: over 255 bytes, control
//     characters) is dead-lettered too;
//   - the keys are acquired, the handlers run with the lease and fence in
//     their context (idem.FenceFrom), the keys are completed, and only then
//     are the messages deleted (DeleteMessageBatch);
//   - while the batch runs, its visibility timeout is renewed every third
//     of it (ChangeMessageVisibilityBatch), so a long handler keeps its
//     messages; the idem lease is extended by the Executor at the same time;
//   - a duplicate whose key is COMPLETED is deleted without running the
//     handler; a duplicate whose key is IN_PROGRESS elsewhere is not
//     deleted: its visibility is set to the remaining lease, so SQS delivers
//     it again later;
//   - a handler error releases the key and sets the message's visibility to
//     the retry delay; when ApproximateReceiveCount reaches MaxDeliveries the
//     key becomes FAILED, the message is sent to the dead-letter queue
//     (SendMessage) and then deleted.
//
// The Consumer sends dead letters itself rather than relying on the queue's
// redrive policy, because messages without a key and key mismatches must be
// dead-lettered at once, and because IN_PROGRESS duplicates are received
// again while they wait, which raises their receive count without any
// failure. If the queue has a redrive policy, set its maxReceiveCount well
// above MaxDeliveries (it then only catches messages the Consumer could not
// handle at all); a redriven message is not lost, it is in the dead-letter
// queue.
//
// Example:
//
//	client := sqs.NewFromConfig(cfg)
//	exec, _ := idem.New(store)
//	c, err := sqsconsumer.New(client, queueURL, dlqURL, exec,
//		func(ctx context.Context, m types.Message) error {
//			fence, _ := idem.FenceFrom(ctx)
//			return charge(ctx, *m.Body, fence)
//		},
//		consumer.WithBatchSize(10),
//		sqsconsumer.WithVisibilityTimeout(30*time.Second))
//	if err != nil {
//		return err
//	}
//	return c.Run(ctx) // until ctx is cancelled; then drains in-flight batches
//
// # Outbox messages
//
// Sender sends the messages of the transactional outbox's relay (package
// pgoutbox of the postgres module, `idem relay --outbox sqs://…`): the key
// in the message attribute idempotency-key (on a FIFO queue also as the
// deduplication id), which DefaultKey reads.
package sqsconsumer
