package redisstore_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/idemgo/idem/redisstore"
	"github.com/idemgo/idem/storekit"
	"github.com/idemgo/idem/testkit/redistest"
)

// pausedWrites returns a store of rc on a new server, after one lone
// acquire (the store's dedicated connection open), and pauses the server's
// writes: CLIENT PAUSE … WRITE, far longer than any test waits, which the
// returned unpause ends at once (CLIENT UNPAUSE is not a write); held
// reports whether the server holds a call back.
func pausedWrites(t *testing.T, rc ruClient) (s *redisstore.Store, held func() bool, unpause func()) {
	t.Helper()
	srv := redistest.Start(t)
	s, err := rc.store(t, ruOptions{addrs: []string{srv.Addr()}}, redisstore.WithReplayCache(false))
	if err != nil {
		t.Fatal(err)
	}
	ctx := t.Context()
	if a, err := acquireKey(ctx, s, 0); err != nil || a.Outcome != storekit.Acquired {
		t.Fatalf("acquire before the pause: %v, %v", a.Outcome, err)
	}
	adm := srv.GoRedis(t)
	if err := adm.Do(ctx, "CLIENT", "PAUSE", "60000", "WRITE").Err(); err != nil {
		t.Fatal(err)
	}
	unpause = func() {
		if err := adm.Do(context.Background(), "CLIENT", "UNPAUSE").Err(); err != nil {
			t.Error(err)
		}
	}
	t.Cleanup(unpause)
	held = func() bool {
		info, err := adm.Info(ctx, "clients").Result()
		return err == nil && strings.Contains(info, "blocked_clients:1\r\n")
	}
	return s, held, unpause
}

// TestLoneCallDeadline: a lone call on a dedicated connection ends at its
// context's deadline when the server does not answer (its writes paused),
// and the next call, once the server answers again, goes through: the
// connection the deadline broke is not used again. A lone call passes on
// its context without its cancellation only when the context has no
// deadline.
func TestLoneCallDeadline(t *testing.T) {
	for _, rc := range ruClients {
		t.Run(rc.name, func(t *testing.T) {
			s, _, unpause := pausedWrites(t, rc)
			short, cancel := context.WithTimeout(t.Context(), 50*time.Millisecond)
			defer cancel()
			_, err := acquireKey(short, s, 1)
			unpause()
			if !errors.Is(err, context.DeadlineExceeded) {
				t.Fatalf("a lone call while the server's writes are paused, with a 50 ms deadline: %v, want context.DeadlineExceeded", err)
			}
			if a, err := acquireKey(t.Context(), s, 2); err != nil || a.Outcome != storekit.Acquired {
				t.Fatalf("acquire after the pause: %v, %v", a.Outcome, err)
			}
		})
	}
}

// TestLoneCallWaitsForItsReply: a lone call on a dedicated connection
// whose context has no deadline, once sent, waits for its reply even if
// its context is canceled meanwhile, and returns that reply: here the
// acquire the server ran once its writes were unpaused. The caller learns
// the call's outcome instead of "canceled, outcome unknown". On the
// shared connection (the code before) the call returned context.Canceled
// at once.
func TestLoneCallWaitsForItsReply(t *testing.T) {
	for _, rc := range ruClients {
		t.Run(rc.name, func(t *testing.T) {
			s, held, unpause := pausedWrites(t, rc)
			canceled, cancel := context.WithCancel(t.Context())
			type result struct {
				a   storekit.Acquisition
				err error
			}
			done := make(chan result, 1)
			go func() {
				a, err := acquireKey(canceled, s, 1)
				done <- result{a, err}
			}()
			waitFor(t, "the acquire sent and held by the pause", held) // sent
			cancel()
			unpause()
			r := <-done
			if r.err != nil || r.a.Outcome != storekit.Acquired {
				t.Fatalf("a lone call canceled after it was sent: %v, %v; want its reply, Acquired", r.a.Outcome, r.err)
			}
		})
	}
}
