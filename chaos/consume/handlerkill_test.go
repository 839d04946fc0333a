package consume

import (
	"strconv"
	"testing"

	"github.com/idemgo/idem/chaos/chaostest"
	"github.com/idemgo/idem/testkit/redistest"
)

// TestConsumeHandlerKilled: the handler process is killed (SIGKILL) in
// the middle of a call and started again on its address; the sidecar
// sends the call again with the same fence (a reset connection, refused
// ones, then the new process's answer). Several rounds, one kill each, either before the
// call's effect or after its transaction committed and before its
// answer. Killed before the effect, nothing is written twice with any
// handler. Killed after the commit, the sidecar sends the call again with
// the same fence once the handler is back: the fence check finds its own
// fence stored (applied already) and answers 200 without a second row,
// and the gate's sidecar finds the completion row and acks without a
// call; the control writes a second row per kill.
//
// The to-batch variants send each batch in one request (--to-batch); the
// handler applies its messages in order and is killed after the held
// one's commit, the messages before it in the batch applied too: the
// batch sent again with the same fences finds every applied message's
// own fence (fence check) or its completion row (gate), and the control
// writes a second row for each of them.
//
// The late variants kill nothing: the handler commits and answers only
// after the sidecar's --handler-timeout (1 s). The sidecar gives the call
// up and releases the key, and the entry's next delivery is a new
// acquisition with a higher fence, which the fence check cannot tell
// from a new owner's: a second row per late answer (a limit of the fence
// check, measured here); the gate's sidecar finds the completion row and
// acks without a call.
func TestConsumeHandlerKilled(t *testing.T) {
	t.Parallel()
	n, rounds := chaostest.Size(40, 1000), chaostest.Size(2, 8)
	for _, tc := range []struct {
		name, mode, at, batch string
		dup                   bool // a second row per kill is expected (at least, toBatch)
		toBatch               bool
	}{
		{"gate/before-effect", "gate", "before", "10", false, false},
		{"gate/after-commit", "gate", "after", "10", false, false},
		{"fence/before-effect", "fence", "before", "1", false, false},
		{"fence/after-commit", "fence", "after", "1", false, false},
		{"fence/after-commit/batch10", "fence", "after", "10", false, false},
		{"control/after-commit", "none", "after", "1", true, false},
		{"fence/after-commit/to-batch", "fence", "after", "10", false, true},
		{"gate/after-commit/to-batch", "gate", "after", "10", false, true},
		{"control/after-commit/to-batch", "none", "after", "10", true, true},
		{"gate/late", "gate", "late", "10", false, false},
		{"fence/late", "fence", "late", "10", true, false},
		{"control/late", "none", "late", "10", true, false},
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
			h := startHandler(t, "127.0.0.1:0", d, tc.mode, envHold+"="+join(hold), envHoldAt+"="+tc.at)
			s.send(t, keys...)
			to, url := "--to", h.url()
			if tc.toBatch {
				to, url = "--to-batch", h.url()+"batch"
			}
			args := []string{"--from", s.from(), to, url, "--lease", "1s", "--batch", tc.batch,
				"--retry-delay", "10ms", "--max-deliveries", "0", "--name", "s"}
			if tc.mode == "gate" {
				args = append(args, "--gate", d.url)
			}
			scenario := "consume: handler SIGKILL mid-call, "
			if tc.at == "late" {
				args = append(args, "--handler-timeout", "1s", "--parallel", "10")
				scenario = "consume: handler answers after --handler-timeout, "
			}
			p := sidecar(t, args...)
			for r := range rounds {
				h.held()
				if tc.at == "late" {
					continue
				}
				h.proc.Kill()
				// Started again; the keys held in later rounds are held
				// by the new process.
				h = startHandler(t, h.addr, d, tc.mode, envHold+"="+join(hold[r+1:]), envHoldAt+"="+tc.at)
			}
			waitFor(t, "every entry settled and every key's effect written", func() bool {
				return s.settled(t) && len(d.effects(t)) == n
			})
			if tc.at == "late" {
				h.release(rounds)
			}
			p.Signal(15)
			if err := p.Wait(60e9); err != nil {
				t.Errorf("the sidecar: %v\n%s", err, p.Stderr())
			}
			o := count(t, d, keys)
			pending := s.pending(t)
			o.lost += int(pending)
			report(t, scenario+tc.name, "TestConsumeHandlerKilled", s.sent, s.sent-pending, o,
				map[string]string{"kills": strconv.Itoa(rounds), "batch": tc.batch})
			if o.lost != 0 {
				t.Errorf("%d of %d keys lost, want 0", o.lost, o.keys)
			}
			switch {
			case tc.dup && tc.toBatch && o.duplicated < rounds:
				t.Errorf("%d duplicate effects, want at least %d (the held message and those before it in its batch, per kill)", o.duplicated, rounds)
			case tc.dup && !tc.toBatch && o.duplicated != rounds:
				t.Errorf("%d duplicate effects, want %d (one per kill after the commit or late answer: the call made again writes again)", o.duplicated, rounds)
			case !tc.dup && o.duplicated != 0:
				t.Errorf("%d duplicate effects over %d keys, want 0", o.duplicated, o.keys)
			}
		})
	}
}
