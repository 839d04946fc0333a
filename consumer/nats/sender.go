package natsconsumer

import (
	"context"
	"fmt"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/idemgo/idem"
)

// OutboxKeyHeader is the header in which a Sender also writes the
// idempotency key, under the name every broker's sender uses.
const OutboxKeyHeader = "Idempotency-Key"

// Sender publishes messages to a JetStream subject: the NATS sender of the
// transactional outbox's relay (package pgoutbox of the postgres module,
// whose Sender interface it implements). Each message carries the
// idempotency key in the header Nats-Msg-Id (DefaultKeyHeader, what a
// Consumer reads by default, and JetStream's own deduplication id) and in
// the header Idempotency-Key (OutboxKeyHeader), the payload as its data,
// and one header per header of the message. A Sender is safe for
// concurrent use.
//
// Since the key is the Nats-Msg-Id, a stream with a duplicate window
// (2 minutes by default) stores a message sent again within the window
// once: the relay's repeat after a crash usually never reaches the
// consumer, and one after the window is deduplicated by the consumer.
type Sender struct {
	js      jetstream.JetStream
	subject string
}

// NewSender returns a Sender that publishes to subject with js. It does
// no I/O. A stream must capture subject: otherwise every Send fails (no
// PubAck), and the relay keeps the message.
func NewSender(js jetstream.JetStream, subject string) (*Sender, error) {
	switch {
	case js == nil:
		return nil, fmt.Errorf("%w: natsconsumer: nil JetStream", idem.ErrInvalid)
	case subject == "":
		return nil, fmt.Errorf("%w: natsconsumer: empty subject", idem.ErrInvalid)
	}
	return &Sender{js: js, subject: subject}, nil
}

// Send publishes the message and returns nil once the stream acknowledged
// it (PubAck; also for a message the stream had already, within its
// duplicate window).
func (s *Sender) Send(ctx context.Context, key string, payload []byte, headers map[string]string) error {
	m := nats.NewMsg(s.subject)
	m.Data = payload
	for name, value := range headers {
		m.Header[name] = []string{value}
	}
	m.Header[DefaultKeyHeader] = []string{key}
	m.Header[OutboxKeyHeader] = []string{key}
	if _, err := s.js.PublishMsg(ctx, m); err != nil {
		return fmt.Errorf("natsconsumer: publish to %s: %w", s.subject, err)
	}
	return nil
}
