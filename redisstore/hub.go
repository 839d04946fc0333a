package redisstore

import (
	"context"
	"errors"
	"sync"

	"github.com/redis/go-redis/v9"
	"github.com/redis/rueidis"
)

// hub shares one subscriber connection among all the watches of a store,
// instead of one connection per waiting caller: a watch subscribes to its
// channel on the shared connection (or joins the watches already on it),
// and the last watch of a channel unsubscribes. One goroutine reads the
// connection and wakes the watches of a channel when a message arrives.
//
// The confirmations of SUBSCRIBE and UNSUBSCRIBE come back in the order
// the commands were sent, so counting them per channel tells which
// SUBSCRIBE a confirmation answers: a watch waits for the confirmation of
// the SUBSCRIBE it sent or joined. A channel's entry is kept until its
// commands are all confirmed, so that a new SUBSCRIBE is never confirmed by
// an older one's reply.
//
// If the connection breaks, every watch is woken (its caller reads the
// record again and watches anew) and the next watch opens a new connection.
// The connection is closed when no channel is left.
type hub struct {
	open func(h *hub, gen int) (transport, error)

	mu    sync.Mutex
	tr    transport // nil until the first watch, and after a break
	gen   int       // generation of tr: events of an older one are ignored
	chans map[string]*hubChannel
}

// transport is the subscriber connection of a hub. Its methods send a
// command and return without waiting for the reply; the connection's reader
// reports to the hub with confirmed, message and broken.
type transport interface {
	subscribe(ctx context.Context, channel string) error
	unsubscribe(ctx context.Context, channel string) error
	close()
}

type hubChannel struct {
	subSent, subAcked     int // SUBSCRIBE sent on the connection / confirmed
	unsubSent, unsubAcked int // UNSUBSCRIBE likewise
	watches               map[*hubWatch]struct{}
}

type hubWatch struct {
	need      int           // the count of subAcked that confirms this watch
	confirmed chan struct{} // closed once the subscription is confirmed
	changed   chan struct{} // closed on a message, or when the connection broke
	done      bool          // changed is closed
}

func (w *hubWatch) wake() {
	if !w.done {
		w.done = true
		close(w.changed)
	}
	select {
	case <-w.confirmed:
	default:
		close(w.confirmed)
	}
}

func (c *hubChannel) idle() bool {
	return len(c.watches) == 0 && c.subSent == c.subAcked && c.unsubSent == c.unsubAcked
}

// watch subscribes to channel and returns after the server confirmed the
// subscription; see Store.Watch.
func (h *hub) watch(ctx context.Context, channel string) (<-chan struct{}, func(), error) {
	h.mu.Lock()
	if h.tr == nil {
		tr, err := h.open(h, h.gen+1)
		if err != nil {
			h.mu.Unlock()
			return nil, nil, err
		}
		h.tr, h.gen, h.chans = tr, h.gen+1, map[string]*hubChannel{}
	}
	c := h.chans[channel]
	if c == nil {
		c = &hubChannel{watches: map[*hubWatch]struct{}{}}
		h.chans[channel] = c
	}
	w := &hubWatch{confirmed: make(chan struct{}), changed: make(chan struct{})}
	if len(c.watches) == 0 {
		c.subSent++
		if err := h.tr.subscribe(ctx, channel); err != nil {
			h.breakLocked()
			h.mu.Unlock()
			return nil, nil, err
		}
	}
	w.need = c.subSent
	c.watches[w] = struct{}{}
	if c.subAcked >= w.need {
		close(w.confirmed)
	}
	gen := h.gen
	h.mu.Unlock()

	stop := func() { h.stop(gen, channel, w) }
	select {
	case <-w.confirmed:
		return w.changed, stop, nil
	case <-ctx.Done():
		stop()
		return nil, nil, ctx.Err()
	}
}

// stop ends watch w of channel, unsubscribing if it was the last one.
func (h *hub) stop(gen int, channel string, w *hubWatch) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if gen != h.gen || h.tr == nil {
		return // the connection broke: its entries are gone
	}
	c := h.chans[channel]
	if c == nil {
		return
	}
	if _, ok := c.watches[w]; !ok {
		return
	}
	delete(c.watches, w)
	if len(c.watches) == 0 {
		c.unsubSent++
		if err := h.tr.unsubscribe(context.Background(), channel); err != nil {
			h.breakLocked()
			return
		}
	}
	h.dropIfIdle(channel, c)
}

// dropIfIdle forgets channel once it has no watch and no command waiting
// for its confirmation, and closes the connection once no channel is left:
// an idle store holds no subscriber connection.
func (h *hub) dropIfIdle(channel string, c *hubChannel) {
	if !c.idle() {
		return
	}
	delete(h.chans, channel)
	if len(h.chans) == 0 {
		h.tr.close()
		h.tr = nil
	}
}

// confirmed records the server's confirmation of a SUBSCRIBE (sub) or of
// an UNSUBSCRIBE of channel.
func (h *hub) confirmed(gen int, channel string, sub bool) {
	h.mu.Lock()
	defer h.mu.Unlock()
	c := h.chans[channel]
	if gen != h.gen || c == nil {
		return
	}
	if !sub {
		c.unsubAcked++
	} else {
		c.subAcked++
		for w := range c.watches {
			if c.subAcked >= w.need {
				select {
				case <-w.confirmed:
				default:
					close(w.confirmed)
				}
			}
		}
	}
	h.dropIfIdle(channel, c)
}

// message wakes the watches of channel.
func (h *hub) message(gen int, channel string) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if c := h.chans[channel]; gen == h.gen && c != nil {
		for w := range c.watches {
			w.wake()
		}
	}
}

// broken reports that connection gen is gone.
func (h *hub) broken(gen int) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if gen == h.gen && h.tr != nil {
		h.breakLocked()
	}
}

// breakLocked closes the connection and wakes every watch; the next watch
// opens a new connection.
func (h *hub) breakLocked() {
	for _, c := range h.chans {
		for w := range c.watches {
			w.wake()
		}
	}
	h.chans = nil
	h.tr.close()
	h.tr = nil
}

// goRedisTransport is a hub's connection on a go-redis *redis.Client.
type goRedisTransport struct {
	ps   *redis.PubSub
	done chan struct{}
}

func openGoRedis(c *redis.Client) func(h *hub, gen int) (transport, error) {
	return func(h *hub, gen int) (transport, error) {
		t := &goRedisTransport{ps: c.Subscribe(context.Background()), done: make(chan struct{})}
		go func() {
			defer close(t.done)
			for {
				msg, err := t.ps.Receive(context.Background())
				if err != nil {
					if !errors.Is(err, redis.ErrClosed) {
						h.broken(gen)
					}
					return
				}
				switch m := msg.(type) {
				case *redis.Subscription:
					switch m.Kind {
					case "subscribe":
						h.confirmed(gen, m.Channel, true)
					case "unsubscribe":
						h.confirmed(gen, m.Channel, false)
					}
				case *redis.Message:
					h.message(gen, m.Channel)
				}
			}
		}()
		return t, nil
	}
}

func (t *goRedisTransport) subscribe(ctx context.Context, channel string) error {
	return t.ps.Subscribe(ctx, channel)
}

func (t *goRedisTransport) unsubscribe(ctx context.Context, channel string) error {
	return t.ps.Unsubscribe(ctx, channel)
}

// close closes the connection; the reader returns on its own (close may be
// called from it, through broken).
func (t *goRedisTransport) close() { _ = t.ps.Close() }

// rueidisTransport is a hub's connection on a standalone rueidis.Client: a
// dedicated connection whose pub/sub hooks report to the hub. rueidis sends
// SUBSCRIBE and UNSUBSCRIBE with a call that waits for the confirmation,
// which the hooks report from the connection's reader, and the hub's lock is
// held while a command is queued: so one sender goroutine sends the queued
// commands in order, and the hub never waits for the connection.
type rueidisTransport struct {
	dc     rueidis.DedicatedClient
	cancel func()

	mu     sync.Mutex
	queue  []rueidis.Completed
	closed bool
	more   chan struct{} // a command was queued, or the transport closed
}

func openRueidis(c rueidis.Client) func(h *hub, gen int) (transport, error) {
	return func(h *hub, gen int) (transport, error) {
		dc, cancel := c.Dedicate()
		t := &rueidisTransport{dc: dc, cancel: cancel, more: make(chan struct{}, 1)}
		hookErr := dc.SetPubSubHooks(rueidis.PubSubHooks{
			OnSubscription: func(s rueidis.PubSubSubscription) {
				switch s.Kind {
				case "subscribe":
					h.confirmed(gen, s.Channel, true)
				case "unsubscribe":
					h.confirmed(gen, s.Channel, false)
				}
			},
			OnMessage: func(m rueidis.PubSubMessage) { h.message(gen, m.Channel) },
		})
		go func() {
			<-hookErr // the connection broke, or close
			h.broken(gen)
		}()
		go t.send(h, gen)
		return t, nil
	}
}

// send sends the queued commands, in order, until the transport closes.
func (t *rueidisTransport) send(h *hub, gen int) {
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
				h.broken(gen)
				return
			}
		}
	}
}

func (t *rueidisTransport) push(cmd rueidis.Completed) error {
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

func (t *rueidisTransport) subscribe(_ context.Context, channel string) error {
	return t.push(t.dc.B().Subscribe().Channel(channel).Build())
}

func (t *rueidisTransport) unsubscribe(_ context.Context, channel string) error {
	return t.push(t.dc.B().Unsubscribe().Channel(channel).Build())
}

// close stops the sender and closes the connection, in a goroutine:
// rueidis waits for the connection's reader, which may be waiting for the
// hub's lock in a hook.
func (t *rueidisTransport) close() {
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
