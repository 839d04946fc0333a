// Package clockskew is scenario 6 of the reliability suite: a client whose
// clock is off by an hour must see no difference, because idem computes
// leases, retention and fences from the store's clock only.
//
// A process's clock cannot be moved for one test, so the scenario shows it
// in the two ways that can be checked:
//
//   - TestClockSkew/redis_commands records, with MONITOR, every command that
//     the go-redis and rueidis clients send to a real redis-server during a
//     whole lifecycle (acquire, heartbeat extend, complete, replay, retryable
//     and terminal failure, release, takeover, stale complete, batch, await,
//     get) and checks that no argument is a timestamp of any unit except the
//     fences the server itself handed out: nothing of the client's clock
//     reaches Redis. A negative control sends a client timestamp and checks
//     that the scan flags it.
//   - TestClockSkew/store_clock_offset runs lease, takeover, heartbeat and
//     retention scenarios on memstore and boltstore whose clock (which plays
//     the Redis server's part) is one hour behind, exact, or one hour ahead
//     of the process's clock, and checks that the outcomes are identical: if
//     the Executor or the HTTP middleware compared a store time with the
//     caller's clock anywhere, a one-hour offset would change them.
//
// A redis-server run under libfaketime is not part of the suite.
package clockskew
