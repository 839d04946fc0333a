package goredis

import (
	"context"
	"errors"

	"github.com/idemgo/idem/redisstore/internal/backend"
	"github.com/redis/go-redis/v9"
)

// goRedisTransport is a hub's connection (redisstore's hub.go) on a go-redis *redis.Client.
type goRedisTransport struct {
	ps   *redis.PubSub
	done chan struct{}
}

func openTransport(c *redis.Client) backend.Opener {
	return func(h backend.Events) (backend.Transport, error) {
		t := &goRedisTransport{ps: c.Subscribe(context.Background()), done: make(chan struct{})}
		go func() {
			defer close(t.done)
			for {
				msg, err := t.ps.Receive(context.Background())
				if err != nil {
					if !errors.Is(err, redis.ErrClosed) {
						h.Broken()
					}
					return
				}
				switch m := msg.(type) {
				case *redis.Subscription:
					switch m.Kind {
					case "subscribe":
						h.Confirmed(m.Channel, true)
					case "unsubscribe":
						h.Confirmed(m.Channel, false)
					}
				case *redis.Message:
					h.Message(m.Channel)
				}
			}
		}()
		return t, nil
	}
}

func (t *goRedisTransport) Subscribe(ctx context.Context, channel string) error {
	return t.ps.Subscribe(ctx, channel)
}

func (t *goRedisTransport) Unsubscribe(ctx context.Context, channel string) error {
	return t.ps.Unsubscribe(ctx, channel)
}

// Close closes the connection; the reader returns on its own (Close may be
// called from it, through Broken).
func (t *goRedisTransport) Close() { _ = t.ps.Close() }
