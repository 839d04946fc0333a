package consume

import (
	"strconv"
	"testing"

	"github.com/idemgo/idem/chaos/chaostest"
	"github.com/idemgo/idem/testkit/redistest"
)

// TestConsumeSidecarKilled: the sidecar is killed (SIGKILL) while the handler
// runs one of its messages; a new sidecar of the group takes the message
// over once the lease expired, with a higher fence, and finishes the
// stream. Then the killed sidecar's call goes on (the handler does not
// watch its client) and tries to write. Several rounds, one kill each.
// The held call is the sixth of a batch of 10. With the gate, or the
// fence check (with --batch 1 or 10), each key has one effect row and
// none is lost: the calls of the killed batch that had answered were
// completed as each answered (consumer.WithCompleteEach), so they are not
// made again. Without either (the control) the stale call writes a
// second.
func TestConsumeSidecarKilled(t *testing.T) {
	t.Parallel()
	n, rounds := chaostest.Size(60, 2000), chaostest.Size(2, 8)
	for _, tc := range []struct {
		name, mode string
		batch      string
		control    bool
	}{
		{"gate", "gate", "10", false},
		{"fence", "fence", "1", false},
		{"fence/batch10", "fence", "10", false},
		{"control", "none", "1", true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			d := newDB(t)
			srv := redistest.Start(t)
			s := &stream{rdb: srv.GoRedis(t), addr: srv.Addr(), name: "jobs", group: "g"}
			keys := keyNames(n)
			var hold []string
			for r := range rounds {
				hold = append(hold, keys[(r+1)*n/(rounds+1)+5]) // in the middle of a batch of 10
			}
			h := startHandler(t, "127.0.0.1:0", d, tc.mode, envHold+"="+join(hold), envHoldAt+"=before")
			s.send(t, keys...)
			args := []string{"--from", s.from(), "--to", h.url(), "--lease", "1s", "--batch", tc.batch, "--retry-delay", "10ms"}
			if tc.mode == "gate" {
				args = append(args, "--gate", d.url)
			}
			for r := range rounds {
				p := sidecar(t, append(args, "--name", "s"+strconv.Itoa(r))...)
				h.held()
				p.Kill()
			}
			last := sidecar(t, append(args, "--name", "last")...)
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
			report(t, "consume: sidecar SIGKILL mid-call, "+tc.name, "TestConsumeSidecarKilled", s.sent, s.sent-pending, o,
				map[string]string{"kills": strconv.Itoa(rounds), "batch": tc.batch})
			check(t, tc.control, o)
		})
	}
}

// check asserts the counts: nothing lost and one effect per key, or,
// for a variant that must show the failure (the control), duplicates.
func check(t *testing.T, control bool, o outcome) {
	t.Helper()
	if o.lost != 0 {
		t.Errorf("%d of %d keys lost (no effect row or still pending), want 0", o.lost, o.keys)
	}
	switch {
	case control && o.duplicated == 0:
		t.Errorf("no duplicate effect: this variant must show the duplicates (the scenario no longer sees the failure)")
	case !control && o.duplicated != 0:
		t.Errorf("%d duplicate effects over %d keys, want 0 (one row per key)", o.duplicated, o.keys)
	}
}

func join(keys []string) string {
	s := ""
	for i, k := range keys {
		if i > 0 {
			s += ","
		}
		s += k
	}
	return s
}
