// Package failover is a scenario of the reliability suite (RELIABILITY.md):
// Redis failover under load, measured.
//
//   - TestSentinelFailover: a primary, two replicas and three Sentinels
//     (redis-server --sentinel, all on loopback); Executor.Do load through
//     go-redis's failover client; then a fault, and the load goes on until
//     the client follows the Sentinels to the promoted replica. Faults:
//     "kill" (SIGKILL of the primary; make chaos and make chaos-long) and
//     "pause" (SIGSTOP of the primary until the Sentinels promote a
//     replica, then SIGCONT: it rejoins as a replica; make chaos-long).
//     Each with no durability option, WithWait(1, …) and WithWait(2, …).
//
// Counted: acknowledged completions lost (a Do that returned nil whose
// record is not COMPLETED after the failover), duplicate executions (an
// acknowledged key whose retry runs the operation again), errors surfaced
// to callers (each one a Do that the caller may retry), and the time from
// the fault to the first successful Do that started after it. The WAIT rows
// must lose no acknowledged completion after a kill (the Sentinels promote
// the replica with the most data, which has every write WAIT counted); the
// row without a durability option is their comparison, not a
// deterministic control: asynchronous replication on loopback loses a
// completion in some runs only.
//
// The tests live in _test.go files; this package has no API.
package failover
