// Package netfault is scenario 5 of the reliability suite: network faults
// between the idem clients and Redis.
//
// A Shopify toxiproxy proxy, run as a library inside the test process (see
// chaostest.NetProxy), sits between the Redis clients (go-redis and rueidis)
// and a throwaway redis-server. The tests run Executor.Do from many
// goroutines on keys that each get several duplicates, count every run of
// the handler and every effect in a fenced sink, and inject latency,
// swallowed requests and replies (toxiproxy's timeout toxic), connection
// resets (reset_peer) and a black hole (everything swallowed, then the
// listener closed) for a while. They assert that every key is executed
// exactly once, that nothing is lost, and that an operation whose reply was
// lost is resolved by repeating the store call with the same owner, never by
// running the handler twice. TestStartAfterLease delays every reply to one
// owner past its lease and asserts that its operation never starts after
// the lease's local deadline, while another owner has taken over (its
// control runs the operation on the late reply, as Begin once did).
// TestReplayCacheDelayedReplies delays every reply by 300 ms and asserts
// that the stores' local replay caches serve no replay of a record after
// it expired on the server.
//
//	make chaos RUN=TestNetwork
//	make chaos-long RUN=TestNetwork
package netfault
