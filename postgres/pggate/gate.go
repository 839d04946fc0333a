package pggate

import (
	"context"
	"database/sql"
	_ "embed"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/idemgo/idem"
	"github.com/idemgo/idem/adapterkit"
	"github.com/idemgo/idem/observe"
	"github.com/idemgo/idem/postgres/internal/pgq"
	"github.com/idemgo/idem/storekit"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// Schema is the SQL that creates the completion table and its indexes
// (schema.sql in this package), for teams that apply migrations with their
// own tool. Gate.Migrate runs it.
//
//go:embed schema.sql
var Schema string

// Table is the name of the completion table.
const Table = "idem_completions"

// Defaults of the options.
const (
	DefaultRelayInterval = time.Second
	DefaultRelayDelay    = 5 * time.Second
	DefaultSweepInterval = time.Minute
	DefaultBatchSize     = 500

	DefaultCompleteInterval = 5 * time.Second
	DefaultGiveUpAfter      = time.Hour
)

// Errors of the gate. Test for them with errors.Is.
var (
	// ErrNoTable is returned when the completion table does not exist:
	// run Gate.Migrate, or apply schema.sql (Schema) with your migration
	// tool.
	ErrNoTable = errors.New("pggate: the completion table " + Table + " does not exist: run Gate.Migrate or apply pggate's schema.sql")

	// ErrTxDone is returned when the function committed or rolled back the
	// transaction itself: the gate commits it. The key becomes FAILED (the
	// effect may have committed without its completion, so running the
	// function again could repeat it).
	ErrTxDone = errors.New("pggate: the function committed or rolled back the transaction; return instead and let the gate commit it")

	// ErrNoRelayer is returned by New when the Executor's store (or a store
	// it wraps) does not implement storekit.Relayer.
	ErrNoRelayer = errors.New("pggate: the store does not implement storekit.Relayer")
)

// TxCompleter is implemented by stores whose records live in the same
// Postgres database as the effects (pgstore): the gate completes the record
// inside the caller's transaction, which also refuses a stale owner (a
// lease that was taken over) before anything commits. It returns an error
// wrapping idem.ErrLeaseLost when lease no longer holds the record. Stores
// outside this module cannot implement it.
type TxCompleter interface {
	CompleteTx(ctx context.Context, tx pgq.Querier, key string, lease idem.Lease, result []byte, retention time.Duration) error
}

// Option configures a Gate.
type Option func(*config)

type config struct {
	relayInterval time.Duration
	relayDelay    time.Duration
	sweepInterval time.Duration
	batch         int
	log           *slog.Logger
	complete      time.Duration
	giveUp        time.Duration
}

// WithRelayInterval sets how often the gate's background goroutine relays
// committed completions that the store did not get (see Gate.Relay). Zero
// disables the background relay and janitor (run `idem relay`, or call
// Relay and Sweep yourself). The default is DefaultRelayInterval (1s).
func WithRelayInterval(d time.Duration) Option { return func(c *config) { c.relayInterval = d } }

// WithRelayDelay sets the age after which a completion is relayed:
// younger rows are left to the attempt that committed them, which
// completes the store itself right after its commit (and to transactions
// still committing, see Gate.Relay). The default is
// DefaultRelayDelay (5s).
func WithRelayDelay(d time.Duration) Option { return func(c *config) { c.relayDelay = d } }

// WithSweepInterval sets how often the background janitor deletes
// completion rows past their retention (see Gate.Sweep). Zero disables it.
// The default is DefaultSweepInterval (1m).
func WithSweepInterval(d time.Duration) Option { return func(c *config) { c.sweepInterval = d } }

// WithBatchSize sets how many rows one statement of the relay or the
// janitor handles. The default is DefaultBatchSize (500).
func WithBatchSize(n int) Option { return func(c *config) { c.batch = n } }

// WithCompleteInterval sets how often the gate's background goroutine runs
// the completer (see Gate.Complete). Zero disables it. The default is
// DefaultCompleteInterval (5s).
func WithCompleteInterval(d time.Duration) Option { return func(c *config) { c.complete = d } }

// WithGiveUpAfter sets how long after its first recorded step an
// unfinished multi-step request is given up by the completer: it is marked
// failed, with the reason, and retries get an *idem.FailedError. The
// default is DefaultGiveUpAfter (1h).
func WithGiveUpAfter(d time.Duration) Option { return func(c *config) { c.giveUp = d } }

// WithLogger sets where the background relay and janitor report their
// errors. The default is slog.Default().
func WithLogger(l *slog.Logger) Option { return func(c *config) { c.log = l } }

// Gate runs operations whose effect is a write to Postgres so that the
// effect commits at most once per key, whatever the store says: the
// completion row is inserted in the operation's own transaction. T is the
// transaction type handed to the operation: pgx.Tx (New) or *sql.Tx
// (NewSQL). A Gate is safe for concurrent use; Close stops its background
// goroutine.
type Gate[T any] struct {
	e       *idem.Executor
	db      pgq.DB[T]
	relayer storekit.Relayer
	txc     TxCompleter // nil unless the store lives in this database
	cfg     config
	copied  copied // completions this gate wrote into the store after their commit

	flowsMu sync.Mutex
	flows   map[string]*Flow[T] // Register

	stop    chan struct{}
	stopped chan struct{}
	once    sync.Once
}

// New returns a Gate on e and a pgx pool; its operations receive a pgx.Tx.
// e's store (or a store it wraps, see storekit.StoreAs) must implement
// storekit.Relayer (redisstore, memstore, boltstore and pgstore do). New does no
// I/O; it starts the background relay and janitor.
//
// The pgx.Tx handed to a function sends BEGIN with the function's first
// statement (Exec, Query, QueryRow, SendBatch: one round trip for both), or
// with the completion and COMMIT when the function runs none; its Begin
// (a savepoint), CopyFrom, Prepare, LargeObjects and Conn, called first,
// send BEGIN alone. If the server refuses that first statement before it
// runs, no transaction began: the function's later statements return the
// same error and nothing commits.
func New(e *idem.Executor, pool *pgxpool.Pool, opts ...Option) (*Gate[pgx.Tx], error) {
	if pool == nil {
		return nil, fmt.Errorf("%w: nil pool", idem.ErrInvalid)
	}
	return newGate[pgx.Tx](e, pgq.Pgx{Pool: pool}, opts)
}

// NewSQL is New for a database/sql pool opened with pgx's stdlib driver
// (github.com/jackc/pgx/v5/stdlib); its operations receive a *sql.Tx.
func NewSQL(e *idem.Executor, db *sql.DB, opts ...Option) (*Gate[*sql.Tx], error) {
	if db == nil {
		return nil, fmt.Errorf("%w: nil database", idem.ErrInvalid)
	}
	return newGate[*sql.Tx](e, pgq.SQL{DB: db}, opts)
}

func newGate[T any](e *idem.Executor, db pgq.DB[T], opts []Option) (*Gate[T], error) {
	if e == nil {
		return nil, fmt.Errorf("%w: nil executor", idem.ErrInvalid)
	}
	c := config{
		relayInterval: DefaultRelayInterval,
		relayDelay:    DefaultRelayDelay,
		sweepInterval: DefaultSweepInterval,
		batch:         DefaultBatchSize,
		log:           slog.Default(),
		complete:      DefaultCompleteInterval,
		giveUp:        DefaultGiveUpAfter,
	}
	for _, o := range opts {
		o(&c)
	}
	switch {
	case c.relayInterval < 0 || c.relayDelay < 0 || c.sweepInterval < 0 || c.complete < 0:
		return nil, fmt.Errorf("%w: negative relay interval, relay delay, sweep or complete interval", idem.ErrInvalid)
	case c.giveUp <= 0:
		return nil, fmt.Errorf("%w: give-up bound %v is not positive", idem.ErrInvalid, c.giveUp)
	case c.batch <= 0:
		return nil, fmt.Errorf("%w: batch size %d is not positive", idem.ErrInvalid, c.batch)
	case c.log == nil:
		return nil, fmt.Errorf("%w: nil logger", idem.ErrInvalid)
	}
	r, ok := storekit.StoreAs[storekit.Relayer](adapterkit.Store(e))
	if !ok {
		return nil, fmt.Errorf("%w (%T)", ErrNoRelayer, adapterkit.Store(e))
	}
	txc, _ := storekit.StoreAs[TxCompleter](adapterkit.Store(e))
	g := &Gate[T]{
		e: e, db: db, relayer: r, txc: txc, cfg: c,
		stop:    make(chan struct{}),
		stopped: make(chan struct{}),
	}
	go g.background()
	return g, nil
}

// Close stops the background relay, completer and janitor. It does not
// close the pool or the Executor's store.
func (g *Gate[T]) Close() error {
	g.once.Do(func() { close(g.stop) })
	<-g.stopped
	return nil
}

// Executor returns the gate's Executor.
func (g *Gate[T]) Executor() *idem.Executor { return g.e }

// Migrate creates the completion table and its indexes if they do not exist
// (Schema). It is safe to run at every start, from several processes at
// once (a transaction-scoped advisory lock orders them).
func (g *Gate[T]) Migrate(ctx context.Context) error {
	if err := pgq.Migrate(ctx, g.db, "idem_completions", Schema); err != nil {
		return fmt.Errorf("pggate: migrate: %w", err)
	}
	return nil
}

// Do runs fn at most once per key, with a transaction in which fn makes its
// effect; the effect commits at most once per key, even when the store lost
// the record or a stale owner resumes after its lease.
//
// Do acquires key through the Executor (a replay, an *idem.InProgressError,
// idem.ErrMismatch and an *idem.FailedError are returned as Executor.Do
// returns them), begins a transaction and calls fn with it. When fn returns
// a value, Do inserts the completion row (digest, fingerprint, fence,
// result) in the same transaction and commits:
//
//   - If a completion for the key already committed (a previous owner's
//     effect that the store does not know of, or a retry that raced this
//     one), the insert conflicts, the transaction (with fn's effect) is
//     rolled back, the store is repaired with the committed completion and
//     Do returns its result with Replayed set (or idem.ErrMismatch if that
//     completion had another fingerprint).
//   - After the commit, Do writes the completion into the store
//     (storekit.Relayer). If that fails, the effect stands and Do succeeds; the
//     relay repairs the store later, and until then a duplicate gets an
//     *idem.InProgressError or, if the store lost the record, a replay
//     through the conflict above.
//   - On a pgstore store the record is completed inside the transaction
//     too, so an owner whose lease was taken over is refused (an error
//     wrapping idem.ErrLeaseLost) before anything commits.
//
// If fn returns an error, the transaction is rolled back and the error
// follows the Executor's failure policy (the key is released or FAILED). If
// fn panics, the transaction is rolled back, the key released and the panic
// continues. fn must neither commit nor roll back the transaction
// (ErrTxDone). A result over the Executor's size limit rolls the
// transaction back and makes the key FAILED. If Postgres cannot be reached
// before the commit, the transaction is rolled back and the key released;
// if the commit's own outcome is unknown (the connection broke), Do returns
// the error and releases the key: a retry with the same key either finds
// the committed completion (and replays it) or runs fn again, never both.
func (g *Gate[T]) Do(ctx context.Context, key idem.Key, fingerprint string, fn func(ctx context.Context, tx T) ([]byte, error)) (idem.Result, error) {
	if fn == nil {
		return idem.Result{}, fmt.Errorf("%w: nil function", idem.ErrInvalid)
	}
	actx, a, err := g.e.Begin(ctx, key, fingerprint)
	if err != nil {
		return idem.Result{}, err
	}
	if a.Replayed() {
		return idem.Result{Value: a.Value(), Replayed: true}, nil
	}
	sctx := context.WithoutCancel(ctx)
	tx, handle, err := g.db.Begin(actx)
	if err != nil {
		return idem.Result{}, errors.Join(fmt.Errorf("pggate: begin: %w", err), a.Release(sctx))
	}
	ended := false
	defer func() {
		if !ended { // fn panicked or called runtime.Goexit
			_ = tx.Rollback(sctx)
			_ = a.Release(sctx)
		}
	}()
	v, ferr := fn(actx, handle)
	ended = true
	res := idem.Result{Value: v, Fence: a.Lease().Fence}
	if ferr != nil {
		_ = tx.Rollback(sctx)
		if err := a.Fail(sctx, ferr); err != nil {
			return res, errors.Join(ferr, err)
		}
		return res, ferr
	}
	return g.commit(actx, sctx, a, tx, res)
}

// insertCompletion inserts the completion row, or replaces one whose
// retention ended (the janitor had not deleted it yet). It affects no row
// when a live completion for the digest already committed; when another
// transaction inserted one and has not committed yet, it waits for it.
const insertCompletion = `INSERT INTO idem_completions AS c (digest, fingerprint, fence, result, created_at, expires_at, relayed)
VALUES ($1, $2, $3, $4, clock_timestamp(), now() + $5 * interval '1 microsecond', $6)
ON CONFLICT (digest) DO UPDATE SET fingerprint = excluded.fingerprint, fence = excluded.fence,
  result = excluded.result, created_at = excluded.created_at, expires_at = excluded.expires_at, relayed = excluded.relayed,
  progress = NULL
WHERE c.expires_at <= now()`

// deleteExpired and insertNew are insertCompletion in two statements, for
// one round trip with the COMMIT (pgq.Committer): a row whose retention
// ended is deleted first, and the insert fails with a unique violation when
// a live completion committed (or waits for the transaction that inserted
// one, as insertCompletion).
const (
	deleteExpired = `DELETE FROM idem_completions WHERE digest = $1 AND expires_at <= now()`
	insertNew     = `INSERT INTO idem_completions (digest, fingerprint, fence, result, created_at, expires_at, relayed)
VALUES ($1, $2, $3, $4, clock_timestamp(), now() + $5 * interval '1 microsecond', $6)`
)

// step says which step of record failed.
type step uint8

const (
	stepEncode step = iota + 1 // the result is over the size limit
	stepLease                  // pgstore: the lease was taken over
	stepInsert                 // the completion's insert (or CompleteTx) failed
	stepCommit                 // COMMIT failed: its outcome is unknown
)

// record inserts the completion of value (for the attempt a of the
// Executor e) in tx and commits tx; it does not end a. conflict reports
// that a live completion for the key had committed already: tx was rolled
// back. On an error, tx was rolled back (or its commit failed) and st says
// where. blob is the stored form of value.
func (g *Gate[T]) record(ctx, sctx context.Context, e *idem.Executor, a *idem.Attempt, tx pgq.Tx, value []byte) (blob []byte, conflict bool, st step, err error) {
	blob, err = adapterkit.EncodeResult(e, a.Key(), value)
	if err != nil { // too large: a retry would roll back again
		_ = tx.Rollback(sctx)
		return nil, false, stepEncode, err
	}
	lease := a.Lease()
	inTx := g.txc != nil
	if inTx {
		if err := g.txc.CompleteTx(ctx, tx, a.Key(), lease, blob, adapterkit.Retention(e)); err != nil {
			_ = tx.Rollback(sctx)
			if errors.Is(err, idem.ErrLeaseLost) {
				return nil, false, stepLease, fmt.Errorf("pggate: the transaction was rolled back: %w", err)
			}
			return nil, false, stepInsert, err
		}
	}
	args := []any{a.Key(), []byte(a.Fingerprint()), lease.Fence, blob, adapterkit.Retention(e).Microseconds(), inTx}
	if c, ok := tx.(pgq.Committer); ok {
		// One round trip: the insert fails (unique violation) when a live
		// completion committed, and then the COMMIT does not run.
		err := c.CommitWith(ctx, pgq.Statement{SQL: deleteExpired, Args: args[:1]}, pgq.Statement{SQL: insertNew, Args: args})
		switch {
		case err == nil:
			return blob, false, 0, nil
		case pgq.Aborted(err) && pgq.ConflictOn(err, Table):
			_ = tx.Rollback(sctx)
			return nil, true, 0, nil
		case pgq.TxDone(err) || pgq.Aborted(err):
			// Refused before the COMMIT (a statement failed, or the
			// transaction had ended): nothing of it committed.
			_ = tx.Rollback(sctx)
			return nil, false, stepInsert, err
		}
		_ = tx.Rollback(sctx)
		return nil, false, stepCommit, fmt.Errorf("pggate: commit (the effect may have committed; retry with the same key): %w", err)
	}
	n, err := tx.Exec(ctx, insertCompletion, args...)
	if err != nil {
		_ = tx.Rollback(sctx)
		return nil, false, stepInsert, err
	}
	if n == 0 {
		_ = tx.Rollback(sctx)
		return nil, true, 0, nil
	}
	if err := tx.Commit(ctx); err != nil {
		return nil, false, stepCommit, fmt.Errorf("pggate: commit (the effect may have committed; retry with the same key): %w", err)
	}
	return blob, false, 0, nil
}

// commit inserts the completion of a's value in tx, commits it and ends a:
// Do's last step.
func (g *Gate[T]) commit(actx, sctx context.Context, a *idem.Attempt, tx pgq.Tx, res idem.Result) (idem.Result, error) {
	blob, conflict, st, err := g.record(actx, sctx, a.Executor(), a, tx, res.Value)
	switch {
	case st == stepEncode:
		a.SetLastTry() // FAILED whatever the failure policy
		return res, errors.Join(fmt.Errorf("%w; the transaction was rolled back and the key is FAILED", err), a.Fail(sctx, err))
	case st == stepLease:
		_ = a.Abandon(sctx, observe.LeaseLost) // the record has a newer owner
		return res, err
	case st == stepInsert:
		return res, g.failed(sctx, a, err)
	case st == stepCommit:
		// The commit may or may not have happened. Releasing is safe
		// either way: the next attempt's insert conflicts with a committed
		// completion and replays it.
		return res, errors.Join(err, a.Release(sctx))
	case conflict:
		return g.replay(actx, a)
	}
	_ = a.Abandon(sctx, observe.Executed) // ends the attempt; the completion is written below
	g.relayed(sctx, a, blob)
	return res, nil
}

// relayed writes the committed completion blob of a into the store, unless
// the store got it inside the transaction (pgstore).
func (g *Gate[T]) relayed(sctx context.Context, a *idem.Attempt, blob []byte) {
	if g.txc == nil {
		g.relay(sctx, a.Key(), storekit.Completion{Fingerprint: a.Fingerprint(), Fence: a.Lease().Fence, Result: blob, Retention: adapterkit.Retention(a.Executor())})
	}
}

// failed ends an attempt whose insert or in-transaction completion failed
// (the transaction was rolled back) and returns the error to report.
func (g *Gate[T]) failed(sctx context.Context, a *idem.Attempt, err error) error {
	err = insertErr(err)
	if errors.Is(err, ErrTxDone) {
		a.SetLastTry() // FAILED whatever the failure policy
		return errors.Join(err, a.Fail(sctx, err))
	}
	return errors.Join(err, a.Release(sctx))
}

// insertErr is the error to report for a failed insert of the completion
// (or in-transaction completion).
func insertErr(err error) error {
	switch {
	case pgq.TxDone(err):
		return ErrTxDone
	case pgq.Code(err) == pgq.UndefinedTable:
		return fmt.Errorf("%w: %w", ErrNoTable, err)
	}
	return fmt.Errorf("pggate: insert completion: %w", err)
}

// load reads the committed completion of key.
func (g *Gate[T]) load(ctx context.Context, key string) (storekit.Completion, error) {
	var (
		c      storekit.Completion
		fp     []byte
		leftUS int64
	)
	var unfinished bool
	err := g.db.QueryRow(ctx, `SELECT fingerprint, fence, result, (extract(epoch FROM expires_at - now()) * 1000000)::bigint, progress IS NOT NULL
FROM idem_completions WHERE digest = $1`, key).Scan(&fp, &c.Fence, &c.Result, &leftUS, &unfinished)
	if err != nil {
		return c, fmt.Errorf("pggate: the transaction was rolled back (a completion committed first) and reading it failed: %w", err)
	}
	if unfinished {
		return c, fmt.Errorf("pggate: the transaction was rolled back: %w (an unfinished multi-step request, see Gate.Run)", ErrNotFlow)
	}
	c.Fingerprint = string(fp)
	c.Retention = time.Duration(leftUS) * time.Microsecond
	return c, nil
}

// replay answers an attempt whose insert found a committed completion:
// the store gets that completion and the caller its result. It ends a.
func (g *Gate[T]) replay(ctx context.Context, a *idem.Attempt) (res idem.Result, err error) {
	defer func() { _ = a.Abandon(context.WithoutCancel(ctx), replayOutcome(err)) }()
	c, err := g.load(ctx, a.Key())
	if err != nil {
		return idem.Result{}, err
	}
	if c.Retention >= time.Millisecond {
		g.relay(context.WithoutCancel(ctx), a.Key(), c)
	}
	if c.Fingerprint != a.Fingerprint() {
		return idem.Result{}, idem.ErrMismatch
	}
	v, err := adapterkit.DecodeResult(a.Executor(), a.Key(), c.Result)
	if err != nil {
		return idem.Result{}, err
	}
	return idem.Result{Value: v, Replayed: true}, nil
}

// replayOutcome is what the Executor's Observer is told of a replay that
// returned err.
func replayOutcome(err error) observe.Outcome {
	switch {
	case err == nil:
		return observe.Replayed
	case errors.Is(err, idem.ErrMismatch):
		return observe.Mismatch
	default:
		return observe.StoreError
	}
}

// relay writes a committed completion into the store, repeating a call
// whose outcome is unknown a few times. On success the gate's relay
// (Relay) does not copy it again (copied); another process's relay does,
// which changes nothing.
func (g *Gate[T]) relay(ctx context.Context, key string, c storekit.Completion) {
	pause := 10 * time.Millisecond
	for i := 0; ; i++ {
		err := g.relayer.RelayCompletion(ctx, key, c)
		if err == nil {
			g.copied.add(key, max(g.cfg.relayDelay+2*g.cfg.relayInterval, minCopied))
		}
		if err == nil || !storekit.OutcomeUnknown(err) || i == 2 {
			return
		}
		time.Sleep(pause)
		pause *= 2
	}
}
