// Package pgoutbox is a transactional outbox on PostgreSQL: a message is
// written in the caller's transaction and sent to a broker if and only if
// that transaction commits, at least once, with its idempotency key, so
// that an idem consumer downstream processes it exactly once in effect.
//
// Inside a commit gate's operation (package pggate) the message commits
// with the effect and the completion row, once per idempotency key
// whatever the store says; a retry that conflicts rolls its message back
// with its effect:
//
//	res, err := gate.Do(ctx, idem.Key{Scope: "checkout", ID: orderID}, fp,
//		func(ctx context.Context, tx pgx.Tx) ([]byte, error) {
//			if _, err := tx.Exec(ctx, `INSERT INTO orders ...`); err != nil {
//				return nil, err
//			}
//			return []byte(`{"status":"paid"}`), pgoutbox.Publish(ctx, tx,
//				"orders", "order-paid:"+orderID, event, map[string]string{"type": "order.paid"})
//		})
//
// A Relay sends the rows (Run, or `idem relay --outbox URL` as a process)
// and marks them sent once the broker confirmed them; its janitor deletes
// sent rows after the retention (WithRetention, Sweep).
//
// # Keys
//
// The key is the message's idempotency key: a consumer processes one
// message per key (and scope). Derive it from what the message stands for
// (the request's key and the event's name: "order-42:paid"), never from
// something that several messages share (a customer, an account). Each
// sender puts the key where that broker's idem consumer adapter reads it
// by default, so the adapters need no configuration:
//
//   - Kafka (kafka.NewSender, module consumer/kafka): the header
//     Idempotency-Key, and the record key (one partition per key);
//     confirmed by the produce acknowledgement (ProduceSync).
//   - RabbitMQ (rabbitmq.NewSender, module consumer/rabbitmq): the
//     message-id property, and the header Idempotency-Key; confirmed by the
//     publisher confirm, published mandatory (a message no queue takes is
//     a failed send, not a lost message).
//   - NATS JetStream (natsconsumer.NewSender, module consumer/nats): the
//     header Nats-Msg-Id (JetStream's own deduplication id), and the header
//     Idempotency-Key; confirmed by the stream's PubAck.
//   - SQS (sqsconsumer.NewSender, module consumer/sqs): the message
//     attribute idempotency-key (on a FIFO queue also the message group
//     and the deduplication id); confirmed by the SendMessage reply.
//   - Redis Streams (redisstream.NewSender, package consumer/redisstream
//     of the root module): the field key, the payload in the field
//     payload, each header in a field of its name; confirmed by the XADD
//     reply.
//
// The senders live in the modules that already hold each broker's client,
// and implement Sender without importing this package, so that a broker's
// module never depends on pgx and this module never on a broker's client.
// The header names a sender writes itself (KeyHeader, Nats-Msg-Id, key,
// payload) are refused as Publish's headers.
//
// # Delivery and order
//
// At least once: a row is marked sent in the transaction that claimed it,
// after the broker confirmed it. A relay that dies between the broker's
// confirmation and that commit leaves the row unsent, and it is sent again;
// the consumer deduplicates it by its key. A failed send keeps the row,
// with its error and its count of attempts, and tries again after a
// backoff (WithBackoff); a message the broker refuses every time (a
// destination that does not exist, a message over the broker's limits)
// stays in the table, and holds back its key, until it is fixed or
// deleted.
//
// In order per destination and key: several relays share the work (each
// batch is claimed with FOR UPDATE SKIP LOCKED), and a row is claimed only
// when no earlier row of its destination and key is unsent, so a relay
// never sends a key's next row while another holds its previous one (see
// Relay.Send for the exact rule). Messages of different keys have no order.
//
// # Schema
//
// Migrate creates the table idem_outbox in the first schema of the
// connection's search_path; schema.sql (Schema) holds the same SQL for
// migration tools. Publish needs INSERT on it, the relay SELECT, UPDATE
// and DELETE. A missing table is reported as ErrNoTable.
package pgoutbox
