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

// Option configures a Consumer.
type Option func(*config)

type config struct {
	procOpts          []consumer.Option
	key               KeyFunc
	fingerprint       FingerprintFunc
	scope             string
	batchSize         int
	concurrency       int
	visibility        time.Duration
	waitTime          time.Duration
	maxDeliveries     int
	retryDelay        time.Duration
	shutdownTimeout   time.Duration
	onError           func(error)
	attributeNames    []string
	messageAttributes []string
}

// WithKeyFunc sets the key extractor. The default is DefaultKey: the
// MessageDeduplicationId system attribute if present, else the string
// message attribute "idempotency-key". See also KeyHeader and
// KeyFromBodyHash.
func WithKeyFunc(f KeyFunc) Option { return func(c *config) { c.key = f } }

// WithFingerprint sets how a message's fingerprint is computed. The default
// is none: a reused key is replayed whatever the payload.
func WithFingerprint(f FingerprintFunc) Option { return func(c *config) { c.fingerprint = f } }

// WithScope sets the scope of message keys in the store. The default is the
// queue URL, so that two queues never share records.
func WithScope(scope string) Option { return func(c *config) { c.scope = scope } }

// WithBatchSize sets how many messages are received and processed as one
// batch (one Processor.Process call, one DeleteMessageBatch per ten). Above
// ten, a batch is filled with several ReceiveMessage calls: the first waits
// up to the wait time, the others send no WaitTimeSeconds (the queue's
// ReceiveMessageWaitTimeSeconds applies; keep it 0) and are made only while
// the previous call returned ten messages. The default is DefaultBatchSize
// (10); it must be in 1..100.
func WithBatchSize(n int) Option { return func(c *config) { c.batchSize = n } }

// WithConcurrency sets how many receive-and-process loops run in parallel.
// The default is DefaultConcurrency (1).
func WithConcurrency(n int) Option { return func(c *config) { c.concurrency = n } }

// WithVisibilityTimeout sets the visibility timeout requested on receive
// and renewed every third of it with ChangeMessageVisibilityBatch while the
// batch is processed. The default is DefaultVisibilityTimeout (30s); it must
// be a whole number of seconds from 3s to 12h.
func WithVisibilityTimeout(d time.Duration) Option { return func(c *config) { c.visibility = d } }

// WithWaitTime sets the long-polling wait of ReceiveMessage. The default is
// DefaultWaitTime (20s); it must be a whole number of seconds from 0 to 20.
// Shutdown cancels a pending receive.
func WithWaitTime(d time.Duration) Option { return func(c *config) { c.waitTime = d } }

// WithMaxDeliveries sets after how many receives (ApproximateReceiveCount) a
// message whose handler keeps failing is sent to the dead-letter queue and
// its key becomes FAILED. The default is DefaultMaxDeliveries (5); 0 means
// never. If the queue has a redrive policy, its maxReceiveCount must be
// larger (see the package documentation).
func WithMaxDeliveries(n int) Option { return func(c *config) { c.maxDeliveries = n } }

// WithRetryDelay sets after how long a message whose handler failed is
// received again (its visibility is set to it, rounded up to seconds). The
// default is DefaultRetryDelay (1s).
func WithRetryDelay(d time.Duration) Option { return func(c *config) { c.retryDelay = d } }

// WithShutdownTimeout bounds how long Run waits for in-flight batches after
// its context is cancelled; then their handlers' contexts are cancelled and
// the unfinished messages released. The default is DefaultShutdownTimeout
// (30s).
func WithShutdownTimeout(d time.Duration) Option { return func(c *config) { c.shutdownTimeout = d } }

// WithErrorHandler sets a function called with every error the consumer
// cannot return: failed receives, deletes, visibility changes and
// dead-letter sends, and handler errors. It must be safe for concurrent use.
// The default discards them (they are still counted in Stats).
func WithErrorHandler(f func(error)) Option { return func(c *config) { c.onError = f } }

// WithMessageAttributeNames sets the message attributes requested on
// receive. The default is "All".
func WithMessageAttributeNames(names ...string) Option {
	return func(c *config) { c.messageAttributes = names }
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

// WithProcessorOptions passes options to the consumer.Processor that the
// Consumer builds (the one consumer algorithm): the per-message event hook
// (consumer.WithEventHook), the logger (consumer.WithLogger), the
// compensation hook (consumer.WithOnLeaseLost), duplicates passed on
// (consumer.WithPassDuplicates). The Consumer's own options of the same
// meaning (scope, maximum of deliveries, retry delay) are applied after
// them. The default is none.
func WithProcessorOptions(opts ...consumer.Option) Option {
	return func(c *config) { c.procOpts = append(c.procOpts, opts...) }
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
