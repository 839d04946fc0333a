package pggate

import (
	"context"
	"fmt"

	"github.com/idemgo/idem/postgres/internal/pgq"
)

// ForeignInsert is the statement with which a handler in any language
// records its completion in its own transaction, beside its effect, for a
// caller that checks the gate itself (`idem consume --gate`, see
// docs/consume.md). Its parameters: $1 the digest (the request's
// Idempotency-Digest header), $2 the fence (Idempotency-Fence), $3 the
// result (bytea: what a replay of the key returns), $4 the retention in
// seconds (Idem-Retention). It inserts one row, or replaces an expired
// one; when a live completion of the digest committed first it changes no
// row, and the transaction must roll back with its effect (a second
// transaction of the same digest waits for the first to end). The row is
// marked relayed: a Gate's relay leaves it alone (its result is the
// handler's own bytes, not the Executor's encoding), its janitor deletes
// it after the retention.
const ForeignInsert = `INSERT INTO idem_completions AS c (digest, fingerprint, fence, result, expires_at, relayed)
VALUES ($1, '', $2, $3, now() + $4 * interval '1 second', true)
ON CONFLICT (digest) DO UPDATE SET fence = excluded.fence, result = excluded.result,
  created_at = now(), expires_at = excluded.expires_at, progress = NULL
WHERE c.expires_at <= now()`

// Committed returns the result of the live completion row of digest (the
// digest of an idem.Key, what idem.Attempt.Key returns), as it was
// inserted, and ok true; ok is false when the digest has no live row (none,
// expired, or an unfinished multi-step request). A caller that finds one
// acknowledges the work as done without running it again: its effect
// committed with that row. It is safe for concurrent use.
func (g *Gate[T]) Committed(ctx context.Context, digest string) (result []byte, ok bool, err error) {
	err = g.db.QueryRow(ctx, `SELECT result FROM idem_completions
WHERE digest = $1 AND expires_at > now() AND progress IS NULL`, digest).Scan(&result)
	switch {
	case err == nil:
		return result, true, nil
	case pgq.NoRows(err):
		return nil, false, nil
	case pgq.Code(err) == pgq.UndefinedTable:
		return nil, false, fmt.Errorf("%w: %w", ErrNoTable, err)
	}
	return nil, false, fmt.Errorf("pggate: reading the completion: %w", err)
}
