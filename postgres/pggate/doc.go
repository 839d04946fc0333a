// Package pggate makes an operation's effect on the caller's own Postgres
// database commit exactly once per idempotency key: the commit gate of
// docs/design.md#the-commit-gate.
//
// idem's Executor guarantees one execution per key while its store holds
// the record. When the store loses the record (a Redis failover without
// WAIT, a crash between the effect and the completion, a full store) or an
// owner resumes after its lease was taken over, an effect could run twice.
// The gate closes that gap for effects that are writes to Postgres: inside
// the operation's transaction, after its effect and before its commit, the
// gate inserts a completion row whose primary key is the record's digest.
// The database is then the final arbiter: exactly one transaction per
// digest commits; any other conflicts, is rolled back with its effect, and
// replays the committed result.
//
//	gate, err := pggate.New(exec, pool) // exec: an idem.Executor on redisstore or pgstore
//	...
//	res, err := gate.Do(ctx, idem.Key{Scope: "payments", ID: id}, fingerprint,
//		func(ctx context.Context, tx pgx.Tx) ([]byte, error) {
//			_, err := tx.Exec(ctx, `INSERT INTO payments (id, amount) VALUES ($1, $2)`, id, amount)
//			return []byte(`{"status":"paid"}`), err
//		})
//
// # Modes
//
// Hybrid (an Executor on redisstore): Redis keeps the lock, the fence, the
// wake-ups and the fast replay; Postgres keeps the truth. After the commit
// the gate writes the completion into Redis (storekit.Relayer). A relay
// copies every completion row into Redis once more, in the order the rows
// were written, from a cursor (so the row itself is written once), which
// repairs Redis when that write failed or the process died first: every
// Gate runs one in the background (WithRelayInterval), and `idem relay`
// runs it for operators. A janitor deletes rows after the
// Executor's retention (WithSweepInterval).
//
// pgstore (an Executor on pgstore, the whole store in Postgres): the record
// is completed inside the same transaction, so a stale owner is refused
// before anything commits, and there is nothing to relay.
//
// # Broker consumers and HTTP handlers
//
// A consumer handler (consumer.Processor and every adapter built on it)
// calls Gate.Handle with the context it was given: the message's effect
// and its completion row commit in one transaction, and the Processor
// completes the record and acknowledges as without the gate. A redelivery
// whose completion never reached the store conflicts, rolls back and is
// acknowledged.
//
//	c, err := redisstream.New(rdb, "payments", "billing", "worker-1", exec,
//		func(ctx context.Context, msg redis.XMessage) error {
//			return gate.Handle(ctx, func(ctx context.Context, tx pgx.Tx) error {
//				_, err := tx.Exec(ctx, `INSERT INTO payments ...`, ...)
//				return err
//			})
//		})
//
// An idemhttp handler wrapped with Gate.HTTP gets the transaction; its
// response is only known at the end, so the gate registers itself with the
// middleware (idemhttp.SetRecorder), which hands it the captured response
// when it is to be stored: the gate inserts the completion row holding the
// response and commits, and only then does the client get the response. A
// retry whose record Redis lost conflicts, rolls back and gets the
// committed response replayed. A response the middleware does not store
// (a released key, a panic) rolls the transaction back.
//
// # Multi-step requests
//
// A request that writes locally, calls another system and writes again
// (create the order, charge the card, record the charge) is a Flow of
// named steps that Gate.Run runs in order. Each Local step commits in a
// transaction of its own that also records the recovery point (the step's
// name and the State the steps share) in the key's completion row, so a
// retry resumes after the last recorded step and never repeats a
// committed one; the last step completes the row, and a finished request
// replays. A Foreign step is given a key derived from the request's digest
// and its name (DerivedKey), stable across retries, to send as the other
// system's Idempotency-Key: if the process stops before the next local
// step recorded its result, the step runs again and the other system
// replays its answer.
//
//	flow := &pggate.Flow[pgx.Tx]{Name: "checkout", Steps: []pggate.Step[pgx.Tx]{
//		pggate.Local("order", createOrder),
//		pggate.Foreign[pgx.Tx]("charge", chargeCard), // sends key as Idempotency-Key
//		pggate.Local("record", recordCharge),
//	}}
//	gate.Register(flow) // for the completer
//	res, err := gate.Run(ctx, key, fingerprint, flow, input)
//
// A request abandoned mid-way (its owner died; its claim, a lease from
// the last recorded step, ran out) is finished by the completer
// (Gate.Complete, run by every Gate every WithCompleteInterval) with the
// flow registered under its name, or marked failed with the reason once it
// is older than WithGiveUpAfter; a retry then gets an *idem.FailedError.
//
// # Guarantees
//
// Exactly one transaction commits an effect per key within the retention
// window, whatever the store says, provided the effect is made through the
// transaction the gate hands over. Effects outside the transaction (an
// HTTP call, a message) are not covered: use fences for those, and for a
// message, write it in the transaction with package pgoutbox (the
// transactional outbox), which sends it once the transaction committed.
//
// # Schema
//
// Gate.Migrate creates the table idem_completions in the first schema of
// the connection's search_path; schema.sql (Schema) holds the same SQL for
// migration tools. The gate needs SELECT, INSERT, UPDATE and DELETE on it.
// A missing table is reported as ErrNoTable.
package pggate
