package redisstream

import (
	"context"
	"fmt"
	"slices"

	"github.com/idemgo/idem"
	"github.com/redis/go-redis/v9"
)

// PayloadField is the entry field in which a Sender writes a message's
// payload.
const PayloadField = "payload"

// Sender appends messages to a stream: the Redis Streams sender of the
// transactional outbox's relay (package pgoutbox of the postgres module,
// whose Sender interface it implements). Each message is one entry whose
// field "key" (DefaultKeyField, what a Consumer reads by default) holds
// the idempotency key, whose field "payload" (PayloadField) holds the
// payload, and with one field per header, named as the header. A Sender is
// safe for concurrent use.
type Sender struct {
	rdb    redis.UniversalClient
	stream string
}

// NewSender returns a Sender that appends to stream with rdb. It does no
// I/O. On a Redis Cluster, give the stream the hash tag of the consumer's
// store (see the package documentation).
func NewSender(rdb redis.UniversalClient, stream string) (*Sender, error) {
	switch {
	case rdb == nil:
		return nil, fmt.Errorf("%w: redisstream: nil client", idem.ErrInvalid)
	case stream == "":
		return nil, fmt.Errorf("%w: redisstream: empty stream name", idem.ErrInvalid)
	}
	return &Sender{rdb: rdb, stream: stream}, nil
}

// Send appends the message to the stream (XADD) and returns nil once Redis
// replied: the entry is in the server's memory, and on its disk as its
// persistence settings say (appendfsync). A header named "key" or
// "payload" would hide a field: pgoutbox refuses such headers when the
// message is published.
func (s *Sender) Send(ctx context.Context, key string, payload []byte, headers map[string]string) error {
	values := make([]any, 0, 4+2*len(headers))
	values = append(values, DefaultKeyField, key, PayloadField, payload)
	names := make([]string, 0, len(headers))
	for name := range headers {
		names = append(names, name)
	}
	slices.Sort(names)
	for _, name := range names {
		values = append(values, name, headers[name])
	}
	if err := s.rdb.XAdd(ctx, &redis.XAddArgs{Stream: s.stream, Values: values}).Err(); err != nil {
		return fmt.Errorf("redisstream: XADD to %s: %w", s.stream, err)
	}
	return nil
}
