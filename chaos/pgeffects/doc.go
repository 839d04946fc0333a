// Package pgeffects holds the reliability scenarios of the Postgres commit
// gate (docs/design.md#the-commit-gate, RELIABILITY.md): an effect table in
// Postgres counts rows per key and does no fence check, so every duplicate
// effect shows. Each scenario runs with the gate (pggate on redisstore: 0
// duplicates) and, as a negative control, with plain redisstore and the
// effect written outside the gate, which shows the duplicates the gate
// prevents:
//
//   - SIGKILL of the owner after its transaction committed and before the
//     Redis completion (the owner stops itself in that window, then is
//     killed): the retry gets the stored result, the relay repairs Redis.
//   - FLUSHALL in the middle of a run (record loss).
//   - SIGSTOP of the owner (in its transaction, after its effect) for 2× the
//     lease while a retry takes over: the stale owner's transaction rolls
//     back.
//   - Redis refusing writes (maxmemory reached, OOM) after the commit.
//   - 4 processes × 5 concurrent duplicates per key, with FLUSHALL every
//     100ms: 1 effect row per key.
//   - Postgres connections cut and new ones reset (a restart as the clients see
//     it, through a TCP proxy in front of the shared server): no committed
//     completion lost, recovery without a manual step.
//   - Postgres restarted for real, as a crash and as a fast shutdown: a
//     server of the test's own (pgtest.StartServer, initdb and pg_ctl in a
//     temporary directory, on a free port; the shared server is never
//     restarted): no committed completion lost, recovery without a manual
//     step.
//
// Tests need Redis (started per test) and PostgreSQL (IDEM_POSTGRES_URL,
// each test in a schema of its own); TestPGRestarted needs the PostgreSQL
// binaries (IDEM_POSTGRES_BIN, or /usr/lib/postgresql/*/bin) and is skipped
// without them.
package pgeffects
