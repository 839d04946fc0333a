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
// Run it with `make chaos RUN=TestOwnerCrashBroker` (short variant, as CI) or
// `make chaos-long RUN=TestOwnerCrashBroker` (the soak variant).
package brokercrash
