package rabbitmq

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"runtime"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/idemgo/idem"
	"github.com/idemgo/idem/consumer"
	amqp "github.com/rabbitmq/amqp091-go"
)

// Handler processes one delivery. ctx carries the idempotency lease
// (idem.FenceFrom) and is cancelled if the lease is lost or, during
// shutdown, when the shutdown timeout has passed. Returning nil completes
// the key; an error releases it and the message is redelivered through the
// retry queue (or dead-lettered after the processor's maximum number of
// deliveries, or at once for an error marked with idem.Terminal). The
// handler must not acknowledge the delivery itself.
type Handler func(ctx context.Context, d *amqp.Delivery) error

// Stats are the Consumer's counters: consumer.Stats, the one type of every
// adapter, counted by the processor. Errors counts the copies (retry or
// dead letter) that could not be published, whose original was rejected
// with requeue instead, and lost connections (each followed by a
// reconnection).
type Stats = consumer.Stats

// Consumer consumes one RabbitMQ queue with manual acknowledgements and
// runs a Handler at most once per idempotency key (see the package
// documentation). Create it with New and start it with Run. Stats is safe
// for concurrent use.
type Consumer struct {
	url    string
	queue  string
	proc   *consumer.Processor // nil only in this package's benchmarks
	h      Handler
	cfg    config
	shared consumer.Config

	running atomic.Bool

	batches, plainAcked atomic.Int64 // for the benchmarks
	// settled, if set by a test before Run, is called for every delivery
	// once it is settled on the broker.
	settled func(d *amqp.Delivery, r consumer.Result, requeued bool)
}

// New returns a Consumer of queue on the broker at url (for example
// "amqp://guest:guest@127.0.0.1:5672/"), running h at most once per key on
// exec. It does no I/O; Run connects. It returns an error wrapping
// idem.ErrInvalid for an invalid configuration.
func New(url, queue string, exec *idem.Executor, h Handler, opts ...Option) (*Consumer, error) {
	switch {
	case url == "":
		return nil, invalidf("empty URL")
	case queue == "":
		return nil, invalidf("empty queue name")
	case h == nil:
		return nil, invalidf("nil handler")
	}
	if _, err := amqp.ParseURI(url); err != nil {
		return nil, fmt.Errorf("%w: rabbitmq: %w", idem.ErrInvalid, err)
	}
	cfg := defaultConfig(queue)
	proc, shared, err := consumer.Setup(exec, consumer.Config{
		Scope:           DefaultScope,
		BatchSize:       DefaultBatchSize,
		ShutdownTimeout: DefaultShutdownTimeout,
	}, &cfg, opts)
	if err != nil {
		return nil, err
	}
	if err := cfg.validate(queue, shared); err != nil {
		return nil, err
	}
	if err := proc.Key("k").Validate(); err != nil {
		return nil, fmt.Errorf("rabbitmq: the scope: %w", err)
	}
	return &Consumer{url: url, queue: queue, proc: proc, h: h, cfg: cfg, shared: shared}, nil
}

func invalidf(format string, args ...any) error {
	return fmt.Errorf("%w: rabbitmq: %s", idem.ErrInvalid, fmt.Sprintf(format, args...))
}

// Stats returns the processor's counters.
func (c *Consumer) Stats() Stats {
	if c.proc == nil { // the benchmarks' loop without idempotency
		return Stats{Processed: c.plainAcked.Load()}
	}
	return c.proc.Stats()
}

// Run connects, declares the topology and consumes until ctx is cancelled.
// It reconnects with exponential backoff whenever the connection or the
// channel is lost (logging the cause and counting it in Stats.Errors) and
// re-declares the topology each time.
//
// A refusal that reconnecting cannot heal is a configuration error: Run
// returns it (an error wrapping the broker's *amqp.Error) once the batch in
// flight is settled. These are ACCESS_REFUSED (403: wrong credentials, or
// a permission the user lacks, to declare, consume or publish), NOT_FOUND
// (404: the exchange of WithDeadLetterExchange does not exist), NOT_ALLOWED
// (530: a vhost that does not exist or that the user may not open, and
// also a per-user or per-vhost connection limit reached) and, before
// consuming, PRECONDITION_FAILED (406: a queue, retry queue or dead-letter
// queue that exists with other arguments or properties, an invalid
// argument of WithQueueArgs). Everything else is retried: a lost or
// refused connection, a broker that stops (CONNECTION_FORCED), and a 406
// while consuming (a delivery not acknowledged within the broker's
// consumer_timeout, which a new channel heals).
//
// When ctx is cancelled, Run stops taking deliveries, lets the handlers of
// the batch in flight finish (cancelling their context after the shutdown
// timeout, which releases their keys), settles that batch, closes the
// connection (RabbitMQ requeues the prefetched deliveries that no handler
// saw) and returns nil. A handler that ignores its context's cancellation
// is abandoned consumer.AbandonAfter later: its delivery is retried after
// the rest of its key's lease, the key is left to that lease, and the
// handler's goroutine runs on after Run returned until it returns; what
// it returns then is ignored. So Run returns within about the shutdown
// timeout plus consumer.AbandonAfter, plus the settling of the batch. Run
// may be called only once at a time.
func (c *Consumer) Run(ctx context.Context) error {
	if !c.running.CompareAndSwap(false, true) {
		return errors.New("rabbitmq: Run is already running")
	}
	defer c.running.Store(false)

	// work is the context of handlers and broker calls: it outlives ctx by
	// the shutdown timeout.
	work, stop := consumer.GraceContext(ctx, c.shared.ShutdownTimeout, errShutdownTimeout)
	defer stop()

	backoff := c.cfg.minBackoff
	for {
		if ctx.Err() != nil {
			return nil
		}
		consumed, err := c.session(ctx, work)
		if ctx.Err() != nil {
			return nil
		}
		if configError(err, !consumed) {
			return err
		}
		if c.proc != nil && err != nil {
			c.proc.ReportError("connection lost, reconnecting", err)
		}
		if consumed {
			backoff = c.cfg.minBackoff
		}
		sleep := backoff/2 + rand.N(backoff/2+1)
		backoff = min(2*backoff, c.cfg.maxBackoff)
		t := time.NewTimer(sleep)
		select {
		case <-ctx.Done():
			t.Stop()
			return nil
		case <-t.C:
		}
	}
}

// session runs one connection until it fails or ctx is cancelled. consumed
// reports whether it got as far as consuming.
func (c *Consumer) session(ctx, work context.Context) (consumed bool, err error) {
	conn, err := amqp.DialConfig(c.url, c.cfg.amqpConfig)
	if err != nil {
		return false, fmt.Errorf("rabbitmq: dial: %w", err)
	}
	defer conn.Close()
	ch, err := conn.Channel()
	if err != nil {
		return false, fmt.Errorf("rabbitmq: open channel: %w", err)
	}
	closed := ch.NotifyClose(make(chan *amqp.Error, 1))
	if err := c.declare(ch); err != nil {
		return false, err
	}
	if err := ch.Qos(c.cfg.prefetch, 0, false); err != nil {
		return false, fmt.Errorf("rabbitmq: qos: %w", err)
	}
	if err := ch.Confirm(false); err != nil {
		return false, fmt.Errorf("rabbitmq: confirm mode: %w", err)
	}
	deliveries, err := ch.Consume(c.queue, c.cfg.consumerTag, false, false, false, false, nil)
	if err != nil {
		return false, fmt.Errorf("rabbitmq: consume %q: %w", c.queue, err)
	}
	// Batches in flight on other goroutines (WithConcurrency) end before
	// the connection closes.
	var wg sync.WaitGroup
	defer wg.Wait()
	slots := make(chan struct{}, c.shared.Concurrency)
	failed := make(chan error, 1)
	serial := c.shared.Concurrency == 1
	batch := make([]amqp.Delivery, 0, c.shared.BatchSize)
	for {
		if serial {
			batch = batch[:0]
		} else {
			batch = make([]amqp.Delivery, 0, c.shared.BatchSize)
		}
		if ctx.Err() != nil {
			return true, nil
		}
		select {
		case <-ctx.Done():
			return true, nil
		case e := <-closed:
			return true, channelClosed(e)
		case err := <-failed:
			return true, withCloseReason(closed, err)
		case d, ok := <-deliveries:
			if !ok {
				return true, consumerEnded(closed)
			}
			batch = append(batch, d)
		}
		batch = c.fill(ctx, deliveries, batch)
		if serial {
			if err := c.handle(work, ch, batch, true); err != nil {
				return true, withCloseReason(closed, err)
			}
			continue
		}
		select {
		case slots <- struct{}{}:
		case err := <-failed:
			return true, withCloseReason(closed, err)
		case <-ctx.Done():
			return true, nil // batch was not handled: requeued on close
		}
		b := batch // batch is replaced by the next iteration
		wg.Go(func() {
			defer func() { <-slots }()
			if err := c.handle(work, ch, b, false); err != nil {
				select {
				case failed <- err:
				default:
				}
			}
		})
	}
}

// consumerEnded is the error of a delivery channel that was closed: the
// channel closed, or the broker cancelled the consumer (the queue was
// deleted, a quorum queue's leader moved) while the channel stays open.
func consumerEnded(closed <-chan *amqp.Error) error {
	if e, ok := closeReason(closed); ok {
		return channelClosed(e)
	}
	return errors.New("rabbitmq: the broker cancelled the consumer")
}

// withCloseReason adds to err, the error of a call on a channel the client
// found closed, why the broker closed it, first (a publish to an exchange
// that does not exist fails its confirmation, and the next call finds the
// channel closed by a NOT_FOUND).
func withCloseReason(closed <-chan *amqp.Error, err error) error {
	if !errors.Is(err, amqp.ErrClosed) {
		return err
	}
	if e, ok := closeReason(closed); ok && e != nil {
		return errors.Join(channelClosed(e), err)
	}
	return err
}

// closeReason waits up to a second for why the channel closed: the client
// marks a channel closed before it tells its NotifyClose listeners, so the
// call that fails on it, or the end of the deliveries, can come first.
func closeReason(closed <-chan *amqp.Error) (*amqp.Error, bool) {
	t := time.NewTimer(time.Second)
	defer t.Stop()
	select {
	case e := <-closed:
		return e, true
	case <-t.C:
		return nil, false
	}
}

// configError reports whether err, the error of a session, is a
// configuration error, which reconnecting cannot heal (see Run): a refusal
// the broker sent (ACCESS_REFUSED, NOT_FOUND, NOT_ALLOWED, and
// PRECONDITION_FAILED during setup, before consuming), or the client's
// amqp.ErrCredentials or amqp.ErrSASL (the broker closed the socket at the
// login, which it does only for those). A 406 while consuming is not one:
// RabbitMQ closes the channel with it when a delivery outlives its
// consumer_timeout.
func configError(err error, setup bool) bool {
	if errors.Is(err, amqp.ErrCredentials) || errors.Is(err, amqp.ErrSASL) {
		return true
	}
	var e *amqp.Error
	if !errors.As(err, &e) || !e.Server {
		return false
	}
	switch e.Code {
	case amqp.AccessRefused, amqp.NotFound, amqp.NotAllowed:
		return true
	case amqp.PreconditionFailed:
		return setup
	}
	return false
}

func channelClosed(e *amqp.Error) error {
	if e == nil {
		return errors.New("rabbitmq: channel closed")
	}
	return fmt.Errorf("rabbitmq: channel closed: %w", e)
}

// fill adds to batch what is buffered, or arrives within the batch wait,
// up to the batch size.
func (c *Consumer) fill(ctx context.Context, deliveries <-chan amqp.Delivery, batch []amqp.Delivery) []amqp.Delivery {
	var timeout <-chan time.Time
	if c.cfg.batchWait > 0 {
		t := time.NewTimer(c.cfg.batchWait)
		defer t.Stop()
		timeout = t.C
	}
	for yields := 0; len(batch) < c.shared.BatchSize; {
		select {
		case d, ok := <-deliveries:
			if !ok {
				return batch
			}
			batch = append(batch, d)
			yields = 0
			continue
		default:
		}
		if timeout == nil {
			// amqp091 hands deliveries over from its own buffer through an
			// unbuffered channel: let its goroutine run before deciding that
			// nothing more is buffered.
			if yields < 3 {
				yields++
				runtime.Gosched()
				continue
			}
			return batch
		}
		select {
		case d, ok := <-deliveries:
			if !ok {
				return batch
			}
			batch = append(batch, d)
		case <-timeout:
			return batch
		case <-ctx.Done():
			return batch
		}
	}
	return batch
}

// declare declares the queue, the retry queue and the dead-letter queue.
func (c *Consumer) declare(ch *amqp.Channel) error {
	if _, err := ch.QueueDeclare(c.queue, true, false, false, false, c.cfg.queueArgs); err != nil {
		return fmt.Errorf("rabbitmq: declare queue %q: %w", c.queue, err)
	}
	retryArgs := amqp.Table{
		"x-dead-letter-exchange":    "",
		"x-dead-letter-routing-key": c.queue,
	}
	if _, err := ch.QueueDeclare(c.cfg.retryQueue, true, false, false, false, retryArgs); err != nil {
		return fmt.Errorf("rabbitmq: declare retry queue %q: %w", c.cfg.retryQueue, err)
	}
	if c.cfg.dlDeclare {
		if _, err := ch.QueueDeclare(c.cfg.dlKey, true, false, false, false, nil); err != nil {
			return fmt.Errorf("rabbitmq: declare dead-letter queue %q: %w", c.cfg.dlKey, err)
		}
	}
	return nil
}

// deliveries is how often the message failed before (the header kept by
// the retry path), plus the broker's own redelivery count on quorum queues,
// plus this delivery.
func deliveries(d *amqp.Delivery) int {
	return 1 + headerInt(d.Headers, HeaderDeliveries) + headerInt(d.Headers, "x-delivery-count")
}

// handle processes a batch and settles every delivery on the broker. An
// error means the channel is unusable; the deliveries not settled are
// requeued by RabbitMQ when the connection closes.
func (c *Consumer) handle(work context.Context, ch *amqp.Channel, batch []amqp.Delivery, multiple bool) error {
	c.batches.Add(1)
	msgs := make([]consumer.Message, len(batch))
	for i := range batch {
		d := &batch[i]
		msgs[i] = consumer.Message{Key: c.cfg.key(d), Deliveries: deliveries(d)}
		if c.cfg.fingerprint != nil {
			msgs[i].Fingerprint = c.cfg.fingerprint(d)
		}
	}
	var results []consumer.Result
	if c.proc != nil {
		results = c.proc.Process(work, msgs, func(ctx context.Context, i int) error {
			return c.h(ctx, &batch[i])
		})
	} else {
		results = c.processRaw(work, msgs, batch)
	}
	return c.settle(work, ch, batch, results, multiple)
}

// processRaw is the same loop without idempotency, for the benchmarks.
func (c *Consumer) processRaw(ctx context.Context, msgs []consumer.Message, batch []amqp.Delivery) []consumer.Result {
	results := make([]consumer.Result, len(msgs))
	for i := range msgs {
		if err := c.h(ctx, &batch[i]); err != nil {
			results[i] = consumer.Result{Action: consumer.Retry, Delay: time.Second, Err: err}
			continue
		}
		results[i] = consumer.Result{Action: consumer.Ack}
	}
	return results
}

// settle carries out the results: it publishes the retry and dead-letter
// copies, waits for their confirmations, then acknowledges the originals
// (or rejects them with requeue when a copy failed).
func (c *Consumer) settle(work context.Context, ch *amqp.Channel, batch []amqp.Delivery, results []consumer.Result, multiple bool) error {
	// Settle even when the handlers' context was cancelled at shutdown: the
	// keys are released, the copies must reach the retry queue.
	pctx, cancel := context.WithTimeout(context.WithoutCancel(work), c.cfg.publishTimeout)
	defer cancel()
	confirms := make([]*amqp.DeferredConfirmation, len(batch))
	var perr error
	for i, r := range results {
		if r.Action == consumer.Ack {
			continue
		}
		if perr != nil {
			break // the channel is gone: stop publishing, ack nothing more
		}
		exchange, key, msg := c.copyOf(&batch[i], r)
		confirms[i], perr = ch.PublishWithDeferredConfirmWithContext(pctx, exchange, key, false, false, msg)
	}
	allAck := perr == nil
	requeue := make([]bool, len(batch))
	for i, r := range results {
		if r.Action == consumer.Ack {
			continue
		}
		ok := false
		if confirms[i] != nil {
			ok, _ = confirms[i].WaitContext(pctx)
		}
		if !ok {
			requeue[i], allAck = true, false
		}
	}
	if perr != nil {
		return fmt.Errorf("rabbitmq: publish: %w", perr)
	}
	if multiple && allAck && len(batch) > 0 {
		// Batches are processed one at a time, so every earlier delivery on
		// this channel is settled already: one multiple ack covers the
		// batch.
		if err := ch.Ack(batch[len(batch)-1].DeliveryTag, true); err != nil {
			return fmt.Errorf("rabbitmq: ack: %w", err)
		}
	} else {
		for i := range batch {
			var err error
			if requeue[i] {
				err = ch.Nack(batch[i].DeliveryTag, false, true)
			} else {
				err = ch.Ack(batch[i].DeliveryTag, false)
			}
			if err != nil {
				return fmt.Errorf("rabbitmq: ack: %w", err)
			}
		}
	}
	for i, r := range results {
		c.count(r, requeue[i])
		if c.settled != nil {
			c.settled(&batch[i], r, requeue[i])
		}
	}
	return nil
}

func (c *Consumer) count(r consumer.Result, requeued bool) {
	switch {
	case c.proc == nil:
		if r.Action == consumer.Ack {
			c.plainAcked.Add(1)
		}
	case requeued:
		c.proc.ReportError("publishing a "+r.Action.String()+" copy; requeued", r.Err)
	}
}

// copyOf returns where to publish the retry or dead-letter copy of d, and
// the copy.
func (c *Consumer) copyOf(d *amqp.Delivery, r consumer.Result) (exchange, key string, msg amqp.Publishing) {
	headers := make(amqp.Table, len(d.Headers)+2)
	for k, v := range d.Headers {
		headers[k] = v
	}
	// The broker's count of this copy's deliveries: the new copy starts
	// again, and HeaderDeliveries carries the count on.
	if n := headerInt(d.Headers, "x-delivery-count"); n > 0 {
		delete(headers, "x-delivery-count")
		headers[HeaderDeliveries] = int64(headerInt(d.Headers, HeaderDeliveries) + n)
	}
	msg = amqp.Publishing{
		Headers:         headers,
		ContentType:     d.ContentType,
		ContentEncoding: d.ContentEncoding,
		DeliveryMode:    d.DeliveryMode,
		Priority:        d.Priority,
		CorrelationId:   d.CorrelationId,
		ReplyTo:         d.ReplyTo,
		MessageId:       d.MessageId,
		Timestamp:       d.Timestamp,
		Type:            d.Type,
		AppId:           d.AppId,
		Body:            d.Body,
	}
	if r.Action == consumer.DeadLetter {
		if r.Err != nil {
			e := r.Err.Error()
			if len(e) > 1024 {
				e = e[:1024]
			}
			headers[HeaderError] = e
		}
		headers[HeaderQueue] = c.queue
		return c.cfg.dlExchange, c.cfg.dlKey, msg
	}
	var ip *idem.InProgressError
	if !errors.As(r.Err, &ip) {
		// A failed attempt: count it. An in-progress duplicate did not try.
		headers[HeaderDeliveries] = int64(headerInt(headers, HeaderDeliveries) + 1)
	}
	delay := min(max(r.Delay, time.Millisecond), c.cfg.maxDelay)
	msg.Expiration = strconv.FormatInt(delay.Milliseconds(), 10)
	return "", c.cfg.retryQueue, msg
}

// errShutdownTimeout is the cause of the cancellation of the handlers'
// contexts when the shutdown timeout passed.
var errShutdownTimeout = errors.New("rabbitmq: shutdown timeout passed")
