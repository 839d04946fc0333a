package linearizability

import (
	"fmt"

	"github.com/anishathalye/porcupine"
	"github.com/idemgo/idem/storekit"
)

// kind is a store method.
type kind uint8

const (
	opAcquire kind = iota + 1
	opComplete
	opFail
	opRelease
	opExtend
	opGet
	opDelete
)

var kindNames = [...]string{"?", "acquire", "complete", "fail", "release", "extend", "get", "delete"}

func (k kind) String() string { return kindNames[k] }

// input is one call of a store method; only the fields of its kind are set.
type input struct {
	kind     kind
	key      string
	fp       string // acquire
	owner    string // acquire, and the lease of complete, fail, release, extend
	fence    int64  // the lease of complete, fail, release, extend
	result   string // complete, fail
	terminal bool   // fail
	max      int    // acquire, fail: max attempts
}

// Errors a call may answer with, as the model knows them.
const (
	errNone      = ""
	errLeaseLost = "lease-lost"
	errNotFound  = "not-found"
)

// output is a call's answer. unknown marks a call whose outcome is unknown
// (its reply was lost): it matches any answer.
type output struct {
	unknown  bool
	err      string
	outcome  storekit.Outcome // acquire
	fence    int64            // acquire (acquired), get
	attempts int              // acquire, get
	state    storekit.State   // acquire (replay), fail, get
	result   string           // acquire (replay), get
	fp       string           // get
	owner    string           // get (IN_PROGRESS only)
}

// record is the model's state of one key. It is a comparable value.
type record struct {
	present  bool
	state    storekit.State
	fp       string
	owner    string
	fence    int64 // 0: handed out by an acquire whose reply was lost
	attempts int
	result   string
	// floor is the highest fence known to have been handed out for the key,
	// kept across deletions: a new acquisition's fence must be above it.
	floor int64
}

// owns reports whether the lease (owner, fence) holds r.
func (r record) owns(owner string, fence int64) bool {
	return r.present && r.state == storekit.StateInProgress && r.owner == owner && (r.fence == fence || r.fence == 0)
}

// learn returns r with its unknown fence set to fence.
func (r record) learn(fence int64) record {
	if r.fence == 0 {
		r.fence = fence
		r.floor = max(r.floor, fence)
	}
	return r
}

// acquired returns r taken by owner with fence f (0 if unknown).
func (r record) acquired(in input, f int64, attempts int) record {
	r.present, r.state, r.owner, r.fence, r.attempts, r.result = true, storekit.StateInProgress, in.owner, f, attempts, ""
	r.floor = max(r.floor, f)
	return r
}

// newFence checks a fence handed out by a new acquisition.
func (r record) newFence(out output) bool {
	return out.unknown || out.fence > r.floor
}

// step is the sequential specification of one key:
// docs/design.md#the-state-machine and the doc comments of idem.Store, with
// leases long enough never to expire during a history (so no takeover) and
// retention long enough never to drop a record.
func step(r record, in input, out output) (bool, record) {
	u := out.unknown
	fence := func() int64 { // the fence of a new acquisition, 0 if unknown
		if u {
			return 0
		}
		return out.fence
	}
	lost := u || out.err == errLeaseLost
	switch in.kind {
	case opAcquire:
		if !r.present {
			ok := u || (out.err == errNone && out.outcome == storekit.Acquired && out.attempts == 1 && r.newFence(out))
			r.fp = in.fp
			return ok, r.acquired(in, fence(), 1)
		}
		if r.fp != in.fp {
			return u || (out.err == errNone && out.outcome == storekit.Mismatch), r
		}
		switch r.state {
		case storekit.StateCompleted, storekit.StateFailed:
			return u || (out.err == errNone && out.outcome == storekit.Replay && out.state == r.state && out.result == r.result && out.attempts == r.attempts), r
		case storekit.StateInProgress:
			if r.owner == in.owner { // repeated after a lost reply
				ok := u || (out.err == errNone && out.outcome == storekit.Acquired && out.attempts == r.attempts &&
					(out.fence == r.fence || (r.fence == 0 && r.newFence(out))))
				if !u {
					r = r.learn(out.fence)
				}
				return ok, r
			}
			return u || (out.err == errNone && out.outcome == storekit.InProgress && out.attempts == r.attempts), r
		}
		// RELEASED
		if in.max > 0 && r.attempts >= in.max {
			ok := u || (out.err == errNone && out.outcome == storekit.Replay && out.state == storekit.StateFailed && out.result == "" && out.attempts == r.attempts)
			r.state, r.owner, r.result = storekit.StateFailed, "", ""
			return ok, r
		}
		ok := u || (out.err == errNone && out.outcome == storekit.Acquired && out.attempts == r.attempts+1 && r.newFence(out))
		return ok, r.acquired(in, fence(), r.attempts+1)

	case opComplete:
		if r.present && r.state == storekit.StateCompleted && r.fence == in.fence && r.result == in.result {
			return u || out.err == errNone, r // repeated after a lost reply
		}
		if r.owns(in.owner, in.fence) {
			r = r.learn(in.fence)
			r.state, r.result = storekit.StateCompleted, in.result
			return u || out.err == errNone, r
		}
		return lost, r

	case opFail:
		if r.present && (r.state == storekit.StateReleased || r.state == storekit.StateFailed) && r.fence == in.fence {
			return u || (out.err == errNone && out.state == r.state), r
		}
		if r.owns(in.owner, in.fence) {
			r = r.learn(in.fence)
			if in.terminal || (in.max > 0 && r.attempts >= in.max) {
				r.state, r.result = storekit.StateFailed, in.result
			} else {
				r.state, r.result = storekit.StateReleased, ""
			}
			return u || (out.err == errNone && out.state == r.state), r
		}
		return lost, r

	case opRelease:
		if r.present && r.state == storekit.StateReleased && r.fence == in.fence {
			return u || out.err == errNone, r
		}
		if r.owns(in.owner, in.fence) {
			r = r.learn(in.fence)
			r.state, r.result = storekit.StateReleased, ""
			return u || out.err == errNone, r
		}
		return lost, r

	case opExtend:
		if r.owns(in.owner, in.fence) {
			return u || out.err == errNone, r.learn(in.fence)
		}
		return lost, r

	case opGet:
		if u {
			return true, r
		}
		if !r.present {
			return out.err == errNotFound, r
		}
		ok := out.err == errNone && out.state == r.state && out.fp == r.fp && out.attempts == r.attempts && out.result == r.result &&
			(out.fence == r.fence || (r.fence == 0 && r.newFence(out)))
		if r.state == storekit.StateInProgress {
			ok = ok && out.owner == r.owner
		}
		if ok {
			r = r.learn(out.fence)
		}
		return ok, r

	case opDelete:
		return u || out.err == errNone, record{floor: r.floor}
	}
	return false, r
}

// model is the porcupine model of the store: one record per key, partitioned
// by key.
var model = porcupine.Model{
	Partition: func(history []porcupine.Operation) [][]porcupine.Operation {
		byKey := map[string][]porcupine.Operation{}
		var keys []string
		for _, op := range history {
			k := op.Input.(input).key
			if _, ok := byKey[k]; !ok {
				keys = append(keys, k)
			}
			byKey[k] = append(byKey[k], op)
		}
		parts := make([][]porcupine.Operation, 0, len(keys))
		for _, k := range keys {
			parts = append(parts, byKey[k])
		}
		return parts
	},
	Init: func() any { return record{} },
	Step: func(state, in, out any) (bool, any) {
		return step(state.(record), in.(input), out.(output))
	},
	DescribeOperation: func(in, out any) string {
		i, o := in.(input), out.(output)
		var call string
		switch i.kind {
		case opAcquire:
			call = fmt.Sprintf("acquire(%s, owner %s, max %d)", i.fp, i.owner, i.max)
		case opGet, opDelete:
			call = i.kind.String() + "()"
		case opComplete, opFail:
			call = fmt.Sprintf("%s(%s/%d, %q, terminal %v)", i.kind, i.owner, i.fence, i.result, i.terminal)
		default:
			call = fmt.Sprintf("%s(%s/%d)", i.kind, i.owner, i.fence)
		}
		switch {
		case o.unknown:
			return call + " -> unknown (reply lost)"
		case o.err != errNone:
			return call + " -> " + o.err
		case i.kind == opAcquire:
			return fmt.Sprintf("%s -> %v fence %d attempts %d %v %q", call, o.outcome, o.fence, o.attempts, o.state, o.result)
		case i.kind == opGet:
			return fmt.Sprintf("%s -> %v %s owner %s fence %d attempts %d %q", call, o.state, o.fp, o.owner, o.fence, o.attempts, o.result)
		case i.kind == opFail:
			return fmt.Sprintf("%s -> %v", call, o.state)
		}
		return call + " -> ok"
	},
	DescribeState: func(state any) string {
		r := state.(record)
		if !r.present {
			return fmt.Sprintf("absent (fence floor %d)", r.floor)
		}
		return fmt.Sprintf("%v %s owner %s fence %d attempts %d %q", r.state, r.fp, r.owner, r.fence, r.attempts, r.result)
	},
}
