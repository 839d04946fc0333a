// Package consume holds the reliability scenarios of idem consume, the
// sidecar that reads a broker and POSTs each message to an HTTP handler
// in any language (docs/consume.md). The handler is a process of its own
// (the test binary run as the role "handler") whose effect is a row in
// PostgreSQL, written in one transaction with the key's completion row
// (--gate), with the fence check (the key's last Idempotency-Fence, raised
// only by a larger one; its own fence again is a call applied already),
// or with neither (the negative control, which
// must show duplicates). Held calls are synchronized on the handler's
// "held" line, never on a sleep; outcomes are counted from the database
// and the broker once it settled.
//
// TestConsumeSidecarKilled: the sidecar SIGKILLed while the handler holds
// its call, a new sidecar takes over, the stale call goes on.
//
// TestConsumeHandlerKilled: the handler SIGKILLed before its effect or
// after its commit, and started again; or answering after the sidecar's
// --handler-timeout once its effect committed (late).
//
// TestConsumeSlowHandlerTakeover: the handler slower than the lease while
// the sidecar's link to the store is cut; a second sidecar takes the key
// over, then the slow call writes as a stale owner.
//
// TestConsumeRedeliveryStorm: copies of every message and broker
// redeliveries, read by three sidecars.
//
// TestConsumeRedisFlushed: FLUSHALL on the store's redis-server in the
// middle of a run from RabbitMQ, with --gate, then every message again.
//
// Run them with:
//
//	make chaos RUN=TestConsume
//	make chaos-long RUN=TestConsume
package consume
