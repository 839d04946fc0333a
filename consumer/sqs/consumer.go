package sqsconsumer

import (
	"context"
	"errors"
	"fmt"
	"math"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/sqs"
	"github.com/aws/aws-sdk-go-v2/service/sqs/types"

	"github.com/idemgo/idem"
	"github.com/idemgo/idem/consumer"
)

// API is the part of *sqs.Client the Consumer uses. *sqs.Client implements
// it; tests may wrap it to inject faults.
type API interface {
	ReceiveMessage(ctx context.Context, in *sqs.ReceiveMessageInput, optFns ...func(*sqs.Options)) (*sqs.ReceiveMessageOutput, error)
	DeleteMessageBatch(ctx context.Context, in *sqs.DeleteMessageBatchInput, optFns ...func(*sqs.Options)) (*sqs.DeleteMessageBatchOutput, error)
	ChangeMessageVisibilityBatch(ctx context.Context, in *sqs.ChangeMessageVisibilityBatchInput, optFns ...func(*sqs.Options)) (*sqs.ChangeMessageVisibilityBatchOutput, error)
	SendMessage(ctx context.Context, in *sqs.SendMessageInput, optFns ...func(*sqs.Options)) (*sqs.SendMessageOutput, error)
}

var _ API = (*sqs.Client)(nil)

// Handler processes one message. ctx carries the idempotency lease
// (idem.FenceFrom) and is cancelled if the lease is lost or the shutdown
// timeout passes. A nil error completes the key and deletes the message; an
// error releases the key and the message is received again after the retry
// delay (or dead-lettered after MaxDeliveries, or at once for an error
// marked with idem.Terminal). A panic is recovered as the message's error
// (consumer.ErrPanic).
type Handler func(ctx context.Context, m types.Message) error

// Attributes set on messages sent to the dead-letter queue, in addition to
// the message's own attributes (while the message has fewer than ten).
const (
	// AttrDeadLetterReason holds why the message was dead-lettered.
	AttrDeadLetterReason = "idem-dead-letter-reason"
	// AttrSourceMessageID holds the message's id on the source queue.
	AttrSourceMessageID = "idem-source-message-id"
)

// Stats are the Consumer's counters: consumer.Stats, the one type of every
// adapter, counted by its Processor. Errors counts failed broker calls and
// entries (receive, delete, visibility change, dead-letter send).
type Stats = consumer.Stats

// Consumer receives messages from one SQS queue and runs a Handler at most
// once per message key. Create it with New and start it with Run. Its
// methods are safe for concurrent use.
type Consumer struct {
	client   API
	queueURL string
	dlqURL   string
	h        Handler
	proc     *consumer.Processor
	cfg      config
	shared   consumer.Config

	running atomic.Bool
	// plain skips the Processor: the same loop without idempotency, for
	// the benchmark's baseline (set by export_test.go only).
	plain bool

	plainAcked atomic.Int64 // the benchmarks' loop without idempotency
}

// New returns a Consumer of the queue at queueURL that runs h with exec's
// guarantees and sends dead letters to the queue at deadLetterURL. It
// returns an error wrapping idem.ErrInvalid for a nil client, executor or
// handler, an empty URL or an invalid option.
//
// Dead letters are sent by the Consumer (SendMessage to deadLetterURL, then
// DeleteMessageBatch), not left to the queue's redrive policy: messages
// without a key and key mismatches are dead-lettered at their first
// receive, which a redrive policy cannot do.
func New(client API, queueURL, deadLetterURL string, exec *idem.Executor, h Handler, opts ...Option) (*Consumer, error) {
	c := &Consumer{client: client, queueURL: queueURL, dlqURL: deadLetterURL, h: h}
	c.cfg = config{
		key:               DefaultKey,
		visibility:        DefaultVisibilityTimeout,
		waitTime:          DefaultWaitTime,
		messageAttributes: []string{"All"},
	}
	proc, shared, err := consumer.Setup(exec, consumer.Config{
		Scope:           queueURL,
		MaxDeliveries:   DefaultMaxDeliveries,
		RetryDelay:      DefaultRetryDelay,
		BatchSize:       DefaultBatchSize,
		Concurrency:     DefaultConcurrency,
		ShutdownTimeout: DefaultShutdownTimeout,
	}, &c.cfg, opts)
	if err != nil {
		return nil, err
	}
	c.proc, c.shared = proc, shared
	if err := c.validate(client); err != nil {
		return nil, err
	}
	return c, nil
}

func invalid(format string, args ...any) error {
	return fmt.Errorf("%w: sqsconsumer: %s", idem.ErrInvalid, fmt.Sprintf(format, args...))
}

func wholeSeconds(d time.Duration) bool { return d%time.Second == 0 }

func (c *Consumer) validate(client API) error {
	cfg, shared := &c.cfg, &c.shared
	switch {
	case client == nil:
		return invalid("nil SQS client")
	case shared.DeadLetter != "":
		return invalid("the dead-letter queue URL is New's argument, not consumer.WithDeadLetter")
	case c.h == nil:
		return invalid("nil handler")
	case c.queueURL == "":
		return invalid("empty queue URL")
	case c.dlqURL == "":
		return invalid("empty dead-letter queue URL")
	case c.dlqURL == c.queueURL:
		return invalid("the dead-letter queue is the queue itself")
	case cfg.key == nil:
		return invalid("nil key function")
	case shared.Scope == "":
		return invalid("empty scope")
	case shared.BatchSize > maxBatch:
		return invalid("batch size %d is not in 1..%d", shared.BatchSize, maxBatch)
	case cfg.visibility < 3*time.Second || cfg.visibility > 12*time.Hour || !wholeSeconds(cfg.visibility):
		return invalid("visibility timeout %v is not a whole number of seconds in 3s..12h", cfg.visibility)
	case cfg.waitTime < 0 || cfg.waitTime > 20*time.Second || !wholeSeconds(cfg.waitTime):
		return invalid("wait time %v is not a whole number of seconds in 0..20s", cfg.waitTime)
	case shared.RetryDelay > 12*time.Hour:
		return invalid("retry delay %v is not in 0..12h", shared.RetryDelay)
	}
	return nil
}

// Stats returns a snapshot of the counters.
func (c *Consumer) Stats() Stats {
	st := c.proc.Stats()
	st.Processed += c.plainAcked.Load()
	return st
}

// Processor returns the consumer.Processor that runs the handlers.
func (c *Consumer) Processor() *consumer.Processor { return c.proc }

// Run receives and processes messages until ctx is cancelled, then stops
// receiving (a pending long poll is cancelled), waits for the batches in
// flight, at most the shutdown timeout, and returns nil. After the timeout
// the handlers' contexts are cancelled: their messages are released and
// made visible after the retry delay. A handler that ignores the
// cancellation is abandoned consumer.AbandonAfter later
// (consumer.ErrAbandoned): its message is made visible after the rest of
// its key's lease, the key is left to that lease (IN_PROGRESS, no longer
// extended, then taken over with a higher fence by the redelivery), and
// the handler's goroutine runs on after Run returned until it returns;
// what it returns then is ignored. So Run returns within about the
// shutdown timeout plus consumer.AbandonAfter. Receive errors are logged, counted in
// Stats.Errors and retried with a backoff. Run returns an error if the
// Consumer is already running.
func (c *Consumer) Run(ctx context.Context) error {
	if !c.running.CompareAndSwap(false, true) {
		return errors.New("sqsconsumer: Run called while running")
	}
	defer c.running.Store(false)

	// Handlers run with work, which outlives ctx by the shutdown timeout.
	work, stop := consumer.GraceContext(ctx, c.shared.ShutdownTimeout, errShutdownTimeout)
	defer stop()

	var wg sync.WaitGroup
	for range c.shared.Concurrency {
		wg.Go(func() { c.loop(ctx, work) })
	}
	wg.Wait()
	return nil
}

func (c *Consumer) brokerErr(op string, err error) {
	c.proc.ReportError(op, err)
}

func (c *Consumer) loop(ctx, work context.Context) {
	backoff := 100 * time.Millisecond
	for ctx.Err() == nil {
		msgs, err := c.receive(ctx)
		if err != nil && ctx.Err() == nil {
			c.brokerErr("receive", err)
			select {
			case <-ctx.Done():
			case <-time.After(backoff):
			}
			backoff = min(2*backoff, 5*time.Second)
		} else if err == nil {
			backoff = 100 * time.Millisecond
		}
		if len(msgs) > 0 {
			c.process(work, msgs)
		}
	}
}

// receive fills one batch: the first call waits up to the wait time, the
// next ones (for batches above ten) do not wait.
func (c *Consumer) receive(ctx context.Context) ([]types.Message, error) {
	var out []types.Message
	wait := int32(c.cfg.waitTime / time.Second)
	for len(out) < c.shared.BatchSize {
		n := min(c.shared.BatchSize-len(out), 10)
		res, err := c.client.ReceiveMessage(ctx, &sqs.ReceiveMessageInput{
			QueueUrl:            &c.queueURL,
			MaxNumberOfMessages: int32(n),
			VisibilityTimeout:   int32(c.cfg.visibility / time.Second),
			WaitTimeSeconds:     wait,
			MessageSystemAttributeNames: []types.MessageSystemAttributeName{
				types.MessageSystemAttributeNameApproximateReceiveCount,
				types.MessageSystemAttributeNameMessageDeduplicationId,
			},
			MessageAttributeNames: c.cfg.messageAttributes,
		})
		if err != nil {
			// Messages received so far are processed; the others were
			// not received, or come back after the visibility timeout.
			return out, err
		}
		out = append(out, res.Messages...)
		if len(res.Messages) < n {
			break
		}
		wait = 0
	}
	return out, nil
}

// deliveries returns the message's ApproximateReceiveCount (0 if absent).
func deliveries(m types.Message) int {
	n, _ := strconv.Atoi(m.Attributes[string(types.MessageSystemAttributeNameApproximateReceiveCount)])
	return n
}

// process runs one batch through the Processor and applies the results.
func (c *Consumer) process(ctx context.Context, msgs []types.Message) {
	in := make([]consumer.Message, len(msgs))
	for i, m := range msgs {
		in[i] = consumer.Message{Key: c.cfg.key(m), Deliveries: deliveries(m)}
		if c.cfg.fingerprint != nil {
			in[i].Fingerprint = c.cfg.fingerprint(m)
		}
	}

	// Keep the batch invisible while it is processed.
	stopExtend := c.extend(ctx, msgs)
	process := c.proc.Process
	if c.plain {
		process = plainProcess
	}
	results := process(ctx, in, func(hctx context.Context, i int) error { return c.h(hctx, msgs[i]) })
	stopExtend()

	// Broker calls must happen even during shutdown.
	bctx := context.WithoutCancel(ctx)
	var del []types.Message
	retry := map[int32][]types.Message{}
	for i, r := range results {
		m := msgs[i]
		switch r.Action {
		case consumer.Ack:
			del = append(del, m)
			if c.plain {
				c.plainAcked.Add(1)
			}
		case consumer.Retry:
			s := seconds(r.Delay)
			retry[s] = append(retry[s], m)
		case consumer.DeadLetter:
			if err := c.deadLetter(bctx, m, r.Err); err != nil {
				// Not dead-lettered: it must come back, the record
				// decides again then.
				c.brokerErr("dead-letter send", err)
				s := seconds(c.shared.RetryDelay)
				retry[s] = append(retry[s], m)
				continue
			}
			del = append(del, m)
		}
	}
	c.deleteBatch(bctx, del)
	for s, ms := range retry {
		c.changeVisibility(bctx, ms, s)
	}
}

// seconds rounds d up to whole seconds, within SQS's 0..12h.
func seconds(d time.Duration) int32 {
	s := math.Ceil(d.Seconds())
	return int32(min(max(s, 0), 43200))
}

// extend renews the visibility of msgs every third of the visibility
// timeout until the returned function is called; that function returns
// once no renewal is in flight, so that a later visibility change (the
// retry delay) is not overwritten.
func (c *Consumer) extend(ctx context.Context, msgs []types.Message) (stop func()) {
	return consumer.KeepAlive(c.cfg.visibility/3, func() {
		c.changeVisibility(context.WithoutCancel(ctx), msgs, int32(c.cfg.visibility/time.Second))
	})
}

// chunks calls f with msgs ten at a time, the limit of SQS batch calls.
func chunks(msgs []types.Message, f func([]types.Message)) {
	for len(msgs) > 0 {
		n := min(len(msgs), 10)
		f(msgs[:n])
		msgs = msgs[n:]
	}
}

func (c *Consumer) deleteBatch(ctx context.Context, msgs []types.Message) {
	chunks(msgs, func(ms []types.Message) {
		entries := make([]types.DeleteMessageBatchRequestEntry, len(ms))
		for i, m := range ms {
			entries[i] = types.DeleteMessageBatchRequestEntry{Id: aws.String(strconv.Itoa(i)), ReceiptHandle: m.ReceiptHandle}
		}
		res, err := c.client.DeleteMessageBatch(ctx, &sqs.DeleteMessageBatchInput{QueueUrl: &c.queueURL, Entries: entries})
		if err != nil {
			// The messages come back after their visibility timeout and
			// are replayed (their keys are COMPLETED).
			c.brokerErr("delete", err)
			return
		}
		for _, f := range res.Failed {
			c.brokerErr("delete", batchError(f))
		}
	})
}

func (c *Consumer) changeVisibility(ctx context.Context, msgs []types.Message, secs int32) {
	chunks(msgs, func(ms []types.Message) {
		entries := make([]types.ChangeMessageVisibilityBatchRequestEntry, len(ms))
		for i, m := range ms {
			entries[i] = types.ChangeMessageVisibilityBatchRequestEntry{
				Id: aws.String(strconv.Itoa(i)), ReceiptHandle: m.ReceiptHandle, VisibilityTimeout: secs,
			}
		}
		res, err := c.client.ChangeMessageVisibilityBatch(ctx, &sqs.ChangeMessageVisibilityBatchInput{QueueUrl: &c.queueURL, Entries: entries})
		if err != nil {
			// The messages come back after their visibility timeout.
			c.brokerErr("change visibility", err)
			return
		}
		for _, f := range res.Failed {
			c.brokerErr("change visibility", batchError(f))
		}
	})
}

// BatchEntryError is a failed entry of a DeleteMessageBatch or
// ChangeMessageVisibilityBatch call, as logged.
type BatchEntryError struct {
	Code, Message string
}

// Error returns the entry's SQS error code and message.
func (e *BatchEntryError) Error() string { return e.Code + ": " + e.Message }

func batchError(f types.BatchResultErrorEntry) error {
	return &BatchEntryError{Code: aws.ToString(f.Code), Message: aws.ToString(f.Message)}
}

// deadLetter sends a copy of m to the dead-letter queue.
func (c *Consumer) deadLetter(ctx context.Context, m types.Message, reason error) error {
	attrs := make(map[string]types.MessageAttributeValue, len(m.MessageAttributes)+2)
	for k, v := range m.MessageAttributes {
		attrs[k] = v
	}
	// SQS allows ten message attributes.
	if reason != nil && len(attrs) < 10 {
		attrs[AttrDeadLetterReason] = types.MessageAttributeValue{DataType: aws.String("String"), StringValue: aws.String(truncate(reason.Error(), 1024))}
	}
	if m.MessageId != nil && len(attrs) < 10 {
		attrs[AttrSourceMessageID] = types.MessageAttributeValue{DataType: aws.String("String"), StringValue: m.MessageId}
	}
	body := m.Body
	if aws.ToString(body) == "" {
		body = aws.String(" ") // SQS rejects an empty body
	}
	_, err := c.client.SendMessage(ctx, &sqs.SendMessageInput{QueueUrl: &c.dlqURL, MessageBody: body, MessageAttributes: attrs})
	return err
}

func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n]
}

// plainProcess runs every handler and acknowledges the successes, without
// idempotency: the benchmark's baseline.
func plainProcess(ctx context.Context, msgs []consumer.Message, h consumer.Handler) []consumer.Result {
	res := make([]consumer.Result, len(msgs))
	for i := range msgs {
		if err := h(ctx, i); err != nil {
			res[i] = consumer.Result{Action: consumer.Retry, Err: err}
			continue
		}
		res[i] = consumer.Result{Action: consumer.Ack}
	}
	return res
}

// errShutdownTimeout is the cause of the cancellation of the handlers'
// contexts when the shutdown timeout passed.
var errShutdownTimeout = errors.New("sqsconsumer: shutdown timeout passed")
