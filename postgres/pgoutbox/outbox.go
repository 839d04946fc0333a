package pgoutbox

import (
	"context"
	"database/sql"
	_ "embed"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"unicode"
	"unicode/utf8"

	"github.com/idemgo/idem"
	"github.com/idemgo/idem/postgres/internal/pgq"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// Schema is the SQL that creates the outbox table and its indexes
// (schema.sql in this package), for teams that apply migrations with their
// own tool. Migrate runs it.
//
//go:embed schema.sql
var Schema string

// Table is the name of the outbox table.
const Table = "idem_outbox"

// KeyHeader is the header that carries a message's idempotency key on the
// brokers that have headers (see the package documentation for where each
// sender puts the key).
const KeyHeader = "Idempotency-Key"

// MaxDestinationLen is the longest destination name, in bytes.
const MaxDestinationLen = 255

// ErrNoTable is returned when the outbox table does not exist: run
// Migrate, or apply schema.sql (Schema) with your migration tool.
var ErrNoTable = errors.New("pgoutbox: the outbox table " + Table + " does not exist: run pgoutbox.Migrate or apply pgoutbox's schema.sql")

// reserved are the header names the senders write themselves, compared
// without case: the key's header, NATS's deduplication header (the NATS
// sender puts the key there), and the two fields of a Redis stream entry.
var reserved = []string{KeyHeader, "Nats-Msg-Id", "key", "payload"}

// Migrate creates the outbox table and its indexes if they do not exist
// (Schema). It is safe to run at every start, from several processes at
// once (a transaction-scoped advisory lock orders them).
func Migrate(ctx context.Context, pool *pgxpool.Pool) error {
	if pool == nil {
		return fmt.Errorf("%w: pgoutbox: nil pool", idem.ErrInvalid)
	}
	if err := pgq.Migrate(ctx, pgq.Pgx{Pool: pool}, Table, Schema); err != nil {
		return fmt.Errorf("pgoutbox: migrate: %w", err)
	}
	return nil
}

// insert is the statement of Publish.
const insert = `INSERT INTO idem_outbox (destination, key, payload, headers) VALUES ($1, $2, $3, $4::text::jsonb)`

// Publish writes a message to the outbox in tx, the caller's transaction:
// it is sent if and only if tx commits. Call it inside a commit gate's
// function (pggate.Gate.Do, Handle, HTTP), where it commits with the effect
// and the completion row, once per idempotency key, or in any transaction
// of your own.
//
// destination names where the relay sends the message (a name its routes
// know: see New); key is the message's idempotency key, which the relay
// sends with it (see the package documentation for where on each broker)
// and by which a consumer deduplicates it; payload is the body; headers are
// sent as the broker's headers (nil for none). The relay sends the rows of
// one destination and key in order, one at a time (see the package
// documentation).
//
// Publish returns an error wrapping idem.ErrInvalid, and writes nothing,
// when destination is empty or over MaxDestinationLen bytes, key is empty
// or over storekit.MaxKeyLen bytes, either is not UTF-8 or holds a control
// character, or a header's name is empty, reserved (KeyHeader,
// "Nats-Msg-Id", "key", "payload", in any case) or either of its name and
// value is not UTF-8 or holds a control character. It returns ErrNoTable
// when the table does not exist (the error aborts tx, as any failed
// statement does).
func Publish(ctx context.Context, tx pgx.Tx, destination, key string, payload []byte, headers map[string]string) error {
	if tx == nil {
		return fmt.Errorf("%w: pgoutbox: nil transaction", idem.ErrInvalid)
	}
	args, err := publishArgs(destination, key, payload, headers)
	if err != nil {
		return err
	}
	_, err = tx.Exec(ctx, insert, args...)
	return publishErr(err)
}

// PublishSQL is Publish for a database/sql transaction (pgx's stdlib
// driver), such as the one a pggate.NewSQL gate hands over.
func PublishSQL(ctx context.Context, tx *sql.Tx, destination, key string, payload []byte, headers map[string]string) error {
	if tx == nil {
		return fmt.Errorf("%w: pgoutbox: nil transaction", idem.ErrInvalid)
	}
	args, err := publishArgs(destination, key, payload, headers)
	if err != nil {
		return err
	}
	_, err = tx.ExecContext(ctx, insert, args...)
	return publishErr(err)
}

func publishErr(err error) error {
	switch {
	case err == nil:
		return nil
	case pgq.Code(err) == pgq.UndefinedTable:
		return fmt.Errorf("%w: %w", ErrNoTable, err)
	}
	return fmt.Errorf("pgoutbox: publish: %w", err)
}

// publishArgs validates a message and returns the arguments of insert.
func publishArgs(destination, key string, payload []byte, headers map[string]string) ([]any, error) {
	switch {
	case destination == "" || len(destination) > MaxDestinationLen:
		return nil, invalidf("destination of %d bytes: want 1 to %d", len(destination), MaxDestinationLen)
	case !clean(destination):
		return nil, invalidf("destination is not UTF-8 or holds a control character")
	}
	if err := (idem.Key{ID: key}).Validate(); err != nil {
		return nil, fmt.Errorf("pgoutbox: %w", err)
	}
	if !clean(key) {
		return nil, invalidf("key is not UTF-8 or holds a control character")
	}
	for name, value := range headers {
		switch {
		case name == "":
			return nil, invalidf("empty header name")
		case !clean(name) || !clean(value):
			return nil, invalidf("header %q: the name or the value is not UTF-8 or holds a control character", name)
		}
		for _, r := range reserved {
			if strings.EqualFold(name, r) {
				return nil, invalidf("header %q is reserved: the relay's senders write it", name)
			}
		}
	}
	h := "{}"
	if len(headers) > 0 {
		b, err := json.Marshal(headers)
		if err != nil {
			return nil, invalidf("headers: %v", err)
		}
		h = string(b)
	}
	if payload == nil {
		payload = []byte{}
	}
	return []any{destination, key, payload, h}, nil
}

// clean reports whether s is UTF-8 without control characters.
func clean(s string) bool {
	if !utf8.ValidString(s) {
		return false
	}
	for _, r := range s {
		if unicode.IsControl(r) {
			return false
		}
	}
	return true
}

func invalidf(format string, args ...any) error {
	return fmt.Errorf("%w: pgoutbox: %s", idem.ErrInvalid, fmt.Sprintf(format, args...))
}
