package redisstore_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/idemgo/idem/redisstore"
	"github.com/idemgo/idem/storekit"
	"github.com/idemgo/idem/testkit/redistest"
)

// TestLoneCallDeadline: a lone call on a dedicated connection ends at its
// context's deadline when the server does not answer (its writes paused
// here, CLIENT PAUSE … WRITE, which CLIENT UNPAUSE ends at once), and the
// next call, once the server answers again, goes through: the connection
// the deadline broke is not used again. A lone call passes on its context
// without its cancellation only when the context has no deadline.
func TestLoneCallDeadline(t *testing.T) {
	for _, rc := range ruClients {
		t.Run(rc.name, func(t *testing.T) {
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
			// Far longer than the call's deadline, however slow the
			// machine; ended by CLIENT UNPAUSE below.
			if err := adm.Do(ctx, "CLIENT", "PAUSE", "60000", "WRITE").Err(); err != nil {
				t.Fatal(err)
			}
			short, cancel := context.WithTimeout(ctx, 50*time.Millisecond)
			defer cancel()
			_, err = acquireKey(short, s, 1)
			if err := adm.Do(ctx, "CLIENT", "UNPAUSE").Err(); err != nil {
				t.Fatal(err)
			}
			if !errors.Is(err, context.DeadlineExceeded) {
				t.Fatalf("a lone call while the server's writes are paused, with a 50 ms deadline: %v, want context.DeadlineExceeded", err)
			}
			if a, err := acquireKey(ctx, s, 2); err != nil || a.Outcome != storekit.Acquired {
				t.Fatalf("acquire after the pause: %v, %v", a.Outcome, err)
			}
		})
	}
}
