package pgstore

import (
	"context"
	"fmt"

	"github.com/idemgo/idem"
	"github.com/idemgo/idem/storekit"
	"github.com/idemgo/idem/storekit/watchset"
	"github.com/jackc/pgx/v5"
)

// listener is one connection, taken out of the pool, that LISTENs on the
// notification channel for every Watch of the store.
type listener struct {
	conn   *pgx.Conn
	cancel context.CancelFunc
	done   chan struct{}

	// watches are the store's watches; closed when the connection
	// breaks (every watch is woken, and a later one on this listener is
	// woken at once).
	watches watchset.Set
}

// Watch implements storekit.Watcher with LISTEN/NOTIFY. The first Watch takes a
// connection out of the pool and LISTENs on it; every Watch then shares it.
// A notification published after Watch returned is never missed: the
// connection listens before Watch registers the key. If the connection
// breaks, every watch is woken (the caller looks at the record again) and
// the next Watch opens a new one.
func (s *Store) Watch(ctx context.Context, key string) (<-chan struct{}, func(), error) {
	if err := storekit.ValidateStoreKey(key); err != nil {
		return nil, nil, err
	}
	if !s.cfg.notify {
		return nil, func() {}, nil
	}
	l, err := s.listen(ctx)
	if err != nil {
		return nil, nil, fmt.Errorf("pgstore: watch: %w", err)
	}
	ch, stop := l.watches.Add(key)
	return ch, stop, nil
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
	l := &listener{conn: conn, cancel: cancel, done: make(chan struct{})}
	go l.run(lctx)
	s.listener = l
	return l, nil
}

func (l *listener) isBroken() bool { return l.watches.Closed() }

// run wakes the watches of each notified key until the connection breaks
// or the listener is closed; then it wakes every watch.
func (l *listener) run(ctx context.Context) {
	defer close(l.done)
	defer l.conn.Close(context.Background())
	for {
		n, err := l.conn.WaitForNotification(ctx)
		if err != nil {
			l.watches.Close()
			return
		}
		l.watches.Wake(n.Payload)
	}
}

// close stops the listener and closes its connection.
func (l *listener) close() {
	l.cancel()
	<-l.done
}
