package kafka

import (
	"context"
	"fmt"
	"slices"

	"github.com/idemgo/idem"
	"github.com/twmb/franz-go/pkg/kgo"
)

// Sender produces messages to a topic: the Kafka sender of the
// transactional outbox's relay (package pgoutbox of the postgres module,
// whose Sender interface it implements). Each message is one record whose
// header Idempotency-Key (DefaultKeyHeader, what a Consumer reads by
// default) and record key both hold the idempotency key, whose value is
// the payload, and with one header per header of the message. With the
// client's default partitioner, the records of one key go to one
// partition, so they keep the order in which the relay sends them. A
// Sender is safe for concurrent use.
type Sender struct {
	cl    *kgo.Client
	topic string
}

// NewSender returns a Sender that produces to topic with cl. It does no
// I/O; cl's settings (acks, retries, timeouts, partitioner) apply. cl is
// not closed by the Sender.
func NewSender(cl *kgo.Client, topic string) (*Sender, error) {
	switch {
	case cl == nil:
		return nil, fmt.Errorf("%w: kafka: nil client", idem.ErrInvalid)
	case topic == "":
		return nil, fmt.Errorf("%w: kafka: empty topic", idem.ErrInvalid)
	}
	return &Sender{cl: cl, topic: topic}, nil
}

// Send produces the message and returns nil once the broker acknowledged
// it (ProduceSync: with franz-go's default of all in-sync replicas' acks).
func (s *Sender) Send(ctx context.Context, key string, payload []byte, headers map[string]string) error {
	hs := make([]kgo.RecordHeader, 0, 1+len(headers))
	hs = append(hs, kgo.RecordHeader{Key: DefaultKeyHeader, Value: []byte(key)})
	for _, name := range sortedNames(headers) {
		hs = append(hs, kgo.RecordHeader{Key: name, Value: []byte(headers[name])})
	}
	r := &kgo.Record{Topic: s.topic, Key: []byte(key), Value: payload, Headers: hs}
	if err := s.cl.ProduceSync(ctx, r).FirstErr(); err != nil {
		return fmt.Errorf("kafka: produce to %s: %w", s.topic, err)
	}
	return nil
}

func sortedNames(m map[string]string) []string {
	names := make([]string, 0, len(m))
	for name := range m {
		names = append(names, name)
	}
	slices.Sort(names)
	return names
}
