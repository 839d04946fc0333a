package pgq

import (
	"context"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgtype"
	"github.com/jackc/pgx/v5/pgxpool"
)

// PgxTx adapts a pgx transaction on a connection of its own, acquired
// from the pool, which it gives back when the transaction ends (Commit,
// Rollback or CommitWith).
//
// Its BEGIN travels with the transaction's first statement, in one round
// trip (pgx's Batch.BeginTx), instead of a round trip of its own: the
// first Exec, Query, QueryRow or SendBatch, of the transaction handed to
// the caller (Handle) or of the PgxTx itself, or the last statements and
// COMMIT of CommitWith. A transaction in which nothing ran ends without a
// round trip. The calls that need the transaction before any statement
// (Begin, CopyFrom, Prepare, LargeObjects, Conn) send BEGIN first, alone.
type PgxTx struct {
	c   *pgxpool.Conn   // nil once released
	ctx context.Context // Begin's, for BEGIN sent by the calls that take no context

	tx       pgx.Tx // pgx's transaction once BEGIN was sent, else nil
	beginErr error  // BEGIN failed: the transaction never started
	ended    bool   // the caller's function committed or rolled back (Handle)
}

// Begin implements DB. It does no round trip: see PgxTx.
func (d Pgx) Begin(ctx context.Context) (Tx, pgx.Tx, error) {
	c, err := d.Pool.Acquire(ctx)
	if err != nil {
		return nil, nil, err
	}
	t := &PgxTx{c: c, ctx: ctx}
	return t, pgxHandle{t}, nil
}

// pgxHandle is the pgx.Tx of a PgxTx, handed to the caller's function. It
// behaves as pgx's own transaction (the calls after Commit or Rollback
// return pgx.ErrTxClosed); not safe for concurrent use, as pgx's.
type pgxHandle struct{ t *PgxTx }

var _ pgx.Tx = pgxHandle{}

// errBegin is the error of the calls after a failed BEGIN: the
// transaction never started, so nothing may run as if it had (a function
// that ignored the error would otherwise get its later statements, and the
// completion, committed in a transaction of their own).
func (t *PgxTx) errBegin() error {
	switch {
	case t.c == nil || t.ended:
		return pgx.ErrTxClosed
	case t.beginErr != nil:
		return t.beginErr
	}
	return nil
}

// begin sends BEGIN alone, unless it was sent, and returns pgx's
// transaction.
func (t *PgxTx) begin(ctx context.Context) (pgx.Tx, error) {
	if t.tx != nil {
		return t.tx, nil
	}
	if err := t.errBegin(); err != nil {
		return nil, err
	}
	tx, err := t.c.Conn().Begin(ctx)
	if err != nil {
		t.beginErr = err
		return nil, err
	}
	t.tx = tx
	return tx, nil
}

// sendWithBegin sends b's queries after BEGIN, in one round trip, and
// reads BEGIN's result; b must not have begun a transaction itself.
func (t *PgxTx) sendWithBegin(ctx context.Context, b *pgx.Batch) (pgx.BatchResults, error) {
	nb := &pgx.Batch{}
	nb.BeginTx(pgx.TxOptions{})
	nb.QueuedQueries = append(nb.QueuedQueries, b.QueuedQueries...)
	br := t.c.Conn().SendBatch(ctx, nb)
	t.tx = br.Tx()
	if _, err := br.Exec(); err != nil {
		br.Close()
		t.tx, t.beginErr = nil, err
		return nil, err
	}
	return br, nil
}

// Exec implements pgx.Tx.
func (h pgxHandle) Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error) {
	t := h.t
	if t.tx != nil {
		return t.tx.Exec(ctx, sql, args...)
	}
	if err := t.errBegin(); err != nil {
		return pgconn.CommandTag{}, err
	}
	b := &pgx.Batch{}
	b.Queue(sql, args...)
	br, err := t.sendWithBegin(ctx, b)
	if err != nil {
		return pgconn.CommandTag{}, err
	}
	tag, err := br.Exec()
	return tag, errors.Join(err, closeAfter(err, br))
}

// closeAfter closes br and returns its error unless err (the error of a
// result of br, which Close repeats) is set already.
func closeAfter(err error, br pgx.BatchResults) error {
	cerr := br.Close()
	if err != nil {
		return nil
	}
	return cerr
}

// Query implements pgx.Tx.
func (h pgxHandle) Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error) {
	t := h.t
	if t.tx != nil {
		return t.tx.Query(ctx, sql, args...)
	}
	if err := t.errBegin(); err != nil {
		return errRows{err}, err
	}
	b := &pgx.Batch{}
	b.Queue(sql, args...)
	br, err := t.sendWithBegin(ctx, b)
	if err != nil {
		return errRows{err}, err
	}
	rows, err := br.Query()
	if err != nil {
		rows.Close()
		return errRows{err}, errors.Join(err, closeAfter(err, br))
	}
	return &batchRows{Rows: rows, br: br}, nil
}

// QueryRow implements pgx.Tx.
func (h pgxHandle) QueryRow(ctx context.Context, sql string, args ...any) pgx.Row {
	if h.t.tx != nil {
		return h.t.tx.QueryRow(ctx, sql, args...)
	}
	rows, _ := h.Query(ctx, sql, args...)
	return row{rows}
}

// SendBatch implements pgx.Tx. b must not begin a transaction
// (Batch.BeginTx), as in pgx's transaction.
func (h pgxHandle) SendBatch(ctx context.Context, b *pgx.Batch) pgx.BatchResults {
	t := h.t
	if t.tx != nil {
		return t.tx.SendBatch(ctx, b)
	}
	if err := t.errBegin(); err != nil {
		return pgx.FailedBatchResults(b, err)
	}
	br, err := t.sendWithBegin(ctx, b)
	if err != nil {
		return pgx.FailedBatchResults(b, err)
	}
	return br
}

// Begin implements pgx.Tx: a savepoint, as in pgx's transaction.
func (h pgxHandle) Begin(ctx context.Context) (pgx.Tx, error) {
	tx, err := h.t.begin(ctx)
	if err != nil {
		return nil, err
	}
	return tx.Begin(ctx)
}

// CopyFrom implements pgx.Tx.
func (h pgxHandle) CopyFrom(ctx context.Context, table pgx.Identifier, columns []string, src pgx.CopyFromSource) (int64, error) {
	tx, err := h.t.begin(ctx)
	if err != nil {
		return 0, err
	}
	return tx.CopyFrom(ctx, table, columns, src)
}

// Prepare implements pgx.Tx.
func (h pgxHandle) Prepare(ctx context.Context, name, sql string) (*pgconn.StatementDescription, error) {
	tx, err := h.t.begin(ctx)
	if err != nil {
		return nil, err
	}
	return tx.Prepare(ctx, name, sql)
}

// LargeObjects implements pgx.Tx. BEGIN is sent with the context of the
// PgxTx's Begin; if it fails, the large objects' calls return
// pgx.ErrTxClosed.
func (h pgxHandle) LargeObjects() pgx.LargeObjects {
	tx, err := h.t.begin(h.t.ctx)
	if err != nil {
		return closedTx(err).LargeObjects()
	}
	return tx.LargeObjects()
}

// Conn implements pgx.Tx: it sends BEGIN first (with the context of the
// PgxTx's Begin), since statements run on the connection belong to the
// transaction.
func (h pgxHandle) Conn() *pgx.Conn {
	if h.t.c == nil {
		return nil
	}
	c := h.t.c.Conn()
	_, _ = h.t.begin(h.t.ctx) // on failure, the transaction's calls return the error
	return c
}

// Commit implements pgx.Tx: the caller's function commits (the gate then
// reports that the transaction ended).
func (h pgxHandle) Commit(ctx context.Context) error {
	t := h.t
	if t.tx != nil {
		t.ended = true
		return t.tx.Commit(ctx)
	}
	if err := t.errBegin(); err != nil {
		return err
	}
	t.ended = true // nothing ran: nothing to commit
	return nil
}

// Rollback implements pgx.Tx, as Commit.
func (h pgxHandle) Rollback(ctx context.Context) error {
	t := h.t
	if t.tx != nil {
		t.ended = true
		return t.tx.Rollback(ctx)
	}
	if err := t.errBegin(); err != nil {
		return err
	}
	t.ended = true
	return nil
}

// closedTx is a pgx transaction whose calls return pgx.ErrTxClosed.
func closedTx(err error) pgx.Tx {
	b := &pgx.Batch{}
	b.BeginTx(pgx.TxOptions{})
	return pgx.FailedBatchResults(b, err).Tx()
}

// batchRows are the rows of a query sent with BEGIN; closing them reads
// the rest of the batch, so that the connection can be used again.
type batchRows struct {
	pgx.Rows
	br     pgx.BatchResults
	closed bool
	err    error
}

func (r *batchRows) Next() bool {
	if r.Rows.Next() {
		return true
	}
	r.Close()
	return false
}

func (r *batchRows) Close() {
	if r.closed {
		return
	}
	r.closed = true
	r.Rows.Close()
	r.err = closeAfter(r.Rows.Err(), r.br)
}

func (r *batchRows) Err() error {
	if err := r.Rows.Err(); err != nil {
		return err
	}
	return r.err
}

// errRows are the rows of a query that was not sent.
type errRows struct{ err error }

func (errRows) Close()                                       {}
func (r errRows) Err() error                                 { return r.err }
func (errRows) CommandTag() pgconn.CommandTag                { return pgconn.CommandTag{} }
func (errRows) FieldDescriptions() []pgconn.FieldDescription { return nil }
func (errRows) Next() bool                                   { return false }
func (r errRows) Scan(...any) error                          { return r.err }
func (r errRows) Values() ([]any, error)                     { return nil, r.err }
func (errRows) RawValues() [][]byte                          { return nil }
func (errRows) Conn() *pgx.Conn                              { return nil }
func (errRows) TypeMap() *pgtype.Map                         { return nil }

// row is QueryRow's result, as pgx's: the first row of rows, or
// pgx.ErrNoRows.
type row struct{ rows pgx.Rows }

func (r row) Scan(dest ...any) error {
	rows := r.rows
	defer rows.Close()
	if err := rows.Err(); err != nil {
		return err
	}
	if !rows.Next() {
		if err := rows.Err(); err != nil {
			return err
		}
		return pgx.ErrNoRows
	}
	if err := rows.Scan(dest...); err != nil {
		return err
	}
	rows.Close()
	return rows.Err()
}

// Exec implements Querier.
func (t *PgxTx) Exec(ctx context.Context, sql string, args ...any) (int64, error) {
	return pgxExec(ctx, pgxHandle{t}, sql, args)
}

// QueryRow implements Querier.
func (t *PgxTx) QueryRow(ctx context.Context, sql string, args ...any) Row {
	return pgxHandle{t}.QueryRow(ctx, sql, args...)
}

// Query implements Querier.
func (t *PgxTx) Query(ctx context.Context, sql string, args []any, each func(Row) error) error {
	return pgxQuery(ctx, pgxHandle{t}, sql, args, each)
}

// Commit implements Tx.
func (t *PgxTx) Commit(ctx context.Context) error {
	if err := t.errBegin(); err != nil {
		t.release()
		return err
	}
	defer t.release()
	if t.tx == nil { // nothing ran
		return nil
	}
	return t.tx.Commit(ctx)
}

// Rollback implements Tx.
func (t *PgxTx) Rollback(ctx context.Context) error {
	if t.c == nil || t.ended {
		t.release()
		return pgx.ErrTxClosed
	}
	defer t.release()
	if t.tx == nil { // nothing ran, or BEGIN failed
		return nil
	}
	return t.tx.Rollback(ctx)
}

// CommitWith implements Committer. When no statement ran before, BEGIN
// goes in the same round trip.
func (t *PgxTx) CommitWith(ctx context.Context, stmts ...Statement) error {
	if t.c == nil || t.ended {
		return pgx.ErrTxClosed
	}
	if t.beginErr != nil {
		// Not the error itself: its SQLSTATE is a statement's of the
		// caller, not one of these.
		return aborted{fmt.Errorf("the transaction did not start: %v", t.beginErr)}
	}
	conn := t.c.Conn()
	if t.tx != nil {
		switch conn.PgConn().TxStatus() {
		case 'T':
		case 'E':
			return aborted{errors.New("the transaction is aborted: one of its statements failed")}
		default: // idle: the transaction was committed or rolled back
			return pgx.ErrTxClosed
		}
	}
	b := &pgx.Batch{}
	if t.tx == nil {
		b.BeginTx(pgx.TxOptions{})
	}
	for _, st := range stmts {
		b.Queue(st.SQL, st.Args...)
	}
	b.Queue("COMMIT")
	br := conn.SendBatch(ctx, b)
	began := t.tx == nil
	if began {
		t.tx = br.Tx()
	}
	if err := br.Close(); err != nil {
		if !conn.IsClosed() {
			switch conn.PgConn().TxStatus() {
			case 'E':
				return aborted{err} // a statement failed: the COMMIT did not run
			case 'I':
				// The server refused a statement and the transaction that
				// began in this batch is over: pgx prepares every statement
				// before the first runs, so it never started, or COMMIT
				// refused it. Nothing committed.
				if began && Code(err) != "" {
					return aborted{err}
				}
			}
		}
		return err
	}
	if conn.PgConn().TxStatus() != 'I' {
		return errors.New("COMMIT did not end the transaction")
	}
	t.release() // committed: the pool takes the connection back
	return nil
}

// release gives the connection back to the pool (which closes it if it is
// still in a transaction), once.
func (t *PgxTx) release() {
	if t.c != nil {
		t.c.Release()
		t.c = nil
	}
}
