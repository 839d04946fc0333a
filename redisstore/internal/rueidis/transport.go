package rueidis

import (
	"context"
	"errors"
	"sync"

	"github.com/idemgo/idem/redisstore/internal/backend"
	"github.com/redis/rueidis"
)

// transport is a hub's connection (redisstore's hub.go) on a standalone rueidis.Client: a
// dedicated connection whose pub/sub hooks report to the hub. rueidis sends
// SUBSCRIBE and UNSUBSCRIBE with a call that waits for the confirmation,
// which the hooks report from the connection's reader, and the hub's lock is
// held while a command is queued: so one sender goroutine sends the queued
// commands in order, and the hub never waits for the connection.
type transport struct {
	dc     rueidis.DedicatedClient
	cancel func()

	mu     sync.Mutex
	queue  []rueidis.Completed
	closed bool
	more   chan struct{} // a command was queued, or the transport closed
}

func openTransport(c rueidis.Client) backend.Opener {
	return func(h backend.Events) (backend.Transport, error) {
		dc, cancel := c.Dedicate()
		t := &transport{dc: dc, cancel: cancel, more: make(chan struct{}, 1)}
		hookErr := dc.SetPubSubHooks(rueidis.PubSubHooks{
			OnSubscription: func(s rueidis.PubSubSubscription) {
				switch s.Kind {
				case "subscribe":
					h.Confirmed(s.Channel, true)
				case "unsubscribe":
					h.Confirmed(s.Channel, false)
				}
			},
			OnMessage: func(m rueidis.PubSubMessage) { h.Message(m.Channel) },
		})
		go func() {
			<-hookErr // the connection broke, or close
			h.Broken()
		}()
		go t.send(h)
		return t, nil
	}
}

// send sends the queued commands, in order, until the transport closes.
func (t *transport) send(h backend.Events) {
	for range t.more {
		t.mu.Lock()
		cmds, closed := t.queue, t.closed
		t.queue = nil
		t.mu.Unlock()
		if closed {
			return
		}
		for _, cmd := range cmds {
			if err := t.dc.Do(context.Background(), cmd).Error(); err != nil {
				h.Broken()
				return
			}
		}
	}
}

func (t *transport) push(cmd rueidis.Completed) error {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.closed {
		return errors.New("redisstore: subscriber connection closed")
	}
	t.queue = append(t.queue, cmd)
	select {
	case t.more <- struct{}{}:
	default:
	}
	return nil
}

func (t *transport) Subscribe(_ context.Context, channel string) error {
	return t.push(t.dc.B().Subscribe().Channel(channel).Build())
}

func (t *transport) Unsubscribe(_ context.Context, channel string) error {
	return t.push(t.dc.B().Unsubscribe().Channel(channel).Build())
}

// Close stops the sender and closes the connection, in a goroutine:
// rueidis waits for the connection's reader, which may be waiting for the
// hub's lock in a hook.
func (t *transport) Close() {
	t.mu.Lock()
	if !t.closed {
		t.closed = true
		select {
		case t.more <- struct{}{}:
		default:
		}
	}
	t.mu.Unlock()
	go t.cancel()
}
