package consume

import (
	"strconv"
	"testing"

	"github.com/idemgo/idem/chaos/chaostest"
	"github.com/idemgo/idem/testkit/redistest"
)

// TestConsumeRedeliveryStorm: every message sent several times to a
// stream read by three sidecar processes of its group (each with two
// consumers, batches of 10), and the first call of every fifth key in
// the handler answered 503, so that the broker delivers that entry
// again. With the gate or the fence check each key has one effect row,
// none lost. The control passes the copies on (--pass-duplicates, which
// calls the handler for a duplicate of a completed key, with
// Idempotent-Replayed and no fence) to a handler with neither check: it
// writes them, which shows how many copies the sidecars held back.
func TestConsumeRedeliveryStorm(t *testing.T) {
	t.Parallel()
	n, copies := chaostest.Size(100, 2000), chaostest.Size(5, 10)
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
			var fail []string
			for i := 0; i < n; i += 5 {
				fail = append(fail, keys[i])
			}
			h := startHandler(t, "127.0.0.1:0", d, tc.mode, envFail+"="+join(fail))
			for c := range copies {
				batch := make([]string, n)
				for i := range n {
					batch[i] = keys[(i+c*7)%n]
				}
				s.send(t, batch...)
			}
			args := []string{"--from", s.from(), "--to", h.url(), "--lease", "1s", "--concurrency", "2", "--batch", "10",
				"--retry-delay", "10ms", "--max-deliveries", "0"}
			switch tc.mode {
			case "gate":
				args = append(args, "--gate", d.url)
			case "none":
				args = append(args, "--pass-duplicates")
			}
			var procs []*chaostest.Proc
			for i := range 3 {
				procs = append(procs, sidecar(t, append(args, "--name", "s"+strconv.Itoa(i))...))
			}
			waitFor(t, "every entry settled and every key's effect written", func() bool {
				return s.settled(t) && len(d.effects(t)) == n
			})
			for _, p := range procs {
				p.Signal(15)
			}
			for _, p := range procs {
				if err := p.Wait(60e9); err != nil {
					t.Errorf("a sidecar: %v\n%s", err, p.Stderr())
				}
			}
			o := count(t, d, keys)
			pending := s.pending(t)
			o.lost += int(pending)
			report(t, "consume: broker redelivery storm, "+tc.name, "TestConsumeRedeliveryStorm", s.sent, s.sent-pending, o,
				map[string]string{"copies": strconv.Itoa(copies), "sidecars": "3", "failed_first_calls": strconv.Itoa(len(fail))})
			check(t, tc.control, o)
		})
	}
}
