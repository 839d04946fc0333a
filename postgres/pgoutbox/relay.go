package pgoutbox

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"sync"
	"time"

	"github.com/idemgo/idem/postgres/internal/pgq"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// Sender sends messages to one destination of a broker. Each broker's
// module has one (see the package documentation): they implement this
// interface without importing this package, so that a broker's module
// does not depend on pgx.
type Sender interface {
	// Send sends one message with its idempotency key, payload and
	// headers, and returns nil only once the broker confirmed it (a
	// publisher confirm, an ack, a reply): a message whose Send returned
	// nil must survive the relay's crash. An error means the message may
	// or may not have been sent: the relay sends it again later. Send is
	// called from several goroutines at once, never twice at once for one
	// key.
	Send(ctx context.Context, key string, payload []byte, headers map[string]string) error
}

// Defaults of the options.
const (
	DefaultInterval      = 100 * time.Millisecond
	DefaultBatchSize     = 100
	DefaultConcurrency   = 16
	DefaultSendTimeout   = 30 * time.Second
	DefaultMinBackoff    = time.Second
	DefaultMaxBackoff    = time.Minute
	DefaultRetention     = 24 * time.Hour
	DefaultSweepInterval = time.Minute
)

// markTimeout bounds the statements that record a batch's outcome and its
// commit, which run even when Run's context is cancelled (the broker has
// the messages: marking them saves sending them again).
const markTimeout = 10 * time.Second

// maxErrorLen bounds the error text kept in a row's last_error.
const maxErrorLen = 1000

// Option configures a Relay.
type Option func(*config)

type config struct {
	interval      time.Duration
	batch         int
	concurrency   int
	sendTimeout   time.Duration
	minBackoff    time.Duration
	maxBackoff    time.Duration
	retention     time.Duration
	sweepInterval time.Duration
	log           *slog.Logger
	anyOrder      bool // tests: claim rows without the per-key rule (the negative control)
}

// WithInterval sets how long Run waits before it looks for new rows once
// none is left to send: the latency a message adds when the relay is idle.
// The default is DefaultInterval (100ms).
func WithInterval(d time.Duration) Option { return func(c *config) { c.interval = d } }

// WithBatchSize sets how many rows one transaction of the relay claims,
// sends and marks. The default is DefaultBatchSize (100).
func WithBatchSize(n int) Option { return func(c *config) { c.batch = n } }

// WithConcurrency sets how many messages of a batch are sent at the same
// time (never two of one key). The default is DefaultConcurrency (16).
func WithConcurrency(n int) Option { return func(c *config) { c.concurrency = n } }

// WithSendTimeout bounds one Send: a message not confirmed in time counts
// as a failed send. The default is DefaultSendTimeout (30s).
func WithSendTimeout(d time.Duration) Option { return func(c *config) { c.sendTimeout = d } }

// WithBackoff sets how long a row whose send failed waits before the next
// try: min after the first failure, doubling with each failure up to max.
// The later rows of its key wait with it. The defaults are
// DefaultMinBackoff (1s) and DefaultMaxBackoff (1m).
func WithBackoff(min, max time.Duration) Option {
	return func(c *config) { c.minBackoff, c.maxBackoff = min, max }
}

// WithRetention sets how long sent rows are kept before the janitor
// deletes them (Sweep). The default is DefaultRetention (24h).
func WithRetention(d time.Duration) Option { return func(c *config) { c.retention = d } }

// WithSweepInterval sets how often Run deletes the sent rows past the
// retention (Sweep). Zero disables it. The default is DefaultSweepInterval
// (1m).
func WithSweepInterval(d time.Duration) Option { return func(c *config) { c.sweepInterval = d } }

// WithLogger sets where Run reports failed sends and failed passes
// (WARN). Records carry row ids and destinations, never keys. The default
// is slog.Default().
func WithLogger(l *slog.Logger) Option { return func(c *config) { c.log = l } }

// Relay sends the rows of the outbox table to brokers and marks them sent,
// and deletes sent rows after the retention. routes map each destination
// name (Publish's destination) to the Sender of that destination; a relay
// leaves the rows of other destinations alone, so relays with different
// routes can share one table. Several relays, in one process or several,
// share the work: each claims its rows with FOR UPDATE SKIP LOCKED. A
// Relay is safe for concurrent use.
type Relay struct {
	pool   *pgxpool.Pool
	routes map[string]Sender
	dests  []string
	claim  string
	cfg    config
}

// New returns a Relay on pool for routes (destination name → Sender). It
// does no I/O. Errors wrap idem.ErrInvalid: a nil pool, no route, an empty
// destination name or a nil Sender, or an option out of range.
func New(pool *pgxpool.Pool, routes map[string]Sender, opts ...Option) (*Relay, error) {
	c := config{
		interval:      DefaultInterval,
		batch:         DefaultBatchSize,
		concurrency:   DefaultConcurrency,
		sendTimeout:   DefaultSendTimeout,
		minBackoff:    DefaultMinBackoff,
		maxBackoff:    DefaultMaxBackoff,
		retention:     DefaultRetention,
		sweepInterval: DefaultSweepInterval,
		log:           slog.Default(),
	}
	for _, o := range opts {
		o(&c)
	}
	var bad string
	switch {
	case pool == nil:
		bad = "nil pool"
	case len(routes) == 0:
		bad = "no route"
	case c.interval <= 0 || c.sendTimeout <= 0 || c.retention <= 0:
		bad = "interval, send timeout and retention must be positive"
	case c.minBackoff <= 0 || c.maxBackoff < c.minBackoff:
		bad = fmt.Sprintf("backoff %v to %v: want 0 < min ≤ max", c.minBackoff, c.maxBackoff)
	case c.sweepInterval < 0:
		bad = "negative sweep interval"
	case c.batch <= 0 || c.concurrency <= 0:
		bad = fmt.Sprintf("batch size %d and concurrency %d must be positive", c.batch, c.concurrency)
	case c.log == nil:
		bad = "nil logger"
	}
	r := &Relay{pool: pool, routes: make(map[string]Sender, len(routes)), cfg: c}
	for name, s := range routes {
		switch {
		case name == "" || len(name) > MaxDestinationLen || !clean(name):
			bad = fmt.Sprintf("destination name %q: want 1 to %d bytes of UTF-8 without control characters", name, MaxDestinationLen)
		case s == nil:
			bad = fmt.Sprintf("nil Sender for destination %q", name)
		}
		r.routes[name] = s
		r.dests = append(r.dests, name)
	}
	if bad != "" {
		return nil, invalidf("%s", bad)
	}
	slices.Sort(r.dests)
	r.claim = claimQuery(c.anyOrder)
	return r, nil
}

// claimQuery returns the statement that claims a batch: the unsent rows
// that are due, of the relay's destinations, in id order, each the first
// unsent row of its destination and key (unless anyOrder), locked for the
// claiming transaction; rows locked by another relay are skipped.
func claimQuery(anyOrder bool) string {
	q := `SELECT o.id, o.destination, o.key, o.payload, o.headers::text, o.attempts
FROM idem_outbox o
WHERE o.sent_at IS NULL AND o.next_at <= now() AND o.destination = ANY($1)`
	if !anyOrder {
		q += `
  AND NOT EXISTS (SELECT 1 FROM idem_outbox p
    WHERE p.destination = o.destination AND p.key = o.key AND p.sent_at IS NULL AND p.id < o.id)`
	}
	return q + `
ORDER BY o.id LIMIT $2
FOR UPDATE OF o SKIP LOCKED`
}

// message is a claimed row.
type message struct {
	id       int64
	dest     string
	key      string
	payload  []byte
	headers  map[string]string
	attempts int
}

// Send sends the rows that are due (never sent, or whose backoff after a
// failed send ended), batch after batch, until none is left or a send
// failed, and returns how many the brokers confirmed. Each batch is one
// transaction: it claims the rows (FOR UPDATE SKIP LOCKED), sends them,
// marks the confirmed ones sent and, for each failed one, counts the
// failure, keeps the error and sets its backoff (WithBackoff), then
// commits. If the relay dies before the commit, the rows stay unsent and
// are sent again (the consumer deduplicates them by key).
//
// Order: a row is claimed only when no earlier row (smaller id) of its
// destination and key is unsent, and stays locked until the broker
// confirmed it and it is marked sent. So a row published by a transaction
// that began after another row of the same destination and key committed
// is sent only after the broker confirmed that row, whichever relays send
// them; a row whose send fails holds back the later rows of its key until
// it is sent. Rows of transactions that ran at the same time have no order
// between them (a row may be sent before one with a smaller id whose
// transaction had not committed yet).
//
// The error reports the failed sends (the rows stay unsent) or a failed
// statement (the batch is sent again later); ErrNoTable when the table
// does not exist.
func (r *Relay) Send(ctx context.Context) (int, error) {
	total := 0
	for {
		n, full, err := r.batch(ctx)
		total += n
		if err != nil || !full {
			return total, err
		}
	}
}

// batch claims, sends and marks one batch; full reports a full batch that
// was all sent.
func (r *Relay) batch(ctx context.Context) (sent int, full bool, err error) {
	tx, err := r.pool.Begin(ctx)
	if err != nil {
		return 0, false, relayErr(err)
	}
	defer tx.Rollback(context.WithoutCancel(ctx))
	msgs, err := r.claimBatch(ctx, tx)
	if err != nil || len(msgs) == 0 {
		return 0, false, err
	}
	errs := r.sendAll(ctx, msgs)

	// The broker has what it confirmed: record it even if ctx ended.
	mctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), markTimeout)
	defer cancel()
	var ok, failed []int64
	var reasons []string
	var delays []int64
	var failures []error
	for i, m := range msgs {
		switch {
		case errs[i] == nil:
			ok = append(ok, m.id)
		case ctx.Err() != nil:
			// Cut short by the relay's own end: not the message's failure.
		default:
			failed = append(failed, m.id)
			reasons = append(reasons, truncate(errs[i].Error()))
			delays = append(delays, r.backoff(m.attempts).Microseconds())
			failures = append(failures, fmt.Errorf("row %d to %q: %w", m.id, m.dest, errs[i]))
		}
	}
	if len(ok) > 0 {
		if _, err := tx.Exec(mctx, `UPDATE idem_outbox SET sent_at = now() WHERE id = ANY($1)`, ok); err != nil {
			return 0, false, relayErr(err)
		}
	}
	if len(failed) > 0 {
		if _, err := tx.Exec(mctx, `UPDATE idem_outbox AS o
SET attempts = o.attempts + 1, last_error = f.reason, next_at = now() + f.delay * interval '1 microsecond'
FROM unnest($1::bigint[], $2::text[], $3::bigint[]) AS f(id, reason, delay)
WHERE o.id = f.id`, failed, reasons, delays); err != nil {
			return 0, false, relayErr(err)
		}
	}
	if err := tx.Commit(mctx); err != nil {
		return 0, false, relayErr(err)
	}
	switch {
	case len(failures) > 0:
		return len(ok), false, fmt.Errorf("pgoutbox: %d of %d messages not sent: %w", len(msgs)-len(ok), len(msgs), errors.Join(failures...))
	case len(ok) < len(msgs): // the rest were cut short by ctx
		return len(ok), false, fmt.Errorf("pgoutbox: %d of %d messages not sent: %w", len(msgs)-len(ok), len(msgs), context.Cause(ctx))
	}
	return len(ok), len(msgs) == r.cfg.batch, nil
}

// claimBatch claims the rows of one batch in tx.
func (r *Relay) claimBatch(ctx context.Context, tx pgx.Tx) ([]message, error) {
	rows, err := tx.Query(ctx, r.claim, r.dests, r.cfg.batch)
	if err != nil {
		return nil, relayErr(err)
	}
	defer rows.Close()
	var msgs []message
	for rows.Next() {
		var m message
		var h string
		if err := rows.Scan(&m.id, &m.dest, &m.key, &m.payload, &h, &m.attempts); err != nil {
			return nil, relayErr(err)
		}
		if h != "{}" {
			if err := json.Unmarshal([]byte(h), &m.headers); err != nil {
				return nil, fmt.Errorf("pgoutbox: row %d: headers: %w", m.id, err)
			}
		}
		msgs = append(msgs, m)
	}
	if err := rows.Err(); err != nil {
		return nil, relayErr(err)
	}
	return msgs, nil
}

// sendAll sends msgs, WithConcurrency at a time, and returns each one's
// error.
func (r *Relay) sendAll(ctx context.Context, msgs []message) []error {
	errs := make([]error, len(msgs))
	sem := make(chan struct{}, r.cfg.concurrency)
	var wg sync.WaitGroup
	for i := range msgs {
		sem <- struct{}{}
		wg.Add(1)
		go func() {
			defer func() { <-sem; wg.Done() }()
			errs[i] = r.sendOne(ctx, &msgs[i])
		}()
	}
	wg.Wait()
	return errs
}

// sendOne sends m through its destination's Sender, within the send
// timeout; a panic of the Sender is its error.
func (r *Relay) sendOne(ctx context.Context, m *message) (err error) {
	ctx, cancel := context.WithTimeout(ctx, r.cfg.sendTimeout)
	defer cancel()
	defer func() {
		if p := recover(); p != nil {
			err = fmt.Errorf("pgoutbox: the sender panicked: %v", p)
		}
	}()
	return r.routes[m.dest].Send(ctx, m.key, m.payload, m.headers)
}

// backoff returns the wait after the failure that follows attempts earlier
// failures.
func (r *Relay) backoff(attempts int) time.Duration {
	d := r.cfg.minBackoff
	for i := 0; i < attempts && d < r.cfg.maxBackoff; i++ {
		d *= 2
	}
	return min(d, r.cfg.maxBackoff)
}

// Sweep deletes the rows sent longer ago than the retention (WithRetention),
// in batches of the batch size, oldest first, and returns how many it
// deleted. Unsent rows are never deleted. Sweep is safe for concurrent
// use, also from several processes.
func (r *Relay) Sweep(ctx context.Context) (int, error) {
	total := 0
	for {
		tag, err := r.pool.Exec(ctx, `DELETE FROM idem_outbox WHERE id IN (
  SELECT id FROM idem_outbox WHERE sent_at < now() - $1 * interval '1 microsecond' ORDER BY sent_at LIMIT $2 FOR UPDATE SKIP LOCKED)`,
			r.cfg.retention.Microseconds(), r.cfg.batch)
		total += int(tag.RowsAffected())
		if err != nil {
			return total, relayErr(err)
		}
		if tag.RowsAffected() < int64(r.cfg.batch) {
			return total, nil
		}
	}
}

// Run sends (Send) and sweeps (Sweep) until ctx is cancelled, then returns
// nil. It sends again at once after a full batch, and otherwise waits the
// interval (WithInterval); it sweeps at start and every sweep interval
// (WithSweepInterval). Failed sends and failed statements are logged
// (WithLogger) and tried again: Run never stops on them.
func (r *Relay) Run(ctx context.Context) error {
	var sweepC <-chan time.Time
	if r.cfg.sweepInterval > 0 {
		t := time.NewTicker(r.cfg.sweepInterval)
		defer t.Stop()
		sweepC = t.C
		r.sweepLogged(ctx)
	}
	wait := time.NewTimer(0)
	defer wait.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-sweepC:
			r.sweepLogged(ctx)
		case <-wait.C:
			if _, err := r.Send(ctx); err != nil && ctx.Err() == nil {
				r.cfg.log.Warn("pgoutbox: relay", "error", err)
			}
			wait.Reset(r.cfg.interval)
		}
	}
}

func (r *Relay) sweepLogged(ctx context.Context) {
	if _, err := r.Sweep(ctx); err != nil && ctx.Err() == nil {
		r.cfg.log.Warn("pgoutbox: janitor", "error", err)
	}
}

func relayErr(err error) error {
	if pgq.Code(err) == pgq.UndefinedTable {
		return fmt.Errorf("%w: %w", ErrNoTable, err)
	}
	return fmt.Errorf("pgoutbox: relay: %w", err)
}

func truncate(s string) string {
	if len(s) <= maxErrorLen {
		return s
	}
	i := maxErrorLen
	for i > 0 && s[i]&0xC0 == 0x80 { // not in the middle of a rune
		i--
	}
	return s[:i] + "…"
}
