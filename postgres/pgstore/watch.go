package pgstore

import (
	"context"
	"fmt"
	"sync"

	"github.com/idemgo/idem"
	"github.com/jackc/pgx/v5"
)

// listener is one connection, taken out of the pool, that LISTENs on the
// notification channel for every Watch of the store.
type listener struct {
	conn   *pgx.Conn
	cancel context.CancelFunc
	done   chan struct{}

	mu      sync.Mutex
	broken  bool
	watches map[string]*watch
}

// watch is the channel the watchers of one key share, and how many they are.
type watch struct {
	ch chan struct{}
	n  int
}

// Watch implements idem.Watcher with LISTEN/NOTIFY. The first Watch takes a
// connection out of the pool and LISTENs on it; every Watch then shares it.
// A notification published after Watch returned is never missed: the
// connection listens before Watch registers the key. If the connection
// breaks, every watch is woken (the caller looks at the record again) and
// the next Watch opens a new one.
func (s *Store) Watch(ctx context.Context, key string) (<-chan struct{}, func(), error) {
	if err := idem.ValidateStoreKey(key); err != nil {
		return nil, nil, err
	}
	if !s.cfg.notify {
		return nil, func() {}, nil
	}
	l, err := s.listen(ctx)
	if err != nil {
		return nil, nil, fmt.Errorf("pgstore: watch: %w", err)
	}
	return l.add(key)
}

// listen returns the store's listener, starting one if there is none.
func (s *Store) listen(ctx context.Context) (*listener, error) {
	s.lmu.Lock()
	defer s.lmu.Unlock()
	if l := s.listener; l != nil && !l.isBroken() {
		return l, nil
	}
	select {
	case <-s.stop:
		return nil, fmt.Errorf("%w: the store is closed", idem.ErrInvalid)
	default:
	}
	pc, err := s.pool.Acquire(ctx)
	if err != nil {
		return nil, err
	}
	conn := pc.Hijack()
	if _, err := conn.Exec(ctx, "LISTEN "+channel); err != nil {
		conn.Close(context.Background())
		return nil, err
	}
	lctx, cancel := context.WithCancel(context.Background())
	l := &listener{conn: conn, cancel: cancel, done: make(chan struct{}), watches: make(map[string]*watch)}
	go l.run(lctx)
	s.listener = l
	return l, nil
}

func (l *listener) isBroken() bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.broken
}

// run wakes the watches of each notified key until the connection breaks
// or the listener is closed; then it wakes every watch.
func (l *listener) run(ctx context.Context) {
	defer close(l.done)
	defer l.conn.Close(context.Background())
	for {
		n, err := l.conn.WaitForNotification(ctx)
		if err != nil {
			l.mu.Lock()
			l.broken = true
			for k, w := range l.watches {
				close(w.ch)
				delete(l.watches, k)
			}
			l.mu.Unlock()
			return
		}
		l.mu.Lock()
		if w, ok := l.watches[n.Payload]; ok {
			close(w.ch)
			delete(l.watches, n.Payload)
		}
		l.mu.Unlock()
	}
}

// add registers a watch of key.
func (l *listener) add(key string) (<-chan struct{}, func(), error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.broken {
		ch := make(chan struct{})
		close(ch)
		return ch, func() {}, nil
	}
	w, ok := l.watches[key]
	if !ok {
		w = &watch{ch: make(chan struct{})}
		l.watches[key] = w
	}
	w.n++
	var once sync.Once
	stop := func() {
		once.Do(func() {
			l.mu.Lock()
			defer l.mu.Unlock()
			if cur, ok := l.watches[key]; ok && cur == w {
				if w.n--; w.n == 0 {
					delete(l.watches, key)
				}
			}
		})
	}
	return w.ch, stop, nil
}

// close stops the listener and closes its connection.
func (l *listener) close() {
	l.cancel()
	<-l.done
}
