// Package pgstore is an idem.Store on PostgreSQL, for teams without Redis.
//
// Records live in one table (idem_records, created by Store.Migrate or by
// schema.sql), one row per record digest. Every transition of the state
// machine is one PL/pgSQL function called in one round trip: it locks the
// record's row, checks, then writes, with the server's clock
// (clock_timestamp) for leases and retention, so the store behaves as
// redisstore does and passes the same conformance suite (storetest).
// Replays and mismatches are answered by a plain read, without a lock.
// Expired records read as absent and are deleted by a background janitor
// (WithSweepInterval). Executor.Await is woken by LISTEN/NOTIFY
// (WithNotify).
//
//	store, err := pgstore.New(pool)
//	if err != nil { ... }
//	if err := store.Migrate(ctx); err != nil { ... }
//	exec, err := idem.New(store)
//
// With the commit gate (pggate) the record is completed inside the caller's
// own transaction, together with the effect and the completion row: the
// fence is checked there, so an owner whose lease was taken over is refused
// before anything commits, and nothing needs relaying.
//
// The store needs a pgx pool (github.com/jackc/pgx/v5/pgxpool); the gate
// on top of it may still hand *sql.Tx transactions to the operations
// (pggate.NewSQL) when both reach the same database.
package pgstore
