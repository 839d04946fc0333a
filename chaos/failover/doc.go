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
//   - TestSentinelPartition: Jepsen's case. The replicas and the Sentinels
//     reach the primary through an in-test TCP proxy, the clients reach it
//     directly; the test closes the proxy while the load goes on, until the
//     Sentinels promote a replica, then heals the partition (the old
//     primary rejoins as a replica). With no durability option and with
//     WithWait(1, …). It is the deterministic negative control: without
//     WAIT every completion the cut-off primary acknowledged is lost, and
//     the test fails unless the counters see those losses; with
//     WithWait(1, …) those calls must end in ErrNotDurable and none be
//     lost.
//   - TestSentinelPartitionProxy: the same partition with HTTP load through
//     `idem proxy --redis <primary>`, without and with --wait-replicas 1; a
//     2xx whose key runs the upstream again on a retry through a proxy on
//     the promoted primary is a lost completion.
//   - TestClusterFailover: a 3-master Redis Cluster with one replica each;
//     Executor.Do load through a go-redis ClusterClient and rueidis; SIGKILL
//     of a master, until every live node reports cluster_state:ok with its
//     replica promoted and each client had an answer on a key of the dead
//     master's slots. With no durability option and WithWait(1, …); make
//     chaos-long adds "rejoin", which restarts the killed node after the
//     promotion (it rejoins as a replica, so WAIT can count again). Every
//     call and verification read is bounded by a timeout: a client that
//     does not follow the new topology fails the test with its errors.
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
