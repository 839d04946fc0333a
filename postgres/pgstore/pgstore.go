package pgstore

import (
	"context"
	_ "embed"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/idemgo/idem"
	"github.com/idemgo/idem/postgres/internal/pgq"
	"github.com/idemgo/idem/postgres/pggate"
	"github.com/idemgo/idem/storekit"
	"github.com/idemgo/idem/storekit/statemachine"
	"github.com/jackc/pgx/v5/pgxpool"
)

// Schema is the SQL that creates the records table and the transition
// functions (schema.sql in this package), for teams that apply migrations
// with their own tool. Store.Migrate runs it.
//
//go:embed schema.sql
var Schema string

// Table is the name of the records table.
const Table = "idem_records"

// channel is the LISTEN/NOTIFY channel of the notifications.
const channel = "idem_records"

// DefaultSweepInterval is the default of WithSweepInterval.
const DefaultSweepInterval = time.Minute

// ErrNoSchema is returned when the records table or its functions do not
// exist: run Store.Migrate, or apply pgstore's schema.sql (Schema).
var ErrNoSchema = errors.New("pgstore: the table " + Table + " or its functions do not exist: run Store.Migrate or apply pgstore's schema.sql")

// Option configures a Store.
type Option func(*config)

type config struct {
	notify        bool
	sweepInterval time.Duration
	log           *slog.Logger
}

// WithNotify sets whether complete, fail and release send a notification
// (pg_notify on the channel idem_records) so that Executor.Await is woken
// across processes. The default is true; turn it off to save the
// notification (Postgres serializes the commits that notify).
func WithNotify(on bool) Option { return func(c *config) { c.notify = on } }

// WithSweepInterval sets how often a background goroutine deletes expired
// records (see Sweep). Zero disables it. The default is
// DefaultSweepInterval (1m).
func WithSweepInterval(d time.Duration) Option { return func(c *config) { c.sweepInterval = d } }

// WithLogger sets where the background janitor reports its errors. The
// default is slog.Default().
func WithLogger(l *slog.Logger) Option { return func(c *config) { c.log = l } }

// Store is a storekit.Store on PostgreSQL: one row per record in idem_records,
// every transition one function call (one round trip, atomic under the
// row's lock), times from the server's clock. It is also a storekit.Watcher
// (LISTEN/NOTIFY), a storekit.Relayer and a pggate.TxCompleter, so the commit
// gate completes its records inside the caller's transaction. It is safe
// for concurrent use, also by several processes. Close stops its
// goroutines; it does not close the pool.
type Store struct {
	pool *pgxpool.Pool
	cfg  config

	stop    chan struct{}
	stopped chan struct{}
	once    sync.Once

	lmu      sync.Mutex
	listener *listener // nil until the first Watch, and after it broke
}

var (
	_ storekit.Store     = (*Store)(nil)
	_ storekit.Watcher   = (*Store)(nil)
	_ storekit.Relayer   = (*Store)(nil)
	_ pggate.TxCompleter = (*Store)(nil)
)

// New returns a Store on pool. It does no I/O; it starts the janitor.
func New(pool *pgxpool.Pool, opts ...Option) (*Store, error) {
	if pool == nil {
		return nil, fmt.Errorf("%w: nil pool", idem.ErrInvalid)
	}
	c := config{notify: true, sweepInterval: DefaultSweepInterval, log: slog.Default()}
	for _, o := range opts {
		o(&c)
	}
	if c.sweepInterval < 0 {
		return nil, fmt.Errorf("%w: negative sweep interval %v", idem.ErrInvalid, c.sweepInterval)
	}
	if c.log == nil {
		return nil, fmt.Errorf("%w: nil logger", idem.ErrInvalid)
	}
	s := &Store{pool: pool, cfg: c, stop: make(chan struct{}), stopped: make(chan struct{})}
	go s.janitor()
	return s, nil
}

// Close stops the janitor and the notification listener.
func (s *Store) Close() error {
	s.once.Do(func() { close(s.stop) })
	<-s.stopped
	s.lmu.Lock()
	l := s.listener
	s.listener = nil
	s.lmu.Unlock()
	if l != nil {
		l.close()
	}
	return nil
}

// Migrate creates the records table, its index and the transition
// functions (Schema); it replaces the functions of an older version. It is
// safe to run at every start, from several processes at once.
func (s *Store) Migrate(ctx context.Context) error {
	if err := pgq.Migrate(ctx, pgq.Pgx{Pool: s.pool}, "idem_records", Schema); err != nil {
		return fmt.Errorf("pgstore: migrate: %w", err)
	}
	return nil
}

func us(d time.Duration) int64 { return d.Microseconds() }

var grace = us(storekit.InProgressGrace)

// wrap names the call in err, and turns a missing schema into ErrNoSchema.
func wrap(call string, err error) error {
	switch pgq.Code(err) {
	case pgq.UndefinedTable, pgq.UndefinedFunction:
		return fmt.Errorf("%w: %w", ErrNoSchema, err)
	}
	return fmt.Errorf("pgstore: %s: %w", call, err)
}

// Acquire implements storekit.Store.
func (s *Store) Acquire(ctx context.Context, key string, req storekit.AcquireRequest) (storekit.Acquisition, error) {
	if err := storekit.ValidateStoreKey(key); err != nil {
		return storekit.Acquisition{}, err
	}
	if err := req.Validate(); err != nil {
		return storekit.Acquisition{}, err
	}
	var (
		code        int
		attempts    *int
		fence, left *int64
		previous    []byte
		state       *string
		result      []byte
	)
	err := s.pool.QueryRow(ctx, `SELECT * FROM idem_acquire($1, $2, $3, $4, $5, $6, $7)`,
		key, []byte(req.Fingerprint), []byte(req.Owner), us(req.Lease), us(req.Retention), req.MaxAttempts, grace,
	).Scan(&code, &fence, &attempts, &previous, &left, &state, &result)
	if err != nil {
		return storekit.Acquisition{}, wrap("acquire", err)
	}
	a := storekit.Acquisition{Attempts: deref(attempts)}
	switch code {
	case 1, 2:
		a.Outcome, a.Lease = storekit.Acquired, storekit.Lease{Owner: req.Owner, Fence: deref(fence)}
		if code == 2 {
			a.Outcome, a.PreviousOwner = storekit.TakenOver, string(previous)
		}
	case 3:
		a.Outcome, a.RetryAfter = storekit.InProgress, time.Duration(deref(left))*time.Microsecond
	case 4:
		st, ok := statemachine.ParseState(deref(state))
		if !ok || (st != storekit.StateCompleted && st != storekit.StateFailed) {
			return storekit.Acquisition{}, fmt.Errorf("pgstore: acquire: unexpected state %q", deref(state))
		}
		a.Outcome, a.State = storekit.Replay, st
		if len(result) > 0 {
			a.Result = result
		}
	case 5:
		a = storekit.Acquisition{Outcome: storekit.Mismatch}
	default:
		return storekit.Acquisition{}, fmt.Errorf("pgstore: acquire: unexpected code %d", code)
	}
	return a, nil
}

func deref[T any](p *T) T {
	var zero T
	if p == nil {
		return zero
	}
	return *p
}

var errLost = fmt.Errorf("%w: the record is no longer held by this owner and fence", idem.ErrLeaseLost)

// okOrLost turns the 1/0 reply of a transition into nil or errLost.
func okOrLost(call string, n int, err error) error {
	switch {
	case err != nil:
		return wrap(call, err)
	case n == 1:
		return nil
	case n == 0:
		return errLost
	}
	return fmt.Errorf("pgstore: %s: unexpected reply %d", call, n)
}

// Complete implements storekit.Store.
func (s *Store) Complete(ctx context.Context, key string, lease storekit.Lease, result []byte, retention time.Duration) error {
	return s.complete(ctx, pgq.Pgx{Pool: s.pool}, key, lease, result, retention)
}

// CompleteTx implements pggate.TxCompleter: Complete inside the caller's
// transaction tx. The record's row stays locked until tx ends, so a
// takeover waits for tx and then finds the record COMPLETED, or the
// transaction finds the lease lost (idem.ErrLeaseLost) and must roll back.
// The notification is sent when tx commits.
func (s *Store) CompleteTx(ctx context.Context, tx pgq.Querier, key string, lease storekit.Lease, result []byte, retention time.Duration) error {
	return s.complete(ctx, tx, key, lease, result, retention)
}

func (s *Store) complete(ctx context.Context, q pgq.Querier, key string, lease storekit.Lease, result []byte, retention time.Duration) error {
	if err := statemachine.CheckLease(key, lease); err != nil {
		return err
	}
	if err := storekit.ValidateDuration("retention", retention); err != nil {
		return err
	}
	var n int
	err := q.QueryRow(ctx, `SELECT idem_complete($1, $2, $3, $4, $5, $6)`,
		key, []byte(lease.Owner), lease.Fence, nonNil(result), us(retention), s.cfg.notify).Scan(&n)
	return okOrLost("complete", n, err)
}

// nonNil keeps an empty result from being sent as NULL, which no
// comparison matches.
func nonNil(b []byte) []byte {
	if b == nil {
		return []byte{}
	}
	return b
}

// Fail implements storekit.Store.
func (s *Store) Fail(ctx context.Context, key string, lease storekit.Lease, f storekit.Failure) (storekit.State, error) {
	if err := statemachine.CheckLease(key, lease); err != nil {
		return 0, err
	}
	if err := f.Validate(); err != nil {
		return 0, err
	}
	var st string
	err := s.pool.QueryRow(ctx, `SELECT idem_fail($1, $2, $3, $4, $5, $6, $7, $8)`,
		key, []byte(lease.Owner), lease.Fence, nonNil(f.Result), f.Terminal, us(f.Retention), f.MaxAttempts, s.cfg.notify).Scan(&st)
	if err != nil {
		return 0, wrap("fail", err)
	}
	if st == "" {
		return 0, errLost
	}
	state, ok := statemachine.ParseState(st)
	if !ok || (state != storekit.StateReleased && state != storekit.StateFailed) {
		return 0, fmt.Errorf("pgstore: fail: unexpected state %q", st)
	}
	return state, nil
}

// Extend implements storekit.Store.
func (s *Store) Extend(ctx context.Context, key string, lease storekit.Lease, d time.Duration) error {
	if err := statemachine.CheckLease(key, lease); err != nil {
		return err
	}
	if err := storekit.ValidateDuration("lease", d); err != nil {
		return err
	}
	var n int
	err := s.pool.QueryRow(ctx, `SELECT idem_extend($1, $2, $3, $4, $5)`, key, []byte(lease.Owner), lease.Fence, us(d), grace).Scan(&n)
	return okOrLost("extend", n, err)
}

// Release implements storekit.Store.
func (s *Store) Release(ctx context.Context, key string, lease storekit.Lease, retention time.Duration) error {
	if err := statemachine.CheckLease(key, lease); err != nil {
		return err
	}
	if err := storekit.ValidateDuration("retention", retention); err != nil {
		return err
	}
	var n int
	err := s.pool.QueryRow(ctx, `SELECT idem_release($1, $2, $3, $4, $5)`, key, []byte(lease.Owner), lease.Fence, us(retention), s.cfg.notify).Scan(&n)
	return okOrLost("release", n, err)
}

// RelayCompletion implements storekit.Relayer.
func (s *Store) RelayCompletion(ctx context.Context, key string, c storekit.Completion) error {
	if err := storekit.ValidateStoreKey(key); err != nil {
		return err
	}
	if err := c.Validate(); err != nil {
		return err
	}
	var n int
	err := s.pool.QueryRow(ctx, `SELECT idem_relay($1, $2, $3, $4, $5, $6)`,
		key, []byte(c.Fingerprint), c.Fence, c.Result, us(c.Retention), s.cfg.notify).Scan(&n)
	if err != nil {
		return wrap("relay", err)
	}
	if n != 1 && n != 2 {
		return fmt.Errorf("pgstore: relay: unexpected reply %d", n)
	}
	return nil
}

// Get implements storekit.Store.
func (s *Store) Get(ctx context.Context, key string) (storekit.Record, error) {
	if err := storekit.ValidateStoreKey(key); err != nil {
		return storekit.Record{}, err
	}
	var (
		now                                 int64
		st                                  *string
		fp, owner                           []byte
		fence, leaseUntil, created, expires *int64
		attempts                            *int
		result                              []byte
	)
	err := s.pool.QueryRow(ctx, `SELECT n.now, r.state::text, r.fingerprint, r.owner, r.fence, r.lease_until, r.attempts, r.created, r.expires_at, r.result
FROM (SELECT idem_now() AS now) n LEFT JOIN idem_records r ON r.key = $1 AND r.expires_at > n.now`, key).Scan(
		&now, &st, &fp, &owner, &fence, &leaseUntil, &attempts, &created, &expires, &result)
	if err != nil {
		return storekit.Record{}, wrap("get", err)
	}
	if st == nil {
		return storekit.Record{}, storekit.ErrNotFound
	}
	state, ok := statemachine.ParseState(*st)
	if !ok {
		return storekit.Record{}, fmt.Errorf("pgstore: get: unexpected state %q", *st)
	}
	rec := storekit.Record{
		State:       state,
		Fingerprint: string(fp),
		Owner:       string(owner),
		Fence:       deref(fence),
		Attempts:    deref(attempts),
		Created:     time.UnixMicro(deref(created)),
		ExpiresAt:   time.UnixMicro(deref(expires)),
		Now:         time.UnixMicro(now),
	}
	if len(result) > 0 {
		rec.Result = result
	}
	if state == storekit.StateInProgress {
		rec.LeaseUntil = time.UnixMicro(deref(leaseUntil))
	}
	return rec, nil
}

// Delete implements storekit.Store. It sends a notification, so that waiters
// look again.
func (s *Store) Delete(ctx context.Context, key string) error {
	if err := storekit.ValidateStoreKey(key); err != nil {
		return err
	}
	sql := `DELETE FROM idem_records WHERE key = $1`
	if s.cfg.notify {
		sql = `WITH d AS (DELETE FROM idem_records WHERE key = $1) SELECT pg_notify('idem_records', $1)`
	}
	if _, err := s.pool.Exec(ctx, sql, key); err != nil {
		return wrap("delete", err)
	}
	return nil
}

// Sweep deletes up to batch records whose expiry passed, repeatedly, and
// returns how many it deleted. The background janitor calls it; `idem`
// operators may too. It is safe for concurrent use, also from several
// processes (SKIP LOCKED).
func (s *Store) Sweep(ctx context.Context) (int, error) {
	const batch = 1000
	total := 0
	for {
		tag, err := s.pool.Exec(ctx, `DELETE FROM idem_records WHERE key IN (
  SELECT key FROM idem_records WHERE expires_at <= idem_now() ORDER BY expires_at LIMIT $1 FOR UPDATE SKIP LOCKED)`, batch)
		if err != nil {
			return total, wrap("sweep", err)
		}
		total += int(tag.RowsAffected())
		if tag.RowsAffected() < batch {
			return total, nil
		}
	}
}

func (s *Store) janitor() {
	defer close(s.stopped)
	if s.cfg.sweepInterval == 0 {
		<-s.stop
		return
	}
	t := time.NewTicker(s.cfg.sweepInterval)
	defer t.Stop()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go func() {
		<-s.stop
		cancel()
	}()
	for {
		select {
		case <-s.stop:
			return
		case <-t.C:
			if _, err := s.Sweep(ctx); err != nil && ctx.Err() == nil {
				s.cfg.log.Warn("pgstore: janitor", "error", err)
			}
		}
	}
}

// Entry is one record listed by List.
type Entry struct {
	Key    string
	Record storekit.Record
}

// List returns up to limit live records (all when limit <= 0), for tools
// that inspect the store (idem ls). It is a plain read, in no order.
func (s *Store) List(ctx context.Context, limit int) ([]Entry, error) {
	sql := `SELECT key, state::text, fingerprint, owner, fence, lease_until, attempts, created, expires_at, result, idem_now()
FROM idem_records WHERE expires_at > idem_now()`
	args := []any{}
	if limit > 0 {
		sql += ` LIMIT $1`
		args = append(args, limit)
	}
	var out []Entry
	err := pgq.Pgx{Pool: s.pool}.Query(ctx, sql, args, func(r pgq.Row) error {
		var e Entry
		var st string
		var fp, owner []byte
		var fence, lease, created, expires, now int64
		var attempts int
		var result []byte
		if err := r.Scan(&e.Key, &st, &fp, &owner, &fence, &lease, &attempts, &created, &expires, &result, &now); err != nil {
			return err
		}
		state, ok := statemachine.ParseState(st)
		if !ok {
			return fmt.Errorf("pgstore: list: unexpected state %q", st)
		}
		e.Record.State, e.Record.Fence, e.Record.Attempts = state, fence, attempts
		e.Record.Fingerprint, e.Record.Owner = string(fp), string(owner)
		e.Record.Created, e.Record.ExpiresAt, e.Record.Now = time.UnixMicro(created), time.UnixMicro(expires), time.UnixMicro(now)
		if state == storekit.StateInProgress {
			e.Record.LeaseUntil = time.UnixMicro(lease)
		}
		if len(result) > 0 {
			e.Record.Result = result
		}
		out = append(out, e)
		return nil
	})
	if err != nil {
		return out, wrap("list", err)
	}
	return out, nil
}
