// Package outbox holds the reliability scenarios of the transactional
// outbox (package pgoutbox of the postgres module, RELIABILITY.md): a
// message published in a transaction reaches the broker at least once, and
// the broker's idem consumer handles it exactly once in effect. Each
// scenario has a negative control that shows what deduplication prevents.
//
//   - TestOutboxRelayKilled, on each of the five brokers: the relay is
//     killed right after the broker confirmed a message and before it
//     marked the row sent (one key in 25); the next relay sends the rows
//     again. Every row reaches the broker; the idem consumer handles each
//     key once; the control (every message the broker stored, as a
//     consumer without deduplication handles them) handles the repeats.
//   - TestOutboxBrokerRedelivery, on RabbitMQ and Redis Streams: HTTP
//     requests → service A (commit gate: an order and its outbox row) →
//     relay → broker → service B (idem consumer, commit gate: its effect),
//     B killed right after its effect committed and before its ack (one
//     key in 10), so the broker delivers the message again. Effects per
//     request: 1; control (B without deduplication): one more per kill.
//   - TestOutboxChain: the same chain with connection resets and cuts on
//     every hop (client–A, A–Postgres, A–Redis, relay–Postgres,
//     relay–broker, broker–B, B–Postgres, B–Redis) through TCP fault
//     proxies (toxiproxy), A, the relay and B killed at random, and the
//     kill points of both scenarios above. Every request is retried with
//     its key until it is answered. Effects per request: 1; control:
//     duplicates.
//
// The tests need PostgreSQL (IDEM_POSTGRES_URL, a schema per service and
// test), RabbitMQ on 127.0.0.1:5672 (guest/guest) and NATS with JetStream
// on 127.0.0.1:4222; they start their own redis-servers, Kafka (kfake) and
// SQS (the in-test server). Services and relays are child processes of the
// test binary (chaostest.StartChild), killed by their PID.
package outbox
