// Package pgq adapts the two Postgres client APIs that idem supports (pgx
// and database/sql through pgx's stdlib driver) to the few calls pggate and
// pgstore make, so that each algorithm is written once.
package pgq

import (
	"context"
	"database/sql"
	"errors"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
)

// Row is one row of a query.
type Row interface {
	Scan(dest ...any) error
}

// Querier runs statements: a pool or a transaction.
type Querier interface {
	// Exec runs sql and returns the number of rows it affected.
	Exec(ctx context.Context, sql string, args ...any) (int64, error)
	// QueryRow runs sql, which returns at most one row.
	QueryRow(ctx context.Context, sql string, args ...any) Row
	// Query runs sql and calls each for every row, until each returns an
	// error.
	Query(ctx context.Context, sql string, args []any, each func(Row) error) error
}

// Tx is a transaction.
type Tx interface {
	Querier
	Commit(ctx context.Context) error
	Rollback(ctx context.Context) error
}

// DB is a pool whose transactions are handed to callers as a T (pgx.Tx or
// *sql.Tx).
type DB[T any] interface {
	Querier
	Begin(ctx context.Context) (Tx, T, error)
}

// Pgx adapts a pgx pool.
type Pgx struct{ Pool *pgxpool.Pool }

// Committer is a Tx that can run a last statement and COMMIT in one round
// trip (pgx). SQLTx is not one: database/sql hides the connection.
type Committer interface {
	// CommitWith runs stmts (statements without results) followed by
	// COMMIT, in one round trip: one pipeline in the connection's query
	// mode (prepared and cached statements by default, one simple-protocol
	// query when the pool is configured for it). If a statement fails,
	// nothing after it runs and the transaction must be rolled back
	// (Rollback). It returns pgx.ErrTxClosed when the transaction was
	// committed or rolled back already.
	CommitWith(ctx context.Context, stmts ...Statement) error
}

// Statement is one statement of a Committer's CommitWith.
type Statement struct {
	SQL  string
	Args []any
}

// SQL adapts a database/sql pool.
type SQL struct{ DB *sql.DB }

// SQLTx adapts a database/sql transaction.
type SQLTx struct{ Tx *sql.Tx }

var (
	_ DB[pgx.Tx]  = Pgx{}
	_ DB[*sql.Tx] = SQL{}
	_ Tx          = (*PgxTx)(nil)
	_ Committer   = (*PgxTx)(nil)
	_ Tx          = SQLTx{}
)

// pgxQuerier is what pgx pools, connections and transactions share.
type pgxQuerier interface {
	Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error)
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
}

func pgxExec(ctx context.Context, q pgxQuerier, sql string, args []any) (int64, error) {
	tag, err := q.Exec(ctx, sql, args...)
	return tag.RowsAffected(), err
}

func pgxQuery(ctx context.Context, q pgxQuerier, sql string, args []any, each func(Row) error) error {
	rows, err := q.Query(ctx, sql, args...)
	if err != nil {
		return err
	}
	defer rows.Close()
	for rows.Next() {
		if err := each(rows); err != nil {
			return err
		}
	}
	return rows.Err()
}

// Exec implements Querier.
func (d Pgx) Exec(ctx context.Context, sql string, args ...any) (int64, error) {
	return pgxExec(ctx, d.Pool, sql, args)
}

// QueryRow implements Querier.
func (d Pgx) QueryRow(ctx context.Context, sql string, args ...any) Row {
	return d.Pool.QueryRow(ctx, sql, args...)
}

// Query implements Querier.
func (d Pgx) Query(ctx context.Context, sql string, args []any, each func(Row) error) error {
	return pgxQuery(ctx, d.Pool, sql, args, each)
}

// aborted is the error of a CommitWith whose statements failed before the
// COMMIT: nothing committed.
type aborted struct{ error }

func (a aborted) Unwrap() error { return a.error }

// Aborted reports whether err is the error of a CommitWith whose
// transaction was aborted before its COMMIT ran: nothing committed.
func Aborted(err error) bool {
	var a aborted
	return errors.As(err, &a)
}

// NoRows reports whether err is the error of a QueryRow that found no row
// (pgx's or database/sql's).
func NoRows(err error) bool {
	return errors.Is(err, pgx.ErrNoRows) || errors.Is(err, sql.ErrNoRows)
}

// ConflictOn reports whether err is a unique violation on table.
func ConflictOn(err error, table string) bool {
	var pe *pgconn.PgError
	return errors.As(err, &pe) && pe.Code == UniqueViolation && pe.TableName == table
}

// sqlQuerier is what *sql.DB and *sql.Tx share.
type sqlQuerier interface {
	ExecContext(ctx context.Context, query string, args ...any) (sql.Result, error)
	QueryRowContext(ctx context.Context, query string, args ...any) *sql.Row
	QueryContext(ctx context.Context, query string, args ...any) (*sql.Rows, error)
}

func sqlExec(ctx context.Context, q sqlQuerier, query string, args []any) (int64, error) {
	res, err := q.ExecContext(ctx, query, args...)
	if err != nil {
		return 0, err
	}
	return res.RowsAffected()
}

func sqlQuery(ctx context.Context, q sqlQuerier, query string, args []any, each func(Row) error) error {
	rows, err := q.QueryContext(ctx, query, args...)
	if err != nil {
		return err
	}
	defer rows.Close()
	for rows.Next() {
		if err := each(rows); err != nil {
			return err
		}
	}
	return rows.Err()
}

// Exec implements Querier.
func (d SQL) Exec(ctx context.Context, sql string, args ...any) (int64, error) {
	return sqlExec(ctx, d.DB, sql, args)
}

// QueryRow implements Querier.
func (d SQL) QueryRow(ctx context.Context, sql string, args ...any) Row {
	return d.DB.QueryRowContext(ctx, sql, args...)
}

// Query implements Querier.
func (d SQL) Query(ctx context.Context, sql string, args []any, each func(Row) error) error {
	return sqlQuery(ctx, d.DB, sql, args, each)
}

// Begin implements DB.
func (d SQL) Begin(ctx context.Context) (Tx, *sql.Tx, error) {
	tx, err := d.DB.BeginTx(ctx, nil)
	if err != nil {
		return nil, nil, err
	}
	return SQLTx{tx}, tx, nil
}

// Exec implements Querier.
func (t SQLTx) Exec(ctx context.Context, sql string, args ...any) (int64, error) {
	return sqlExec(ctx, t.Tx, sql, args)
}

// QueryRow implements Querier.
func (t SQLTx) QueryRow(ctx context.Context, sql string, args ...any) Row {
	return t.Tx.QueryRowContext(ctx, sql, args...)
}

// Query implements Querier.
func (t SQLTx) Query(ctx context.Context, sql string, args []any, each func(Row) error) error {
	return sqlQuery(ctx, t.Tx, sql, args, each)
}

// Commit implements Tx.
func (t SQLTx) Commit(context.Context) error { return t.Tx.Commit() }

// Rollback implements Tx.
func (t SQLTx) Rollback(context.Context) error { return t.Tx.Rollback() }

// TxDone reports whether err says that the transaction was already
// committed or rolled back.
func TxDone(err error) bool {
	return errors.Is(err, pgx.ErrTxClosed) || errors.Is(err, sql.ErrTxDone)
}

// Code returns the SQLSTATE of a server error, or "".
func Code(err error) string {
	var pe *pgconn.PgError
	if errors.As(err, &pe) {
		return pe.Code
	}
	return ""
}

// SQLSTATE codes idem checks.
const (
	UndefinedTable    = "42P01"
	UniqueViolation   = "23505"
	UndefinedFunction = "42883"
	UndefinedColumn   = "42703"
	InsufficientPriv  = "42501"
)

// Migrate applies schema in one transaction that holds the advisory lock
// named lock, so that processes migrating at once apply it one after
// another.
func Migrate[T any](ctx context.Context, db DB[T], lock, schema string) error {
	tx, _, err := db.Begin(ctx)
	if err != nil {
		return err
	}
	defer tx.Rollback(context.WithoutCancel(ctx))
	if _, err := tx.Exec(ctx, "SELECT pg_advisory_xact_lock(hashtext('"+lock+"'))"); err != nil {
		return err
	}
	if _, err := tx.Exec(ctx, schema); err != nil {
		return err
	}
	return tx.Commit(ctx)
}
