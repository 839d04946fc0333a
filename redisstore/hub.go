package redisstore

import (
	"context"
	"sync"

	"github.com/idemgo/idem/redisstore/internal/backend"
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
	open backend.Opener // the client backend's subscriber connection

	mu    sync.Mutex
	tr    backend.Transport // nil until the first watch, and after a break
	gen   int               // generation of tr: events of an older one are ignored
	chans map[string]*hubChannel
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
		tr, err := h.open(hubEvents{h, h.gen + 1})
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
		if err := h.tr.Subscribe(ctx, channel); err != nil {
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
		if err := h.tr.Unsubscribe(context.Background(), channel); err != nil {
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
		h.tr.Close()
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
	h.tr.Close()
	h.tr = nil
}

// hubEvents reports the events of connection gen to its hub.
type hubEvents struct {
	h   *hub
	gen int
}

func (e hubEvents) Confirmed(channel string, sub bool) { e.h.confirmed(e.gen, channel, sub) }
func (e hubEvents) Message(channel string)             { e.h.message(e.gen, channel) }
func (e hubEvents) Broken()                            { e.h.broken(e.gen) }
