package pggate

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/idemgo/idem"
	"github.com/idemgo/idem/postgres/internal/pgq"
	"github.com/idemgo/idem/storekit"
)

// background runs the relay, the completer and the janitor until Close.
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
	relayC, sweepC, completeC := tick(g.cfg.relayInterval), tick(g.cfg.sweepInterval), tick(g.cfg.complete)
	for {
		select {
		case <-g.stop:
			return
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

// Relay copies into the store every committed completion written since the
// relay's cursor and older than the relay delay (WithRelayDelay), in the
// order the rows were written, then moves the cursor past them; it returns
// how many it copied. The store gets each with storekit.Relayer: a record
// that is not COMPLETED becomes COMPLETED with the committed result (a
// crashed owner's IN_PROGRESS record, a record the store lost), a COMPLETED
// record is left as it is. The completions that this Gate wrote into the
// store right after their commit are not copied again (the Gate remembers
// them for the relay delay and two relay intervals, at least 10s); those of other
// processes are, and nothing changes.
// No completion row is written: the cursor, one row for the table
// (idem_completions_relay), is what records the relay's progress. Several
// relays (every Gate runs one, and `idem relay`) take turns: the cursor is
// taken with FOR UPDATE SKIP LOCKED, and a relay that finds it taken
// returns at once. A copy that fails stops the pass there, and the next
// pass starts with that row, unless the store refused the completion as
// invalid (idem.ErrInvalid; it never will take it): that row is skipped
// and reported. Relay is safe for concurrent use.
//
// The cursor follows created_at, which the gate writes with the statement
// that precedes its COMMIT: a row whose COMMIT took longer than the relay
// delay after its insert may be passed over. The store then lacks that
// completion until the key's next attempt, whose insert conflicts with the
// row and replays it (as when the store loses a record).
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
	var (
		at   time.Time
		last string
	)
	err = tx.QueryRow(ctx, `SELECT created_at, digest FROM idem_completions_relay FOR UPDATE SKIP LOCKED`).Scan(&at, &last)
	if pgq.NoRows(err) {
		return 0, false, nil // another relay holds the cursor
	}
	if err != nil {
		return 0, false, relayErr(err)
	}
	type row struct {
		key  string
		at   time.Time
		copy bool // a completion of the store's, unexpired
		c    storekit.Completion
	}
	var rows []row
	// Every row past the cursor counts towards the batch, so that rows with
	// nothing to relay (relayed, unfinished, expired) move the cursor too;
	// their result is not read.
	err = tx.Query(ctx, `SELECT digest, created_at, NOT relayed AND progress IS NULL AND expires_at > now(), fingerprint, fence,
  CASE WHEN NOT relayed AND progress IS NULL AND expires_at > now() THEN result END,
  (extract(epoch FROM expires_at - now()) * 1000000)::bigint
FROM idem_completions
WHERE (created_at, digest) > ($1, $2) AND created_at < now() - $3 * interval '1 microsecond'
ORDER BY created_at, digest LIMIT $4`, []any{at, last, g.cfg.relayDelay.Microseconds(), g.cfg.batch}, func(r pgq.Row) error {
		var x row
		var fp []byte
		var left int64
		if err := r.Scan(&x.key, &x.at, &x.copy, &fp, &x.c.Fence, &x.c.Result, &left); err != nil {
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
	var errs []error
	done := 0 // rows the cursor moves past
	for _, x := range rows {
		if x.copy && !g.copied.has(x.key) {
			if err := g.relayer.RelayCompletion(ctx, x.key, x.c); err != nil {
				errs = append(errs, fmt.Errorf("%s: %w", x.key, err))
				if !errors.Is(err, idem.ErrInvalid) {
					break // the next pass starts with this row
				}
			} else {
				n++
			}
		}
		done++
	}
	if done > 0 {
		end := rows[done-1]
		if _, err := tx.Exec(ctx, `UPDATE idem_completions_relay SET created_at = $1, digest = $2`, end.at, end.key); err != nil {
			return 0, false, relayErr(err)
		}
		if err := tx.Commit(ctx); err != nil {
			return 0, false, relayErr(err)
		}
	}
	if len(errs) > 0 {
		return n, false, fmt.Errorf("pggate: relay: %d of %d completions not copied: %w", len(errs), len(rows), errors.Join(errs...))
	}
	return n, len(rows) == g.cfg.batch, nil
}

func relayErr(err error) error {
	if pgq.Code(err) == pgq.UndefinedTable {
		return fmt.Errorf("%w: %w", ErrNoTable, err)
	}
	return fmt.Errorf("pggate: relay: %w", err)
}

// Sweep deletes the completion rows whose retention ended, in batches of
// the batch size (WithBatchSize), in the order the rows were written
// (through the relay's index on created_at), and returns how many it
// deleted. It deletes the expired rows written before the oldest live one:
// where Executors of different retentions share the table, an expired row
// written after a live row of a longer retention stays until that row
// expires too (the gate treats it as absent all the same). The Executor's
// store forgets the records after the same retention, so a key is new again
// once both are gone. Sweep is safe for concurrent use, also from several
// processes.
func (g *Gate[T]) Sweep(ctx context.Context) (int, error) {
	// The bound is read once a pass: every batch starts at the oldest row
	// again, and reading the bound again would read the rows it deleted.
	// No live row: every expired row goes (a NULL bound).
	var bound *time.Time
	var live time.Time
	err := g.db.QueryRow(ctx, `SELECT created_at FROM idem_completions WHERE expires_at > now() ORDER BY created_at LIMIT 1`).Scan(&live)
	switch {
	case err == nil:
		bound = &live
	case !pgq.NoRows(err):
		return 0, relayErr(err)
	}
	total := 0
	for {
		n, err := g.db.Exec(ctx, `DELETE FROM idem_completions WHERE digest IN (
  SELECT digest FROM idem_completions WHERE expires_at <= now() AND created_at < coalesce($2::timestamptz, 'infinity')
  ORDER BY created_at LIMIT $1 FOR UPDATE SKIP LOCKED)`, g.cfg.batch, bound)
		total += int(n)
		if err != nil {
			return total, relayErr(err)
		}
		if n < int64(g.cfg.batch) {
			return total, nil
		}
	}
}

// copied holds the digests of the completions a Gate wrote into the store
// right after their commit, so that its relay does not copy them again:
// each is kept at least one period and less than two (two maps that take
// turns), at most maxCopied a map. A digest forgotten early is copied
// again, which changes nothing.
type copied struct {
	mu        sync.Mutex
	cur, prev map[string]struct{}
	since     time.Time // cur's start
}

// maxCopied bounds a map of copied; minCopied is the shortest period.
const (
	maxCopied = 1 << 17
	minCopied = 10 * time.Second
)

func (c *copied) add(key string, period time.Duration) {
	now := time.Now()
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.cur == nil || now.Sub(c.since) >= period {
		c.prev, c.cur, c.since = c.cur, make(map[string]struct{}), now
	}
	if len(c.cur) < maxCopied {
		c.cur[key] = struct{}{}
	}
}

func (c *copied) has(key string) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	_, ok := c.cur[key]
	if !ok {
		_, ok = c.prev[key]
	}
	return ok
}
