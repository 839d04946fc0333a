package sqsconsumer

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"strings"
	"unicode/utf8"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/sqs"
	"github.com/aws/aws-sdk-go-v2/service/sqs/types"

	"github.com/idemgo/idem"
)

// SendAPI is the part of the SQS client a Sender uses; *sqs.Client
// implements it.
type SendAPI interface {
	SendMessage(ctx context.Context, in *sqs.SendMessageInput, optFns ...func(*sqs.Options)) (*sqs.SendMessageOutput, error)
}

var _ SendAPI = (*sqs.Client)(nil)

// maxAttributes is the most message attributes SQS takes on one message.
const maxAttributes = 10

// Sender sends messages to a queue: the SQS sender of the transactional
// outbox's relay (package pgoutbox of the postgres module, whose Sender
// interface it implements). Each message carries the idempotency key in
// the string message attribute "idempotency-key" (DefaultKeyAttribute,
// what DefaultKey reads), the payload as its body, and one string message
// attribute per header of the message.
//
// SQS takes at most 10 attributes (so 9 headers), names of letters,
// digits, '_', '-' and '.', and a body of Unicode text (send binary
// payloads encoded, base64 for example): a message outside these limits
// fails every time, and the relay keeps it. On a FIFO queue (a URL ending
// in ".fifo") the key is also the message group (so one key's messages
// are delivered in order) and the deduplication id (the key itself when
// it is at most 128 printable ASCII characters, else the hex SHA-256 of
// the key, which DefaultKey then reads as the key); a standard queue keeps
// no order. A Sender is safe for concurrent use.
type Sender struct {
	client   SendAPI
	queueURL string
	fifo     bool
}

// NewSender returns a Sender that sends to queueURL with client. It does
// no I/O.
func NewSender(client SendAPI, queueURL string) (*Sender, error) {
	switch {
	case client == nil:
		return nil, fmt.Errorf("%w: sqsconsumer: nil client", idem.ErrInvalid)
	case queueURL == "":
		return nil, fmt.Errorf("%w: sqsconsumer: empty queue URL", idem.ErrInvalid)
	}
	return &Sender{client: client, queueURL: queueURL, fifo: strings.HasSuffix(queueURL, ".fifo")}, nil
}

// Send sends the message and returns nil once SQS replied to SendMessage
// (the message is stored).
func (s *Sender) Send(ctx context.Context, key string, payload []byte, headers map[string]string) error {
	switch {
	case len(headers)+1 > maxAttributes:
		return fmt.Errorf("sqsconsumer: %d headers: SQS takes at most %d message attributes, one of them the key", len(headers), maxAttributes)
	case !utf8.Valid(payload):
		return fmt.Errorf("sqsconsumer: the payload is not UTF-8 text: SQS message bodies are text")
	}
	attrs := make(map[string]types.MessageAttributeValue, len(headers)+1)
	for name, value := range headers {
		attrs[name] = types.MessageAttributeValue{DataType: aws.String("String"), StringValue: aws.String(value)}
	}
	attrs[DefaultKeyAttribute] = types.MessageAttributeValue{DataType: aws.String("String"), StringValue: aws.String(key)}
	in := &sqs.SendMessageInput{QueueUrl: aws.String(s.queueURL), MessageBody: aws.String(string(payload)), MessageAttributes: attrs}
	if s.fifo {
		in.MessageGroupId = aws.String(key)
		in.MessageDeduplicationId = aws.String(dedupID(key))
	}
	if _, err := s.client.SendMessage(ctx, in); err != nil {
		return fmt.Errorf("sqsconsumer: SendMessage: %w", err)
	}
	return nil
}

// dedupID returns the FIFO deduplication id of key: key itself when SQS
// takes it (1 to 128 printable ASCII characters), else its hex SHA-256.
func dedupID(key string) string {
	ok := len(key) <= 128
	for i := 0; ok && i < len(key); i++ {
		ok = key[i] >= '!' && key[i] <= '~'
	}
	if ok {
		return key
	}
	sum := sha256.Sum256([]byte(key))
	return hex.EncodeToString(sum[:])
}
