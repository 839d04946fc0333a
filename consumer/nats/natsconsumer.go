package natsconsumer

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/idemgo/idem"
	"github.com/idemgo/idem/consumer"
)

// Defaults of the Consumer's options.
const (
	DefaultScope           = "nats"
	DefaultKeyHeader       = jetstream.MsgIDHeader // "Nats-Msg-Id"
	DefaultBatchSize       = 100
	DefaultFetchMaxWait    = time.Second
	DefaultShutdownTimeout = 10 * time.Second
	DefaultDeadLetterWait  = 5 * time.Second
	// DefaultDeadLetterPrefix is put before the original subject to form the
	// dead-letter subject unless consumer.WithDeadLetter is given.
	DefaultDeadLetterPrefix = "dlq."
)

// Headers set on a dead-lettered message, in addition to the original
// message's headers (its Nats-Msg-Id is moved to HeaderOriginalMsgID).
const (
	HeaderReason           = "Idem-Dead-Letter-Reason"
	HeaderOriginalSubject  = "Idem-Original-Subject"
	HeaderOriginalStream   = "Idem-Original-Stream"
	HeaderOriginalSequence = "Idem-Original-Sequence"
	HeaderOriginalMsgID    = "Idem-Original-Msg-Id"
	HeaderDeliveries       = "Idem-Deliveries"
)

// ErrStopped is returned by Run when it was stopped by its context: the
// loop drained or released its in-flight messages.
var ErrStopped = errors.New("natsconsumer: stopped")

// errShutdown is the cause given to handlers cancelled by the shutdown
// timeout.
var errShutdown = errors.New("natsconsumer: shutdown timeout reached")

// Handler processes one message. ctx carries the idempotency lease
// (idem.FenceFrom, idem.LeaseFrom) and is cancelled when the lease is lost
// or the shutdown timeout is reached. A nil error completes the message's
// key and acknowledges the message; an error releases the key and has the
// message redelivered (an error marked with idem.Terminal dead-letters it at
// once). A panic is recovered and treated as an error. Handlers of one Run
// loop are called one at a time.
type Handler func(ctx context.Context, msg jetstream.Msg) error

// KeyFunc returns the idempotency key of a message; "" means the message has
// none (it is dead-lettered and counted in Stats.Invalid).
type KeyFunc func(msg jetstream.Msg) string

// Option configures a Consumer: the options of package consumer shared by
// every adapter (consumer.WithScope, consumer.WithMaxDeliveries,
// consumer.WithRetryDelay, consumer.WithBatchSize,
// consumer.WithShutdownTimeout, consumer.WithDeadLetter,
// consumer.WithLogger, consumer.WithEventHook, consumer.WithOnLeaseLost,
// consumer.WithPassDuplicates) and this package's own.
//
// For NATS: the default scope is DefaultScope ("nats"); the batch size is
// how many messages one Fetch asks for, default DefaultBatchSize (100), a
// fetched batch going to one consumer.Processor call; the shutdown timeout
// is how long Run, once its context is done, lets the handlers of the
// in-flight batch finish, default DefaultShutdownTimeout (10s); the
// dead-letter destination is a subject, default DefaultDeadLetterPrefix +
// the message's subject ("dlq.orders.created" for "orders.created"). A
// stream must capture the dead-letter subject: the publish waits for the
// stream's acknowledgement before the original is terminated, and fails
// (the message is redelivered) otherwise. Each Run goroutine processes one
// batch at a time: for concurrency, call Run from several goroutines.
type Option = consumer.Option

type config struct {
	key         KeyFunc
	fingerprint func(jetstream.Msg) string
	maxWait     time.Duration
	dlqWait     time.Duration
	heartbeat   time.Duration
}

// WithKeyHeader takes the idempotency key from the header name. The
// default is the Nats-Msg-Id header (DefaultKeyHeader), JetStream's own
// publish deduplication ID: the adapter then extends JetStream's duplicate
// window (2 minutes by default) to the idempotency record's retention and to
// redeliveries, which the server-side window does not cover.
func WithKeyHeader(name string) Option { return consumer.AdapterOption(withKeyHeader(name)) }

func withKeyHeader(name string) func(*config) {
	return func(c *config) {
		c.key = KeyHeader(name)
		if name == "" {
			c.key = nil
		}
	}
}

// WithKeyFunc takes the idempotency key from f, for example a field of the
// payload or a hash of a stable part of it. It replaces WithKeyHeader.
func WithKeyFunc(f KeyFunc) Option { return consumer.AdapterOption(func(c *config) { c.key = f }) }

// WithFingerprint sets a function returning a fingerprint of the message's
// payload: a message whose key was seen with another fingerprint is
// dead-lettered with idem.ErrMismatch. The default is no fingerprint (any
// payload matches).
func WithFingerprint(f func(msg jetstream.Msg) string) Option {
	return consumer.AdapterOption(func(c *config) { c.fingerprint = f })
}

// WithFetchMaxWait sets how long one Fetch waits for a full batch. The
// default is DefaultFetchMaxWait (1s).
func WithFetchMaxWait(d time.Duration) Option {
	return consumer.AdapterOption(func(c *config) { c.maxWait = d })
}

// WithDeadLetterTimeout bounds the wait for the dead-letter publish
// acknowledgement. The default is DefaultDeadLetterWait (5s).
func WithDeadLetterTimeout(d time.Duration) Option {
	return consumer.AdapterOption(func(c *config) { c.dlqWait = d })
}

// WithProgressInterval sets how often the messages of the in-flight batch
// are marked in progress (msg.InProgress) while their handlers run, which
// resets the server's AckWait timer. The default is a third of the
// consumer's AckWait.
func WithProgressInterval(d time.Duration) Option {
	return consumer.AdapterOption(func(c *config) { c.heartbeat = d })
}

// Stats are the counters of a Consumer: consumer.Stats, the one type of
// every adapter. Errors counts failed Ack, Nak, InProgress, Term or
// dead-letter publishes (the server redelivers the message after AckWait).
type Stats = consumer.Stats

// Consumer consumes a JetStream pull consumer through a consumer.Processor:
// one handler execution per message key, acknowledgement only after the key
// is COMPLETED. Its methods are safe for concurrent use; Run may be called
// from several goroutines (each runs its own fetch loop).
type Consumer struct {
	js     jetstream.JetStream
	cons   jetstream.Consumer
	proc   *consumer.Processor
	h      Handler
	cfg    config
	shared consumer.Config
	maxDl  int // the server's MaxDeliver, or 0
}

// New returns a Consumer of cons, a pull consumer with explicit
// acknowledgement, running h at most once per key on exec. js publishes
// dead letters.
//
// cons should have MaxDeliver -1 (unlimited): consumer.WithMaxDeliveries
// decides when a failing message is dead-lettered. If cons has a MaxDeliver
// limit, a message on its last delivery that would be retried is
// dead-lettered instead, because the server would never deliver it again.
//
// It returns an error wrapping idem.ErrInvalid for a nil argument, an
// invalid option or a consumer without explicit acknowledgement.
func New(js jetstream.JetStream, cons jetstream.Consumer, exec *idem.Executor, h Handler, opts ...Option) (*Consumer, error) {
	switch {
	case js == nil:
		return nil, fmt.Errorf("%w: natsconsumer: nil JetStream", idem.ErrInvalid)
	case cons == nil:
		return nil, fmt.Errorf("%w: natsconsumer: nil consumer", idem.ErrInvalid)
	case h == nil:
		return nil, fmt.Errorf("%w: natsconsumer: nil handler", idem.ErrInvalid)
	}
	cfg := config{maxWait: DefaultFetchMaxWait, dlqWait: DefaultDeadLetterWait}
	withKeyHeader(DefaultKeyHeader)(&cfg)
	proc, shared, err := consumer.Setup(exec, consumer.Config{
		Scope:           DefaultScope,
		BatchSize:       DefaultBatchSize,
		ShutdownTimeout: DefaultShutdownTimeout,
	}, &cfg, opts)
	if err != nil {
		return nil, err
	}
	if shared.Concurrency != 1 {
		return nil, fmt.Errorf("%w: natsconsumer: concurrency %d: call Run from several goroutines instead", idem.ErrInvalid, shared.Concurrency)
	}
	info := cons.CachedInfo()
	if info == nil {
		return nil, fmt.Errorf("%w: natsconsumer: consumer has no cached info", idem.ErrInvalid)
	}
	ackWait := info.Config.AckWait
	if ackWait <= 0 {
		ackWait = 30 * time.Second // the server's default
	}
	if cfg.heartbeat == 0 {
		cfg.heartbeat = ackWait / 3
	}
	switch {
	case info.Config.AckPolicy != jetstream.AckExplicitPolicy:
		return nil, fmt.Errorf("%w: natsconsumer: consumer %q has ack policy %v, want explicit", idem.ErrInvalid, info.Name, info.Config.AckPolicy)
	case cfg.key == nil:
		return nil, fmt.Errorf("%w: natsconsumer: nil key function or empty key header", idem.ErrInvalid)
	case cfg.maxWait < 10*time.Millisecond:
		return nil, fmt.Errorf("%w: natsconsumer: fetch max wait %v is below 10ms", idem.ErrInvalid, cfg.maxWait)
	case cfg.dlqWait <= 0:
		return nil, fmt.Errorf("%w: natsconsumer: dead-letter timeout %v is not positive", idem.ErrInvalid, cfg.dlqWait)
	case cfg.heartbeat <= 0 || cfg.heartbeat >= ackWait:
		return nil, fmt.Errorf("%w: natsconsumer: progress interval %v must be positive and below AckWait %v", idem.ErrInvalid, cfg.heartbeat, ackWait)
	}
	c := &Consumer{js: js, cons: cons, proc: proc, h: h, cfg: cfg, shared: shared}
	if info.Config.MaxDeliver > 0 {
		c.maxDl = info.Config.MaxDeliver
	}
	return c, nil
}

// Stats returns a snapshot of the counters: the processor's.
func (c *Consumer) Stats() Stats { return c.proc.Stats() }

// Run fetches batches and processes them until ctx is done, then lets the
// in-flight batch finish (its handlers are cancelled after the shutdown
// timeout, and their keys released), negatively acknowledges messages
// whose fetch was still under way, and returns ErrStopped. A handler that
// ignores its context's cancellation is abandoned consumer.AbandonAfter
// later: its message is naked (delayed by the rest of the lease), its key
// left to its lease, and its goroutine runs on after Run returned until
// it returns; what it returns then is ignored. So Run returns within about
// the shutdown timeout plus consumer.AbandonAfter. It returns
// another error only when fetching fails for good (the consumer or stream
// was deleted, the connection closed). Fetch errors that can heal (a
// timeout, a leader change) are retried.
func (c *Consumer) Run(ctx context.Context) error {
	for {
		if ctx.Err() != nil {
			return ErrStopped
		}
		msgs, err := c.fetch(ctx)
		if err != nil {
			if ctx.Err() != nil {
				c.nakAll(msgs)
				return ErrStopped
			}
			if fatal(err) {
				c.nakAll(msgs)
				return fmt.Errorf("natsconsumer: fetch: %w", err)
			}
		}
		if len(msgs) == 0 {
			if err != nil {
				// Do not spin on a failing server.
				select {
				case <-ctx.Done():
				case <-time.After(100 * time.Millisecond):
				}
			}
			continue
		}
		if ctx.Err() != nil {
			c.nakAll(msgs)
			return ErrStopped
		}
		c.ProcessBatch(ctx, msgs)
	}
}

// fatal reports whether a fetch error will not heal by retrying.
func fatal(err error) bool {
	return errors.Is(err, jetstream.ErrConsumerDeleted) ||
		errors.Is(err, jetstream.ErrConsumerNotFound) ||
		errors.Is(err, jetstream.ErrStreamNotFound) ||
		errors.Is(err, nats.ErrConnectionClosed) ||
		errors.Is(err, jetstream.ErrMsgIteratorClosed)
}

// fetch returns one batch; on an error it may also return messages that
// were received before it.
func (c *Consumer) fetch(ctx context.Context) ([]jetstream.Msg, error) {
	fctx, cancel := context.WithTimeout(ctx, c.cfg.maxWait)
	defer cancel()
	batch, err := c.cons.Fetch(c.shared.BatchSize, jetstream.FetchContext(fctx))
	if err != nil {
		return nil, err
	}
	msgs := make([]jetstream.Msg, 0, c.shared.BatchSize)
	for m := range batch.Messages() {
		msgs = append(msgs, m)
	}
	err = batch.Error()
	if errors.Is(err, context.DeadlineExceeded) || errors.Is(err, nats.ErrTimeout) {
		err = nil
	}
	return msgs, err
}

// nakAll has msgs, fetched as Run stopped, redelivered at once.
func (c *Consumer) nakAll(msgs []jetstream.Msg) {
	for _, m := range msgs {
		r := consumer.Result{Action: consumer.Retry, Err: ErrStopped}
		if err := m.Nak(); err != nil {
			c.proc.ReportError("nak at stop", err)
			r.Err = errors.Join(r.Err, fmt.Errorf("natsconsumer: %v: %w", r.Action, err))
		}
	}
}

// ProcessBatch processes msgs, fetched by the caller from the consumer
// given to New, with one consumer.Processor.Process call, and acknowledges,
// negatively acknowledges (with the Result's delay) or dead-letters each.
// While it runs, every message of the batch is marked in progress at the
// progress interval. Once ctx is done the handlers still get the shutdown
// timeout to finish. Run calls it; it is exported for callers with their
// own fetch loop.
func (c *Consumer) ProcessBatch(ctx context.Context, msgs []jetstream.Msg) {
	if len(msgs) == 0 {
		return
	}
	in := make([]consumer.Message, len(msgs))
	for i, m := range msgs {
		in[i].Key = c.cfg.key(m)
		if c.cfg.fingerprint != nil {
			in[i].Fingerprint = c.cfg.fingerprint(m)
		}
		if md, err := m.Metadata(); err == nil {
			in[i].Deliveries = int(min(md.NumDelivered, 1<<31-1))
			in[i].Last = c.maxDl > 0 && in[i].Deliveries >= c.maxDl
		}
	}

	// Handlers run on a context that survives ctx by the shutdown timeout.
	hctx, stopShutdown := consumer.GraceContext(ctx, c.shared.ShutdownTimeout, errShutdown)
	defer stopShutdown()

	// Keep the server's AckWait timer from expiring while the batch runs.
	stopProgress := consumer.KeepAlive(c.cfg.heartbeat, func() {
		for _, m := range msgs {
			if err := m.InProgress(); err != nil {
				c.proc.ReportError("in progress", err)
			}
		}
	})
	results := c.proc.Process(hctx, in, func(ctx context.Context, i int) error { return c.h(ctx, msgs[i]) })
	stopProgress()
	for i, r := range results {
		c.settle(msgs[i], in[i], r)
	}
}

// settle maps one Result to the broker and reports the outcome to the
// result hook.
func (c *Consumer) settle(m jetstream.Msg, in consumer.Message, r consumer.Result) {
	var berr error // the broker call's error
	switch r.Action {
	case consumer.Ack:
		berr = m.Ack()
	case consumer.DeadLetter:
		if err := c.deadLetter(m, in, r.Err); err != nil {
			// Not dead-lettered: have it come back and try again.
			c.proc.ReportError("dead-letter publish", err)
			r = consumer.Result{Action: consumer.Retry, Delay: time.Second, Err: errors.Join(r.Err, err)}
			berr = m.NakWithDelay(r.Delay)
			break
		}
		berr = m.Term()
	default: // consumer.Retry
		berr = m.NakWithDelay(r.Delay)
	}
	if berr != nil {
		c.proc.ReportError(r.Action.String(), berr)
		r.Err = errors.Join(r.Err, fmt.Errorf("natsconsumer: %v: %w", r.Action, berr))
	}
}

// deadLetter publishes m to the dead-letter subject and waits for the
// stream's acknowledgement.
func (c *Consumer) deadLetter(m jetstream.Msg, in consumer.Message, cause error) error {
	subject := c.shared.DeadLetter
	if subject == "" {
		subject = DefaultDeadLetterPrefix + m.Subject()
	}
	out := nats.NewMsg(subject)
	out.Data = m.Data()
	for k, v := range m.Headers() {
		out.Header[k] = append([]string(nil), v...)
	}
	if id := out.Header.Get(jetstream.MsgIDHeader); id != "" {
		out.Header.Set(HeaderOriginalMsgID, id)
	}
	reason := "unknown"
	if cause != nil {
		reason = cause.Error()
	}
	out.Header.Set(HeaderReason, reason)
	out.Header.Set(HeaderOriginalSubject, m.Subject())
	out.Header.Set(HeaderDeliveries, strconv.Itoa(in.Deliveries))
	if md, err := m.Metadata(); err == nil {
		out.Header.Set(HeaderOriginalStream, md.Stream)
		out.Header.Set(HeaderOriginalSequence, strconv.FormatUint(md.Sequence.Stream, 10))
		// The same delivery dead-lettered twice (a crash between the
		// publish and Term) is deduplicated by the dead-letter stream.
		out.Header.Set(jetstream.MsgIDHeader, "idem-dlq:"+md.Stream+":"+strconv.FormatUint(md.Sequence.Stream, 10))
	} else {
		out.Header.Del(jetstream.MsgIDHeader)
	}
	ctx, cancel := context.WithTimeout(context.Background(), c.cfg.dlqWait)
	defer cancel()
	if _, err := c.js.PublishMsg(ctx, out); err != nil {
		return fmt.Errorf("natsconsumer: dead-letter publish to %q: %w", subject, err)
	}
	return nil
}

// KeyHeader returns a KeyFunc that reads the key from the header name.
func KeyHeader(name string) KeyFunc {
	return func(m jetstream.Msg) string { return m.Headers().Get(name) }
}

// KeyField returns a KeyFunc that reads the key from the top-level field
// name of the JSON payload (consumer.JSONField).
func KeyField(name string) KeyFunc {
	return func(m jetstream.Msg) string { return consumer.JSONField(m.Data(), name) }
}

// KeyHash returns a KeyFunc whose key is the SHA-256 of the listed
// top-level fields of the JSON payload (consumer.JSONHash): for payloads
// with no key of their own whose listed fields identify the operation.
func KeyHash(fields ...string) KeyFunc {
	return func(m jetstream.Msg) string { return consumer.JSONHash(m.Data(), fields...) }
}
