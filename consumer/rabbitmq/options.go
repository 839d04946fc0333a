package rabbitmq

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"strconv"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/idemgo/idem/consumer"
)

// Defaults of the Consumer's options.
const (
	DefaultScope           = "rabbitmq"
	DefaultBatchSize       = 32
	DefaultPrefetch        = 64
	DefaultMaxDelay        = 5 * time.Second
	DefaultShutdownTimeout = 10 * time.Second
	DefaultMinBackoff      = 100 * time.Millisecond
	DefaultMaxBackoff      = 10 * time.Second
	DefaultPublishTimeout  = 10 * time.Second
)

// Header names the Consumer reads and writes.
const (
	// HeaderDeliveries counts the failed attempts of a message: the
	// Consumer sets it on each copy it publishes to the retry queue after a
	// handler or store error (not after an in-progress duplicate).
	HeaderDeliveries = "x-idem-deliveries"
	// HeaderError holds the reason of a dead-lettered message.
	HeaderError = "x-idem-error"
	// HeaderQueue holds the queue a dead-lettered message came from.
	HeaderQueue = "x-idem-queue"
)

// KeyFunc returns the idempotency key of a delivery; "" means the message
// has none (it is dead-lettered with consumer.ErrNoKey). It must be safe for
// concurrent use.
type KeyFunc func(d *amqp.Delivery) string

// MessageIDKey is the default KeyFunc: the delivery's message-id property.
func MessageIDKey(d *amqp.Delivery) string { return d.MessageId }

// KeyHeader returns a KeyFunc that reads the header name. String, []byte and
// integer values are used as they are; a missing header or another type
// means no key.
func KeyHeader(name string) KeyFunc {
	return func(d *amqp.Delivery) string {
		switch v := d.Headers[name].(type) {
		case string:
			return v
		case []byte:
			return string(v)
		case int, int8, int16, int32, int64, uint8, uint16, uint32, uint64:
			return fmt.Sprint(v)
		default:
			return ""
		}
	}
}

// BodyHashKey is a KeyFunc that uses the hex SHA-256 of the body: use it
// when the payload itself identifies the operation and carries nothing
// that changes between retries of the producer (timestamps, nonces). An
// empty body has no key.
func BodyHashKey(d *amqp.Delivery) string {
	if len(d.Body) == 0 {
		return ""
	}
	sum := sha256.Sum256(d.Body)
	return hex.EncodeToString(sum[:])
}

// Option configures a Consumer: the options of package consumer shared by
// every adapter (consumer.WithScope, consumer.WithMaxDeliveries,
// consumer.WithRetryDelay, consumer.WithBatchSize, consumer.WithConcurrency,
// consumer.WithShutdownTimeout, consumer.WithDeadLetter,
// consumer.WithLogger, consumer.WithEventHook, consumer.WithOnLeaseLost,
// consumer.WithPassDuplicates) and this package's own.
//
// For RabbitMQ: the default scope is DefaultScope ("rabbitmq"); the batch
// size is the largest batch handed to one consumer.Processor call, default
// DefaultBatchSize (32), a batch being whatever is buffered when its first
// message arrives (see WithBatchWait); the concurrency is how many batches
// are processed at once on the channel, default 1 (above 1, each batch is
// acknowledged message by message instead of with one multiple ack); the
// shutdown timeout, default DefaultShutdownTimeout (10s), must be
// positive; the dead-letter destination is the name of the queue that the
// Consumer declares and publishes dead letters to, through the default
// exchange, default the queue's name followed by ".dlq" (see also
// WithDeadLetterExchange).
type Option = consumer.Option

type config struct {
	key            KeyFunc
	fingerprint    func(d *amqp.Delivery) string
	batchWait      time.Duration
	prefetch       int
	retryQueue     string
	dlExchange     string
	dlKey          string
	dlDeclare      bool
	queueArgs      amqp.Table
	maxDelay       time.Duration
	minBackoff     time.Duration
	maxBackoff     time.Duration
	publishTimeout time.Duration
	amqpConfig     amqp.Config
	consumerTag    string
}

// WithKeyFunc sets how the idempotency key is read from a delivery. The
// default is MessageIDKey (the message-id property). See also KeyHeader and
// BodyHashKey.
func WithKeyFunc(f KeyFunc) Option { return consumer.AdapterOption(func(c *config) { c.key = f }) }

// WithKeyHeader reads the idempotency key from the header name; it is
// WithKeyFunc(KeyHeader(name)).
func WithKeyHeader(name string) Option {
	return consumer.AdapterOption(func(c *config) {
		if name == "" {
			c.key = nil // reported by New
			return
		}
		c.key = KeyHeader(name)
	})
}

// WithFingerprint sets a function returning the payload fingerprint of a
// delivery (at most storekit.MaxFingerprintLen bytes): a key seen again with
// another fingerprint is dead-lettered with idem.ErrMismatch. The default is
// none (no fingerprint check).
func WithFingerprint(f func(d *amqp.Delivery) string) Option {
	return consumer.AdapterOption(func(c *config) { c.fingerprint = f })
}

// WithBatchWait sets how long to wait for a batch to fill once its first
// message arrived. The default is no wait: a batch is whatever is buffered
// when the first message arrives.
func WithBatchWait(d time.Duration) Option {
	return consumer.AdapterOption(func(c *config) { c.batchWait = d })
}

// WithPrefetch sets the channel's prefetch count (basic.qos): how many
// unacknowledged deliveries the broker sends ahead. It should be at least
// the batch size. The default is DefaultPrefetch (64); 0 means unlimited.
func WithPrefetch(n int) Option { return consumer.AdapterOption(func(c *config) { c.prefetch = n }) }

// WithRetryQueue sets the name of the retry queue that the Consumer
// declares (see the package documentation). The default is the queue's
// name followed by ".retry".
func WithRetryQueue(name string) Option {
	return consumer.AdapterOption(func(c *config) { c.retryQueue = name })
}

// WithDeadLetterExchange makes the Consumer publish dead letters to
// exchange with routingKey instead of its own dead-letter queue
// (consumer.WithDeadLetter). The exchange and its bindings are not
// declared: they must exist and route the message somewhere, or RabbitMQ
// drops it (confirms do not tell an unroutable message apart).
func WithDeadLetterExchange(exchange, routingKey string) Option {
	return consumer.AdapterOption(func(c *config) { c.dlExchange, c.dlKey, c.dlDeclare = exchange, routingKey, false })
}

// WithQueueArgs sets the arguments the main queue is declared with (for
// example amqp.Table{"x-queue-type": "quorum"}). They must match those of
// an existing queue. The default is none.
func WithQueueArgs(args amqp.Table) Option {
	return consumer.AdapterOption(func(c *config) { c.queueArgs = args })
}

// WithMaxDelay caps the redelivery delay of a Retry. An in-progress
// duplicate is asked to wait for the rest of the owner's lease, which is
// usually much longer than the owner's handler; a capped delay brings it
// back sooner, and it is only retried again if the key is still in
// progress. The default is DefaultMaxDelay (5s).
func WithMaxDelay(d time.Duration) Option {
	return consumer.AdapterOption(func(c *config) { c.maxDelay = d })
}

// WithBackoff sets the reconnection backoff: it starts at min and doubles
// up to max after each failed attempt, with jitter. The default is
// DefaultMinBackoff (100ms) and DefaultMaxBackoff (10s).
func WithBackoff(min, max time.Duration) Option {
	return consumer.AdapterOption(func(c *config) { c.minBackoff, c.maxBackoff = min, max })
}

// WithPublishTimeout bounds the wait for the broker's confirmation of a
// retry or dead-letter publish. The default is DefaultPublishTimeout (10s).
func WithPublishTimeout(d time.Duration) Option {
	return consumer.AdapterOption(func(c *config) { c.publishTimeout = d })
}

// WithAMQPConfig sets the configuration the connection is dialled with
// (TLS, SASL, heartbeat, a custom Dial). The default is amqp.Config with a
// 10s heartbeat.
func WithAMQPConfig(cfg amqp.Config) Option {
	return consumer.AdapterOption(func(c *config) { c.amqpConfig = cfg })
}

// WithConsumerTag sets the consumer tag. The default is "" (the broker
// picks one).
func WithConsumerTag(tag string) Option {
	return consumer.AdapterOption(func(c *config) { c.consumerTag = tag })
}

func defaultConfig(queue string) config {
	return config{
		key:            MessageIDKey,
		prefetch:       DefaultPrefetch,
		retryQueue:     queue + ".retry",
		dlKey:          queue + ".dlq",
		dlDeclare:      true,
		maxDelay:       DefaultMaxDelay,
		minBackoff:     DefaultMinBackoff,
		maxBackoff:     DefaultMaxBackoff,
		publishTimeout: DefaultPublishTimeout,
		amqpConfig:     amqp.Config{Heartbeat: 10 * time.Second, Locale: "en_US"},
	}
}

func (c *config) validate(queue string, shared consumer.Config) error {
	if shared.DeadLetter != "" {
		c.dlExchange, c.dlKey, c.dlDeclare = "", shared.DeadLetter, true
	}
	switch {
	case c.key == nil:
		return invalidf("nil key function or empty key header")
	case c.batchWait < 0:
		return invalidf("batch wait %v is negative", c.batchWait)
	case c.prefetch < 0:
		return invalidf("prefetch %d is negative", c.prefetch)
	case c.retryQueue == "" || c.retryQueue == queue:
		return invalidf("retry queue %q must be named and differ from the queue", c.retryQueue)
	case c.dlDeclare && (c.dlKey == "" || c.dlKey == queue || c.dlKey == c.retryQueue):
		return invalidf("dead-letter queue %q must be named and differ from the queue and the retry queue", c.dlKey)
	case !c.dlDeclare && c.dlExchange == "" && c.dlKey == "":
		return invalidf("dead-letter exchange and routing key are both empty")
	case c.maxDelay < time.Millisecond:
		return invalidf("max delay %v is below 1ms", c.maxDelay)
	case shared.ShutdownTimeout <= 0:
		return invalidf("shutdown timeout %v is not positive", shared.ShutdownTimeout)
	case c.minBackoff <= 0 || c.maxBackoff < c.minBackoff:
		return invalidf("backoff %v..%v: min must be positive and not above max", c.minBackoff, c.maxBackoff)
	case c.publishTimeout <= 0:
		return invalidf("publish timeout %v is not positive", c.publishTimeout)
	}
	return nil
}

// headerInt reads an integer header written by any client.
func headerInt(h amqp.Table, name string) int {
	switch v := h[name].(type) {
	case int:
		return v
	case int8:
		return int(v)
	case int16:
		return int(v)
	case int32:
		return int(v)
	case int64:
		return int(v)
	case uint8:
		return int(v)
	case uint16:
		return int(v)
	case uint32:
		return int(v)
	case string:
		n, _ := strconv.Atoi(v)
		return n
	default:
		return 0
	}
}

// KeyField returns a KeyFunc that reads the key from the top-level field
// name of the JSON payload (consumer.JSONField).
func KeyField(name string) KeyFunc {
	return func(d *amqp.Delivery) string { return consumer.JSONField(d.Body, name) }
}

// KeyHash returns a KeyFunc whose key is the SHA-256 of the listed
// top-level fields of the JSON payload (consumer.JSONHash): for payloads
// with no key of their own whose listed fields identify the operation.
func KeyHash(fields ...string) KeyFunc {
	return func(d *amqp.Delivery) string { return consumer.JSONHash(d.Body, fields...) }
}
