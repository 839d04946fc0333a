package pgeffects

import (
	"context"
	"errors"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idemgo/idem"
	"github.com/idemgo/idem/chaos/chaostest"
	"github.com/idemgo/idem/postgres/pggate"
	"github.com/jackc/pgx/v5/pgxpool"
)

// TestPGConnectionsCut: Postgres goes away mid-run, as in a restart seen
// from the clients: every connection is cut and new ones are refused for
// 300 ms, every 500 ms, while 8 workers run every key until it succeeds.
// The shared server is not restarted (other suites use it): a TCP proxy
// in front of it does the cutting. With the gate: one effect per key, every
// acknowledged key has its completion row, the workers recover without
// any manual step. The control counts the duplicates that commits whose
// reply was lost cause when the effect is outside the gate.
func TestPGConnectionsCut(t *testing.T) {
	keys := chaostest.Size(300, 3000)
	modes(t, func(t *testing.T, m mode) {
		r := newRig(t)
		proxy := chaostest.StartNetProxy(t, strings.TrimPrefix(mustHost(t, r.url), "//"))
		u, _ := url.Parse(r.url)
		u.Host = proxy.Addr()
		cfg, err := pgxpool.ParseConfig(u.String())
		if err != nil {
			t.Fatal(err)
		}
		cfg.ConnConfig.ConnectTimeout = time.Second
		pool, err := pgxpool.NewWithConfig(t.Context(), cfg)
		if err != nil {
			t.Fatal(err)
		}
		defer pool.Close()
		e, g, err := build(r.rdb, pool, nil, []pggate.Option{pggate.WithRelayInterval(100 * time.Millisecond), pggate.WithRelayDelay(0)})
		if err != nil {
			t.Fatal(err)
		}
		defer g.Close()

		var c chaostest.Counters
		var errs atomic.Int64
		var mu sync.Mutex
		samples := map[string]bool{}
		var executed int64
		stop := make(chan struct{})
		cuts := 0
		var cw sync.WaitGroup
		cw.Go(func() {
			tick := time.NewTicker(500 * time.Millisecond)
			defer tick.Stop()
			for {
				select {
				case <-stop:
					return
				case <-tick.C:
					proxy.Disable()
					cuts++
					select {
					case <-stop:
					case <-time.After(300 * time.Millisecond):
					}
					proxy.Enable(t)
				}
			}
		})
		ids := make(chan int)
		var wg sync.WaitGroup
		for range 8 {
			wg.Go(func() {
				var ex int64
				for i := range ids {
					id := "k" + strconv.Itoa(i)
					deadline := time.Now().Add(waitTimeout)
					for {
						c.Attempted.Add(1)
						ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
						_, err := do(ctx, e, g, pool, m, id, &ex, nil)
						cancel()
						if err == nil {
							c.Acknowledged.Add(1)
							break
						}
						if errors.Is(err, idem.ErrInProgress) {
							e.Await(context.Background(), idem.Key{Scope: "pay", ID: id})
						} else {
							errs.Add(1)
							msg := err.Error()
							if len(msg) > 90 {
								msg = msg[:90]
							}
							mu.Lock()
							if len(samples) < 3 {
								samples[msg] = true
							}
							mu.Unlock()
							time.Sleep(20 * time.Millisecond) // a client's back-off before its retry
						}
						if time.Now().After(deadline) {
							t.Errorf("%s: no success within %v: %v", id, waitTimeout, err)
							break
						}
					}
				}
				mu.Lock()
				executed += ex
				mu.Unlock()
			})
		}
		for i := range keys {
			ids <- i
		}
		close(ids)
		wg.Wait()
		close(stop)
		cw.Wait()
		c.Executed.Store(executed)
		var missingRows int64
		if m == gated {
			// No committed completion lost: every key has its row.
			r.pool.QueryRow(context.Background(), `SELECT $1::int - count(*) FROM idem_completions`, keys).Scan(&missingRows)
			if missingRows != 0 {
				t.Errorf("%d keys acknowledged without a completion row", missingRows)
			}
		}
		var sample []string
		for s := range samples {
			sample = append(sample, strconv.Quote(s))
		}
		figures := map[string]string{"keys": strconv.Itoa(keys), "cuts": strconv.Itoa(cuts), "errors": strconv.FormatInt(errs.Load(), 10),
			"missing_completions": strconv.FormatInt(missingRows, 10)}
		t.Logf("error samples: %s", strings.Join(sample, "; "))
		rows, dup := effects(t, r.pool)
		c.Effects.Store(rows)
		c.Duplicated.Store(dup)
		name := "PG connections cut (restart seen by clients)"
		if m == gated {
			name += " (gate)"
			if dup != 0 {
				t.Errorf("with the gate: %d duplicate effects, want 0", dup)
			}
		} else {
			name += " (unfenced control, no gate)"
		}
		chaostest.Report(t, name, "make chaos RUN=PGConnectionsCut", &c, figures)
	})
}

func mustHost(t *testing.T, raw string) string {
	t.Helper()
	u, err := url.Parse(raw)
	if err != nil {
		t.Fatal(err)
	}
	return u.Host
}
