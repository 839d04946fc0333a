package effects

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/idemgo/idem"
	"github.com/idemgo/idem/chaos/chaostest"
)

// applyOrderThenFail is applyOrder, then a failure after its writes, as
// ARGV[2] says: a command Redis refuses (a hash command on the stock, a
// string: WRONGTYPE), an error reply of its own, or a Lua error. Redis
// keeps the writes.
const applyOrderThenFail = applyOrder + `
if ARGV[2] == 'wrongtype' then redis.call('HSET', KEYS[1], 'f', 'v') end
if ARGV[2] == 'reply' then return redis.error_reply('refused after the writes') end
error('failed after the writes')
`

// failures are the ways the effect fails after its writes, one per key in
// turn.
var failures = []string{"wrongtype", "reply", "lua"}

// TestEffectFailsHalfWay runs k keys whose effect fails after its writes
// (stock −1, order +1, event appended, then an error), each tried m times
// through Do as a client retrying after an error: the writes stand once
// per key, since the completion call ends the key FAILED with
// idem.ErrEffectPartial and the retries get that failure. Control: the
// same writes sent by the operation as plain commands before it fails
// (what the completion did before it ended such keys FAILED: the key was
// released) are applied on every try.
func TestEffectFailsHalfWay(t *testing.T) {
	k := chaostest.Size(30, 300)
	const m = 3
	ctx := t.Context()
	// run runs the keys on a Redis of their own.
	run := func(prefix string, plain bool) (*chaostest.Counters, []string, map[string]int) {
		rdb := startRedis(t)
		exec := newExec(t, rdb, lease)
		c := &chaostest.Counters{}
		ids := make([]string, k)
		errs := map[string]int{}
		for i := range k {
			id := fmt.Sprintf("%s-%d", prefix, i)
			ids[i] = id
			how := failures[i%len(failures)]
			for range m {
				c.Attempted.Add(1)
				_, err := exec.Do(ctx, key(id), "fp", func(ctx context.Context) ([]byte, error) {
					fence, _ := idem.FenceFrom(ctx)
					c.Executed.Add(1)
					if plain {
						if err := applyPlain(ctx, rdb, id, fence); err != nil {
							return nil, err
						}
						return nil, errors.New("failed after the writes")
					}
					e := order(id)
					e.Name, e.Args = "order_then_fail", append(e.Args, how)
					return []byte("r"), idem.SetEffect(ctx, e)
				})
				var fe *idem.FailedError
				switch {
				case err == nil:
					c.Acknowledged.Add(1)
				case errors.Is(err, idem.ErrEffectPartial) && idem.IsTerminal(err):
					errs["ErrEffectPartial"]++
				case errors.As(err, &fe) && strings.Contains(fe.Message, "may have partly applied"):
					errs["FAILED, may have partly applied"]++
				default:
					errs[err.Error()]++
				}
			}
		}
		tally(t, rdb, ids, c)
		return c, ids, errs
	}
	c, _, errs := run("half", false)
	if c.Duplicated.Load() != 0 || c.Executed.Load() != int64(k) || c.Effects.Load() != int64(k) {
		t.Errorf("with the effect: %d effects (%d duplicated) and %d executions for %d keys × %d tries, want %d, 0 and %d",
			c.Effects.Load(), c.Duplicated.Load(), c.Executed.Load(), k, m, k, k)
	}
	if errs["ErrEffectPartial"] != k || errs["FAILED, may have partly applied"] != k*(m-1) {
		t.Errorf("with the effect: errors %v, want %d ErrEffectPartial and %d replayed failures", errs, k, k*(m-1))
	}
	control, _, _ := run("control", true)
	if control.Duplicated.Load() != int64(k*(m-1)) {
		t.Errorf("control: %d duplicated, want %d: the test cannot see a duplicate", control.Duplicated.Load(), k*(m-1))
	}
	chaostest.Report(t, "effect: fails after its writes, retried", command("TestEffectFailsHalfWay"), c, map[string]string{
		"tries_per_key":      fmt.Sprint(m),
		"err_partial":        fmt.Sprint(errs["ErrEffectPartial"]),
		"replayed_failures":  fmt.Sprint(errs["FAILED, may have partly applied"]),
		"control_effects":    fmt.Sprint(control.Effects.Load()),
		"control_duplicated": fmt.Sprint(control.Duplicated.Load()),
	})
}
