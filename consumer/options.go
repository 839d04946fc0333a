package consumer

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/idemgo/idem"
	"github.com/idemgo/idem/adapterkit"
)

// Option configures a Processor and every broker adapter: the five
// adapters take the same ...consumer.Option after (broker handles, exec,
// handler), so an option of the same meaning has one name and one
// implementation, here. An adapter's own options (its key extractor,
// fingerprint, broker settings) are built with AdapterOption; given to
// another adapter or to New, they make the constructor fail.
type Option func(*Config)

// Config is what options set: the settings shared by every adapter, and
// the adapter's own (Adapter). Adapters read it in their constructor
// through Setup; applications set it through options.
type Config struct {
	// Scope of message keys (WithScope).
	Scope string
	// MaxDeliveries before a failing message is dead-lettered
	// (WithMaxDeliveries); 0 means never.
	MaxDeliveries int
	// RetryDelay before a failed message is delivered again (WithRetryDelay).
	RetryDelay time.Duration
	// MaxRetryDelay bounds the exponential backoff of handler failures
	// (WithRetryBackoff); 0 means none.
	MaxRetryDelay time.Duration
	// BatchSize is how many messages are processed at once (WithBatchSize).
	BatchSize int
	// Concurrency is how many batches are processed at the same time
	// (WithConcurrency).
	Concurrency int
	// ParallelHandlers is how many handlers of one batch run at the same
	// time (WithParallelHandlers); 1 runs them in order.
	ParallelHandlers int
	// ShutdownTimeout bounds the wait for in-flight handlers once Run's
	// context is done (WithShutdownTimeout).
	ShutdownTimeout time.Duration
	// DeadLetter names the dead-letter destination: a Kafka topic, a NATS
	// subject, a RabbitMQ queue, an SQS queue URL, a Redis stream
	// (WithDeadLetter). Empty means the adapter's default.
	DeadLetter string
	// Logger of the Processor and the adapter (WithLogger).
	Logger *slog.Logger
	// EventHook is called once per message (WithEventHook).
	EventHook func(Event)
	// OnLeaseLost is the compensation hook (WithOnLeaseLost).
	OnLeaseLost func(context.Context, idem.LeaseLost)
	// PassDuplicates passes COMPLETED duplicates to the handler
	// (WithPassDuplicates).
	PassDuplicates bool
	// Commit completes the handled keys of a batch (WithCommit).
	Commit CommitFunc
	// CompleteEach completes each key as soon as its handler returned
	// (WithCompleteEach).
	CompleteEach bool
	// Gathered starts every handler of a batch at once for Gather
	// (WithGatheredHandlers).
	Gathered bool
	// Adapter holds the adapter's own settings (a pointer), for its
	// options made with AdapterOption; nil for a bare Processor.
	Adapter any

	err error
}

// AdapterOption returns an option that sets an adapter's own settings, of
// type *T. Given to a constructor whose Config.Adapter is not a *T (another
// adapter, or New), it makes the constructor fail with idem.ErrInvalid.
func AdapterOption[T any](f func(*T)) Option {
	return func(c *Config) {
		t, ok := c.Adapter.(*T)
		if !ok {
			c.err = errors.Join(c.err, fmt.Errorf("%w: consumer: option of another adapter (%T)", idem.ErrInvalid, (*T)(nil)))
			return
		}
		f(t)
	}
}

// Setup applies opts over defaults, with adapter as Config.Adapter,
// validates the shared settings and returns the Processor on exec and the
// resulting Config. Adapters call it in their constructor, with their own
// defaults; fields left zero in defaults get the Processor's defaults
// (max deliveries 5, retry delay 1s, batch size 1, concurrency 1, parallel
// handlers 1, shutdown timeout 30s, slog.Default()). Errors wrap idem.ErrInvalid.
func Setup(exec *idem.Executor, defaults Config, adapter any, opts []Option) (*Processor, Config, error) {
	c := defaults
	c.Adapter = adapter
	if c.Scope == "" {
		c.Scope = "consumer"
	}
	if c.MaxDeliveries == 0 {
		c.MaxDeliveries = 5
	}
	if c.RetryDelay == 0 {
		c.RetryDelay = time.Second
	}
	if c.BatchSize == 0 {
		c.BatchSize = 1
	}
	if c.Concurrency == 0 {
		c.Concurrency = 1
	}
	if c.ParallelHandlers == 0 {
		c.ParallelHandlers = 1
	}
	if c.ShutdownTimeout == 0 {
		c.ShutdownTimeout = 30 * time.Second
	}
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
	for _, o := range opts {
		o(&c)
	}
	var bad string
	switch {
	case c.err != nil:
		return nil, c, c.err
	case exec == nil:
		bad = "nil executor"
	case c.MaxDeliveries < 0:
		bad = fmt.Sprintf("max deliveries %d is negative", c.MaxDeliveries)
	case c.RetryDelay < 0:
		bad = fmt.Sprintf("retry delay %v is negative", c.RetryDelay)
	case c.BatchSize < 1:
		bad = fmt.Sprintf("batch size %d is not positive", c.BatchSize)
	case c.Concurrency < 1:
		bad = fmt.Sprintf("concurrency %d is not positive", c.Concurrency)
	case c.MaxRetryDelay < 0:
		bad = fmt.Sprintf("maximum retry delay %v is negative", c.MaxRetryDelay)
	case c.ParallelHandlers < 1:
		bad = fmt.Sprintf("parallel handlers %d is not positive", c.ParallelHandlers)
	case c.ShutdownTimeout < 0:
		bad = fmt.Sprintf("shutdown timeout %v is negative", c.ShutdownTimeout)
	case c.Logger == nil:
		bad = "nil logger"
	}
	if bad != "" {
		return nil, c, fmt.Errorf("%w: consumer: %s", idem.ErrInvalid, bad)
	}
	p := &Processor{
		exec: exec, scope: c.Scope, maxDeliveries: c.MaxDeliveries, retryDelay: c.RetryDelay,
		commit: c.Commit, onEvent: c.EventHook, log: c.Logger, onLeaseLost: c.OnLeaseLost, passDuplicates: c.PassDuplicates,
		parallel: c.ParallelHandlers, maxRetryDelay: c.MaxRetryDelay, completeEach: c.CompleteEach, gathered: c.Gathered,
		work: make(chan func()),
	}
	if p.commit == nil {
		p.commit = func(ctx context.Context, _ []Message, attempts []*idem.Attempt, values [][]byte) []error {
			return adapterkit.CommitBatch(ctx, exec, attempts, values)
		}
	}
	return p, c, nil
}

// WithScope sets the scope of message keys, for example the topic or queue
// name, so that two consumers with overlapping key spaces do not share
// records. The default is the adapter's name ("consumer" for New).
func WithScope(scope string) Option { return func(c *Config) { c.Scope = scope } }

// WithMaxDeliveries sets after how many deliveries a message whose handler
// keeps failing (or panics) is dead-lettered (its key becomes FAILED).
// Deliveries are the larger of the broker's count (Message.Deliveries) and
// the record's acquisitions in the store, so that a count a restart loses
// in the broker adapter is still found in the store. The default is 5; 0
// means never (a failing message is retried forever).
func WithMaxDeliveries(n int) Option { return func(c *Config) { c.MaxDeliveries = n } }

// WithRetryDelay sets the redelivery delay after a handler or store error
// (a nack delay, a visibility timeout, a pause of the partition, an idle
// time before a claim, as the broker allows). The default is 1s.
func WithRetryDelay(d time.Duration) Option { return func(c *Config) { c.RetryDelay = d } }

// WithRetryBackoff makes the redelivery delay after a handler's failure
// grow exponentially: the retry delay (WithRetryDelay) after the first
// delivery, doubled with each further one (the larger of the broker's
// count and the record's acquisitions), at most max. Store errors and a
// key in progress elsewhere keep their own delays. An adapter applies the
// delay as its broker allows (a NATS or RabbitMQ nack delay, an SQS
// visibility timeout; Kafka and Redis Streams redeliver after their own
// fixed delay or idle time). The default is none: every retry after the
// retry delay.
func WithRetryBackoff(max time.Duration) Option { return func(c *Config) { c.MaxRetryDelay = max } }

// WithBatchSize sets how many messages are handed to the Processor at once
// (acquired together, handled in order, completed together). The default
// is the adapter's.
func WithBatchSize(n int) Option { return func(c *Config) { c.BatchSize = n } }

// WithConcurrency sets how many batches are processed at the same time.
// The default is the adapter's.
func WithConcurrency(n int) Option { return func(c *Config) { c.Concurrency = n } }

// WithParallelHandlers sets how many handlers of one batch run at the same
// time. A batch's keys are distinct (a repeat of a key follows the first
// and does not run), so one key's messages still run one after the other;
// messages of distinct keys no longer run in the broker's order. The keys
// are completed (unless WithCompleteEach), and the messages acknowledged,
// once every handler of the batch returned, as with 1. Handlers, and the hooks (WithOnLeaseLost),
// are then called from up to n goroutines at once: the Processor's
// workers, reused from batch to batch (a fresh goroutine's stack would
// grow again on the way into each handler); a worker idle for 5 seconds
// ends, so workers can outlive Run by that long (WithGatheredHandlers
// runs on them too). The default is 1: in order, one at a time.
func WithParallelHandlers(n int) Option { return func(c *Config) { c.ParallelHandlers = n } }

// WithShutdownTimeout bounds how long Run waits for in-flight handlers
// once its context is done; then their contexts are cancelled, their keys
// released and their messages left for redelivery. A handler that ignores
// the cancellation is abandoned AbandonAfter later (ErrAbandoned): its key
// is left to its lease, its message to a redelivery, and its goroutine runs
// on until it returns; so Run returns within about the shutdown timeout
// plus AbandonAfter. The default is 30s.
func WithShutdownTimeout(d time.Duration) Option { return func(c *Config) { c.ShutdownTimeout = d } }

// WithDeadLetter names where dead-lettered messages go: a Kafka topic, a
// NATS subject, a RabbitMQ queue, an SQS queue URL, a Redis stream. The
// default is the adapter's (see its package documentation).
func WithDeadLetter(name string) Option { return func(c *Config) { c.DeadLetter = name } }

// WithCommit sets how the keys of handled messages are completed (see
// CommitFunc). The default is adapterkit.CommitBatch.
func WithCommit(f CommitFunc) Option { return func(c *Config) { c.Commit = f } }

// WithCompleteEach completes each handled key (through the CommitFunc) as
// soon as its handler returned, rather than once every handler of the
// batch returned: a consumer that crashes in the middle of a batch then
// leaves to be run again only the keys whose handler was running or whose
// completion was on its way, not every key its batch had handled. Handlers
// that return while a completion is on its way share the next commit call,
// so a batch makes between one call (handlers that return together) and
// one per message (WithParallelHandlers 1); a handler's slot is free again
// once its key is completed. Acknowledgements still come after the batch,
// unless the CommitFunc acknowledges with the completion (Redis Streams).
// The default is off: one commit call per batch.
func WithCompleteEach() Option { return func(c *Config) { c.CompleteEach = true } }

// WithGatheredHandlers starts the handlers of every message of a batch
// that is to run at the same time (WithParallelHandlers does not apply)
// and lets them serve their messages together with Gather: one call
// (an HTTP request carrying the batch, a bulk write) for the batch, each
// handler still returning its own message's error. The Processor decides
// each message as before. The default is off.
func WithGatheredHandlers() Option { return func(c *Config) { c.Gathered = true } }

// WithEventHook sets a function called once per message with the
// Processor's decision, for metrics or tracing. It is called from the
// goroutine that processes the batch, in the batch's order, and must not
// block. The default is none.
func WithEventHook(f func(Event)) Option { return func(c *Config) { c.EventHook = f } }

// WithLogger sets the logger of handler panics (ERROR, with the stack),
// dead letters and failed broker calls (WARN) and retries (DEBUG). Records
// carry the key's digest, never the key. The default is slog.Default().
func WithLogger(l *slog.Logger) Option { return func(c *Config) { c.Logger = l } }

// WithOnLeaseLost sets the compensation hook: a function called when a
// handler ran but its lease was lost (another owner took the key over, so
// the message will run again there, with a higher fence), with the key,
// the fence and the handler's error (nil if it succeeded). The message is
// not acknowledged. f can undo the handler's work or flag it; it is
// called after the handler and before the batch's acknowledgements, from
// the goroutine that processes the batch (with WithParallelHandlers, from
// the handler's slot: from up to n goroutines at once). The default is none.
func WithOnLeaseLost(f func(ctx context.Context, l idem.LeaseLost)) Option {
	return func(c *Config) { c.OnLeaseLost = f }
}

// WithPassDuplicates passes a duplicate whose key is COMPLETED to the
// handler instead of acknowledging it silently (Apache Camel's
// skipDuplicate=false): its context says so (DuplicateFrom) and carries the
// stored result; the key is not acquired and the handler's error only
// delays the acknowledgement (Retry). A repeat of a key within the same
// batch is not passed on (it is acknowledged after the first). The default
// is off.
func WithPassDuplicates() Option { return func(c *Config) { c.PassDuplicates = true } }
