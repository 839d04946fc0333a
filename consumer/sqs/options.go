package sqsconsumer

import (
	"crypto/sha256"
	"encoding/hex"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/sqs/types"

	"github.com/idemgo/idem/consumer"
)

// Defaults of the Consumer's options.
const (
	DefaultBatchSize         = 10
	DefaultConcurrency       = 1
	DefaultVisibilityTimeout = 30 * time.Second
	DefaultWaitTime          = 20 * time.Second
	DefaultMaxDeliveries     = 5
	DefaultRetryDelay        = time.Second
	DefaultShutdownTimeout   = 30 * time.Second
	// DefaultKeyAttribute is the message attribute read by the default key
	// extractor when the message has no MessageDeduplicationId.
	DefaultKeyAttribute = "idempotency-key"
)

// maxBatch is the largest batch: ten ReceiveMessage calls of ten messages.
const maxBatch = 100

// KeyFunc returns the idempotency key of a message; "" means none (the
// message is dead-lettered and counted in Stats.NoKey).
type KeyFunc func(m types.Message) string

// FingerprintFunc returns the fingerprint of a message: a message whose key
// is known with another fingerprint is dead-lettered (idem.ErrMismatch).
type FingerprintFunc func(m types.Message) string

// Option configures a Consumer: the options of package consumer shared by
// every adapter (consumer.WithScope, consumer.WithMaxDeliveries,
// consumer.WithRetryDelay, consumer.WithBatchSize, consumer.WithConcurrency,
// consumer.WithShutdownTimeout, consumer.WithLogger,
// consumer.WithEventHook, consumer.WithOnLeaseLost,
// consumer.WithPassDuplicates) and this package's own. The dead-letter
// queue has no default, so its URL is New's argument, and
// consumer.WithDeadLetter is refused.
//
// For SQS: the default scope is the queue URL, so that two queues never
// share records; the batch size is how many messages are received and
// processed as one batch (one Processor call, one DeleteMessageBatch per
// ten), default DefaultBatchSize (10), in 1..100: above ten, a batch is
// filled with several ReceiveMessage calls, the first waiting up to the
// wait time, the others sending no WaitTimeSeconds (keep the queue's
// ReceiveMessageWaitTimeSeconds 0) and made only while the previous call
// returned ten messages; the concurrency is how many receive-and-process
// loops run in parallel, default DefaultConcurrency (1); the maximum of
// deliveries counts receives (ApproximateReceiveCount), default
// DefaultMaxDeliveries (5), and a redrive policy's maxReceiveCount must be
// larger (see the package documentation); the retry delay is after how
// long a failed message is received again (its visibility is set to it,
// rounded up to seconds), default DefaultRetryDelay (1s), at most 12h; the
// shutdown timeout is DefaultShutdownTimeout (30s).
type Option = consumer.Option

type config struct {
	key               KeyFunc
	fingerprint       FingerprintFunc
	visibility        time.Duration
	waitTime          time.Duration
	attributeNames    []string
	messageAttributes []string
}

// WithKeyFunc sets the key extractor. The default is DefaultKey: the
// MessageDeduplicationId system attribute if present, else the string
// message attribute "idempotency-key". See also KeyHeader and
// KeyFromBodyHash.
func WithKeyFunc(f KeyFunc) Option { return consumer.AdapterOption(func(c *config) { c.key = f }) }

// WithFingerprint sets how a message's fingerprint is computed. The default
// is none: a reused key is replayed whatever the payload.
func WithFingerprint(f FingerprintFunc) Option {
	return consumer.AdapterOption(func(c *config) { c.fingerprint = f })
}

// WithVisibilityTimeout sets the visibility timeout requested on receive
// and renewed every third of it with ChangeMessageVisibilityBatch while the
// batch is processed. The default is DefaultVisibilityTimeout (30s); it must
// be a whole number of seconds from 3s to 12h.
func WithVisibilityTimeout(d time.Duration) Option {
	return consumer.AdapterOption(func(c *config) { c.visibility = d })
}

// WithWaitTime sets the long-polling wait of ReceiveMessage. The default is
// DefaultWaitTime (20s); it must be a whole number of seconds from 0 to 20.
// Shutdown cancels a pending receive.
func WithWaitTime(d time.Duration) Option {
	return consumer.AdapterOption(func(c *config) { c.waitTime = d })
}

// WithMessageAttributeNames sets the message attributes requested on
// receive. The default is "All".
func WithMessageAttributeNames(names ...string) Option {
	return consumer.AdapterOption(func(c *config) { c.messageAttributes = names })
}

// DefaultKey is the default key extractor: the MessageDeduplicationId
// system attribute (FIFO queues) if present, else the string value of the
// message attribute DefaultKeyAttribute.
func DefaultKey(m types.Message) string {
	if id := m.Attributes[string(types.MessageSystemAttributeNameMessageDeduplicationId)]; id != "" {
		return id
	}
	return KeyHeader(DefaultKeyAttribute)(m)
}

// KeyHeader returns a KeyFunc that reads the string message attribute
// name.
func KeyHeader(name string) KeyFunc {
	return func(m types.Message) string {
		if v, ok := m.MessageAttributes[name]; ok && v.StringValue != nil {
			return *v.StringValue
		}
		return ""
	}
}

// KeyFromBodyHash returns a KeyFunc whose key is the hex SHA-256 of
// part(body), a stable part of the payload (the whole body if part is nil).
// An empty part means no key.
func KeyFromBodyHash(part func(body string) string) KeyFunc {
	return func(m types.Message) string {
		if m.Body == nil {
			return ""
		}
		s := *m.Body
		if part != nil {
			s = part(s)
		}
		if s == "" {
			return ""
		}
		sum := sha256.Sum256([]byte(s))
		return hex.EncodeToString(sum[:])
	}
}

// KeyField returns a KeyFunc that reads the key from the top-level field
// name of the JSON payload (consumer.JSONField).
func KeyField(name string) KeyFunc {
	return func(m types.Message) string { return consumer.JSONField([]byte(aws.ToString(m.Body)), name) }
}

// KeyHash returns a KeyFunc whose key is the SHA-256 of the listed
// top-level fields of the JSON payload (consumer.JSONHash): for payloads
// with no key of their own whose listed fields identify the operation.
func KeyHash(fields ...string) KeyFunc {
	return func(m types.Message) string { return consumer.JSONHash([]byte(aws.ToString(m.Body)), fields...) }
}
