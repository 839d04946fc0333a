// Package linearizability is scenario 7 of the reliability suite: it records
// histories of concurrent store operations (Acquire, Complete, Fail,
// Release, Extend, Get, Delete) from several goroutines on a few keys and
// checks them with porcupine against a sequential model of the state
// machine of docs/design.md#the-state-machine.
//
// The stores checked are memstore, redisstore on a redis-server through
// go-redis and through rueidis, and redisstore through a toxiproxy proxy
// that injects latency, swallowed replies and connection resets. A call
// that fails with an error that leaves its outcome unknown is recorded as an
// operation that never returned (it may take effect at any point after its
// call) and is repeated with the same arguments until it gets an answer, as
// the Store contract says. A deliberately non-atomic store is the negative
// control: porcupine must reject its history.
//
//	make chaos RUN=TestLinearizable
//	make chaos-long RUN=TestLinearizable
package linearizability
