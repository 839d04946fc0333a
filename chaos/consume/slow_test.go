package consume

import (
	"strconv"
	"testing"

	"github.com/idemgo/idem/chaos/chaostest"
	"github.com/idemgo/idem/testkit/redistest"
)

// TestConsumeSlowHandlerTakeover: the handler is slower than the lease
// (it holds a call) and the sidecar cannot extend the lease: its link to
// the store (the stream's redis-server, through a TCP proxy) is cut while
// the call is held. Once the lease expired, a second sidecar claims the
// entry, takes the key over with a higher fence and finishes the stream;
// then the slow call goes on and writes as a stale owner. Several rounds,
// one cut each. With the gate or the fence check the stale write is
// refused: one effect row per key, none lost; the control writes a
// second row per round.
func TestConsumeSlowHandlerTakeover(t *testing.T) {
	t.Parallel()
	n, rounds := chaostest.Size(60, 2000), chaostest.Size(2, 8)
	for _, tc := range []struct {
		name, mode string
		control    bool
	}{
		{"gate", "gate", false},
		{"fence", "fence", false},
		{"control", "none", true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			d := newDB(t)
			srv := redistest.Start(t)
			s := &stream{rdb: srv.GoRedis(t), addr: srv.Addr(), name: "jobs", group: "g"}
			keys := keyNames(n)
			var hold []string
			for r := range rounds {
				hold = append(hold, keys[(r+1)*n/(rounds+1)])
			}
			h := startHandler(t, "127.0.0.1:0", d, tc.mode, envHold+"="+join(hold), envHoldAt+"=before")
			s.send(t, keys...)
			args := func(redisAddr, name string) []string {
				a := []string{"--from", "redis-stream://" + redisAddr + "/" + s.name + "?group=" + s.group, "--to", h.url(),
					"--lease", "1s", "--batch", "1", "--retry-delay", "10ms", "--name", name}
				if tc.mode == "gate" {
					a = append(a, "--gate", d.url)
				}
				return a
			}
			for r := range rounds {
				link := chaostest.StartNetProxy(t, srv.Addr())
				sidecar(t, args(link.Addr(), "s"+strconv.Itoa(r))...)
				h.held()
				link.Disable() // the lease can no longer be extended
			}
			last := sidecar(t, args(srv.Addr(), "last")...)
			waitFor(t, "every entry settled and every key's effect written", func() bool {
				return s.settled(t) && len(d.effects(t)) == n
			})
			h.release(rounds)
			last.Signal(15)
			if err := last.Wait(60e9); err != nil {
				t.Errorf("the last sidecar: %v\n%s", err, last.Stderr())
			}
			o := count(t, d, keys)
			pending := s.pending(t)
			o.lost += int(pending)
			report(t, "consume: handler slower than the lease, takeover, "+tc.name, "TestConsumeSlowHandlerTakeover", s.sent, s.sent-pending, o,
				map[string]string{"takeovers": strconv.Itoa(rounds)})
			check(t, tc.control, o)
		})
	}
}
