package rabbitmq

import (
	"context"
	"errors"
	"fmt"
	"sync"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/idemgo/idem"
)

// OutboxKeyHeader is the header in which a Sender also writes the
// idempotency key, under the name every broker's sender uses.
const OutboxKeyHeader = "Idempotency-Key"

// errSenderClosed is returned by Send after Close.
var errSenderClosed = errors.New("rabbitmq: sender closed")

// Sender publishes messages to an exchange: the RabbitMQ sender of the
// transactional outbox's relay (package pgoutbox of the postgres module,
// whose Sender interface it implements). Each message carries the
// idempotency key in its message-id property (what a Consumer reads by
// default, MessageIDKey) and in the header Idempotency-Key
// (OutboxKeyHeader), the payload as its body, one header per header of
// the message, and is persistent (delivery mode 2).
//
// Send waits for the publisher confirm, and publishes with the mandatory
// flag: a message that no queue takes (no binding, a queue that does not
// exist) comes back to the Sender and Send fails, so the relay keeps it
// instead of losing it. The Sender dials its connection on first use and
// again after an error. Sends are made one at a time; a Sender is safe for
// concurrent use.
type Sender struct {
	url        string
	exchange   string
	routingKey string
	cfg        amqp.Config

	mu      sync.Mutex
	conn    *amqp.Connection
	ch      *amqp.Channel
	returns chan amqp.Return
	closed  bool
}

// SenderOption configures a Sender.
type SenderOption func(*Sender)

// WithDialConfig sets the configuration the Sender's connection is dialled
// with (TLS, SASL, heartbeat, a custom Dial). The default is amqp.Config
// with the connection name "idem outbox relay".
func WithDialConfig(cfg amqp.Config) SenderOption { return func(s *Sender) { s.cfg = cfg } }

// NewSender returns a Sender that publishes to exchange with routingKey
// on the broker at url: to send to a queue, give the default exchange ("")
// and the queue's name. It does no I/O. Errors wrap idem.ErrInvalid: a URL
// that does not parse, or both exchange and routing key empty.
func NewSender(url, exchange, routingKey string, opts ...SenderOption) (*Sender, error) {
	if _, err := amqp.ParseURI(url); err != nil {
		return nil, fmt.Errorf("%w: rabbitmq: %w", idem.ErrInvalid, err)
	}
	if exchange == "" && routingKey == "" {
		return nil, invalidf("sender: name an exchange, or a queue as the routing key of the default exchange")
	}
	s := &Sender{url: url, exchange: exchange, routingKey: routingKey}
	s.cfg.Properties = amqp.NewConnectionProperties()
	s.cfg.Properties.SetClientConnectionName("idem outbox relay")
	for _, o := range opts {
		o(s)
	}
	return s, nil
}

// Send publishes the message and returns nil once the broker confirmed it
// (a publisher confirm for a message routed to at least one queue).
func (s *Sender) Send(ctx context.Context, key string, payload []byte, headers map[string]string) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return errSenderClosed
	}
	if err := s.connect(); err != nil {
		return err
	}
	h := make(amqp.Table, len(headers)+1)
	for name, value := range headers {
		h[name] = value
	}
	h[OutboxKeyHeader] = key
	msg := amqp.Publishing{MessageId: key, Headers: h, Body: payload, DeliveryMode: amqp.Persistent}
	dc, err := s.ch.PublishWithDeferredConfirmWithContext(ctx, s.exchange, s.routingKey, true, false, msg)
	if err != nil {
		s.reset()
		return fmt.Errorf("rabbitmq: publish: %w", err)
	}
	acked, err := dc.WaitContext(ctx)
	if err != nil { // no confirm in time: the next Send starts afresh
		s.reset()
		return fmt.Errorf("rabbitmq: publish: waiting for the confirm: %w", err)
	}
	// The broker returns an unroutable message before it confirms it, so
	// its return is here by now.
	select {
	case r := <-s.returns:
		if r.MessageId == key {
			return fmt.Errorf("rabbitmq: publish: returned unroutable by the broker (%d %s): no queue takes exchange %q, routing key %q", r.ReplyCode, r.ReplyText, s.exchange, s.routingKey)
		}
	default:
	}
	if !acked {
		reason := "the broker refused it (nack)"
		if s.ch.IsClosed() {
			reason = "the channel closed before the confirm"
		}
		s.reset()
		return fmt.Errorf("rabbitmq: publish: %s", reason)
	}
	return nil
}

// connect dials the connection and opens a channel in confirm mode, unless
// they are open. s.mu is held.
func (s *Sender) connect() error {
	if s.ch != nil && !s.ch.IsClosed() {
		return nil
	}
	s.reset()
	conn, err := amqp.DialConfig(s.url, s.cfg)
	if err != nil {
		return fmt.Errorf("rabbitmq: dial: %w", err)
	}
	ch, err := conn.Channel()
	if err == nil {
		err = ch.Confirm(false)
	}
	if err != nil {
		conn.Close()
		return fmt.Errorf("rabbitmq: open a channel in confirm mode: %w", err)
	}
	s.conn, s.ch = conn, ch
	s.returns = ch.NotifyReturn(make(chan amqp.Return, 4))
	return nil
}

// reset closes the connection, if any. s.mu is held.
func (s *Sender) reset() {
	if s.conn != nil {
		s.conn.Close()
	}
	s.conn, s.ch, s.returns = nil, nil, nil
}

// Close closes the connection; Send fails afterwards.
func (s *Sender) Close() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.closed = true
	s.reset()
	return nil
}
