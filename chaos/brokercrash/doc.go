// Package brokercrash is scenario 2 of the reliability suite (owner crash)
// for the broker adapters: Redis Streams, Kafka, RabbitMQ, NATS JetStream
// and SQS. Its test, TestOwnerCrashBroker, runs each adapter in child OS
// processes, SIGKILLs a child while it is inside a handler, and checks that
// another child takes the key over once the broker redelivers the message
// and the lease has expired, with 0 lost keys and 0 duplicate effects in a
// fenced sink shared by the processes. It measures the takeover time: from
// the SIGKILL to the taken-over key's effect in the sink. Its negative
// control, TestCrashAfterEffect, kills the owner between its effect and
// its completion and must see the duplicate that a fence alone cannot
// prevent.
//
// It also holds scenario 16 (a handler that ignores its context at
// shutdown): TestStuckHandlerBroker sends SIGTERM to a child whose handler
// blocks without looking at its context, and checks that the child's Run
// returns all the same (about a second after the shutdown timeout), that
// the next child takes the key over with a higher fence once the lease
// ended, and that the blocked handler's late return, after Run's, does
// nothing (its write is refused by the fence; 0 lost, 0 duplicated, every
// message acknowledged). Its negative control is the code before the fix:
// Run did not return within 30 times the shutdown timeout.
//
// Run them with `make chaos RUN=TestOwnerCrashBroker` (short variant, as
// CI) or `make chaos-long RUN=TestOwnerCrashBroker` (the soak variant), and
// the same with RUN=TestStuckHandlerBroker.
package brokercrash
