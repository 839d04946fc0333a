package pggate

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/idemgo/idem/postgres/internal/pgq"
	"github.com/idemgo/idem/storekit"
)

// markEvery is how often the digests of completions that the store got
// right after their commit are marked relayed, in one statement.
const markEvery = 100 * time.Millisecond

// background runs the marker, the relay and the janitor until Close.
func (g *Gate[T]) background() {
	defer close(g.stopped)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var stops []func()
	defer func() {
		for _, s := range stops {
			s()
		}
	}()
	tick := func(d time.Duration) <-chan time.Time {
		if d == 0 {
			return nil
		}
		t := time.NewTicker(d)
		stops = append(stops, t.Stop)
		return t.C
	}
	relayC, sweepC, markC, completeC := tick(g.cfg.relayInterval), tick(g.cfg.sweepInterval), tick(markEvery), tick(g.cfg.complete)
	var pending []string
	flush := func() {
		if len(pending) == 0 {
			return
		}
		if err := mark(ctx, g.db, pending); err != nil {
			// The rows stay unrelayed; the relay finds them, and relaying a
			// completion the store holds changes nothing.
			g.cfg.log.Warn("pggate: marking completions relayed", "rows", len(pending), "error", err)
		}
		pending = pending[:0]
	}
	for {
		select {
		case <-g.stop:
		drain:
			for {
				select {
				case k := <-g.marks:
					pending = append(pending, k)
				default:
					break drain
				}
			}
			flush()
			return
		case k := <-g.marks:
			if pending = append(pending, k); len(pending) >= g.cfg.batch {
				flush()
			}
		case <-markC:
			flush()
		case <-relayC:
			if _, err := g.Relay(ctx); err != nil {
				g.cfg.log.Warn("pggate: relay", "error", err)
			}
		case <-completeC:
			if _, _, err := g.Complete(ctx); err != nil {
				g.cfg.log.Warn("pggate: completer", "error", err)
			}
		case <-sweepC:
			if _, err := g.Sweep(ctx); err != nil {
				g.cfg.log.Warn("pggate: janitor", "error", err)
			}
		}
	}
}

// mark marks the completions of keys relayed.
func mark(ctx context.Context, q pgq.Querier, keys []string) error {
	_, err := q.Exec(ctx, `UPDATE idem_completions SET relayed = true WHERE digest = ANY($1) AND NOT relayed`, keys)
	return err
}

// Relay copies into the store every committed completion that is not
// marked relayed and older than the relay delay (WithRelayDelay), then
// marks it relayed; it returns how many it copied. The store gets each
// with storekit.Relayer: a record that is not COMPLETED becomes COMPLETED with
// the committed result (a crashed owner's IN_PROGRESS record, a record the
// store lost), a COMPLETED record is left as it is. Rows are taken with
// FOR UPDATE SKIP LOCKED, so several relays (every Gate runs one, and `idem
// relay`) share the work. A row whose copy fails stays unrelayed for the
// next run. Relay is safe for concurrent use.
func (g *Gate[T]) Relay(ctx context.Context) (int, error) {
	total := 0
	for {
		n, more, err := g.relayBatch(ctx)
		total += n
		if err != nil || !more {
			return total, err
		}
	}
}

// relayBatch relays one batch; more reports a full batch.
func (g *Gate[T]) relayBatch(ctx context.Context) (n int, more bool, err error) {
	tx, _, err := g.db.Begin(ctx)
	if err != nil {
		return 0, false, fmt.Errorf("pggate: relay: %w", err)
	}
	defer tx.Rollback(context.WithoutCancel(ctx))
	type row struct {
		key string
		c   storekit.Completion
	}
	var rows []row
	err = tx.Query(ctx, `SELECT digest, fingerprint, fence, result, (extract(epoch FROM expires_at - now()) * 1000000)::bigint
FROM idem_completions
WHERE NOT relayed AND created_at < now() - $1 * interval '1 microsecond' AND expires_at > now()
ORDER BY created_at LIMIT $2 FOR UPDATE SKIP LOCKED`, []any{g.cfg.relayDelay.Microseconds(), g.cfg.batch}, func(r pgq.Row) error {
		var x row
		var fp []byte
		var left int64
		if err := r.Scan(&x.key, &fp, &x.c.Fence, &x.c.Result, &left); err != nil {
			return err
		}
		x.c.Fingerprint = string(fp)
		x.c.Retention = max(time.Duration(left)*time.Microsecond, time.Millisecond)
		rows = append(rows, x)
		return nil
	})
	if err != nil {
		return 0, false, relayErr(err)
	}
	var done []string
	var errs []error
	for _, x := range rows {
		if err := g.relayer.RelayCompletion(ctx, x.key, x.c); err != nil {
			errs = append(errs, err)
			continue
		}
		done = append(done, x.key)
	}
	if len(done) > 0 {
		if err := mark(ctx, tx, done); err != nil {
			return 0, false, relayErr(err)
		}
		if err := tx.Commit(ctx); err != nil {
			return 0, false, relayErr(err)
		}
	}
	if len(errs) > 0 {
		return len(done), false, fmt.Errorf("pggate: relay: %d of %d completions not copied: %w", len(errs), len(rows), errors.Join(errs...))
	}
	return len(done), len(rows) == g.cfg.batch, nil
}

func relayErr(err error) error {
	if pgq.Code(err) == pgq.UndefinedTable {
		return fmt.Errorf("%w: %w", ErrNoTable, err)
	}
	return fmt.Errorf("pggate: relay: %w", err)
}

// Sweep deletes the completion rows whose retention ended, in batches of
// the batch size (WithBatchSize), oldest first through the index on
// expires_at, and returns how many it deleted. The Executor's store forgets
// the records after the same retention, so a key is new again once both
// are gone. Sweep is safe for concurrent use, also from several processes.
func (g *Gate[T]) Sweep(ctx context.Context) (int, error) {
	total := 0
	for {
		n, err := g.db.Exec(ctx, `DELETE FROM idem_completions WHERE digest IN (
  SELECT digest FROM idem_completions WHERE expires_at <= now() ORDER BY expires_at LIMIT $1 FOR UPDATE SKIP LOCKED)`, g.cfg.batch)
		total += int(n)
		if err != nil {
			return total, relayErr(err)
		}
		if n < int64(g.cfg.batch) {
			return total, nil
		}
	}
}
