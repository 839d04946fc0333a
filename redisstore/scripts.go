package redisstore

import (
	"crypto/sha1"
	_ "embed"
	"encoding/hex"
	"fmt"
	"time"

	"github.com/idemgo/idem"
	"github.com/idemgo/idem/redisstore/internal/backend"
	"github.com/idemgo/idem/storekit"
	"github.com/idemgo/idem/storekit/statemachine"
)

// script is one Lua script, as every client backend sends it
// (backend.Script: EVALSHA, EVAL after NOSCRIPT, or FCALL). In Functions
// mode the same source is the body of the function Fn of the library lib
// (see functions.go), which buildLibrary sets.
type script struct {
	backend.Script
	lib *library // Functions mode: the library that defines Fn
}

// registry holds every script made with newScript: Functions mode loads
// them all as one library (coreLibrary), so a script added to the package
// is a function of the library with no other change.
var registry []*script

// newScript makes a script of the package and registers it for Functions
// mode. It is called when the package's variables are initialized.
func newScript(name, src string) *script {
	s := makeScript(name, src)
	registry = append(registry, s)
	return s
}

// newReadOnlyScript is newScript for a script that writes nothing: in
// Functions mode it is a no-writes function, called with FCALL_RO (which a
// client may send to a replica).
func newReadOnlyScript(name, src string) *script {
	s := newScript(name, src)
	s.RO = true
	return s
}

// makeScript makes a script that is not part of the package's library (a
// registered effect's).
func makeScript(name, src string) *script {
	sum := sha1.Sum([]byte(src))
	return &script{Script: backend.Script{Name: name, Src: src, SHA: hex.EncodeToString(sum[:])}}
}

var (
	// The .lib.lua files define the transitions as Lua functions; the batch
	// scripts (and complete_ack.lua) are sent with their library prepended.
	// acquire.lua and complete.lua, the hot path of every Do, carry the
	// same transitions inline: a script that defines and calls a function
	// costs about 6% more Redis time per call (redis-benchmark, 64
	// connections, pipeline 16). The conformance suite runs on both forms
	// (TestConformance, TestConformanceBatchScripts).

	//go:embed lua/acquire.lib.lua
	acquireLib string
	//go:embed lua/complete.lib.lua
	completeLib string

	//go:embed lua/acquire.lua
	acquireSrc string
	//go:embed lua/acquire_many.lua
	acquireManySrc string
	//go:embed lua/complete.lua
	completeSrc string
	//go:embed lua/complete_many.lua
	completeManySrc string
	//go:embed lua/fail.lua
	failSrc string
	//go:embed lua/release.lua
	releaseSrc string
	//go:embed lua/extend.lua
	extendSrc string
	//go:embed lua/get.lua
	getSrc string
	//go:embed lua/relay.lua
	relaySrc string

	acquireScript      = newScript("acquire", acquireSrc)
	acquireManyScript  = newScript("acquire_many", acquireLib+acquireManySrc)
	completeScript     = newScript("complete", completeSrc)
	completeManyScript = newScript("complete_many", completeLib+completeManySrc)
	failScript         = newScript("fail", failSrc)
	releaseScript      = newScript("release", releaseSrc)
	extendScript       = newScript("extend", extendSrc)
	getScript          = newReadOnlyScript("get", getSrc)
	relayScript        = newScript("relay", relaySrc)
)

// Replies are normalized by the client adapters to nil, int64, string and
// []any, the shapes go-redis returns; each script's reply is parsed by one
// function below.

func replyError(name string, v any) error { return backend.ReplyError(name, v) }

func asInt(v any) (int64, bool) { return backend.AsInt(v) }

func asString(v any) (string, bool) {
	s, ok := v.(string)
	return s, ok
}

// parseAcquire parses the reply of acquire.lua, or an element of
// acquire_many.lua's.
func parseAcquire(v any) (storekit.Acquisition, error) {
	if fence, ok := v.(int64); ok && fence > 0 {
		// The short form of {1, fence, 1}, a new record, in acquire.lua's
		// and acquire_many.lua's replies.
		return storekit.Acquisition{Outcome: storekit.Acquired, Lease: storekit.Lease{Fence: fence}, Attempts: 1}, nil
	}
	arr, ok := v.([]any)
	if !ok || len(arr) == 0 {
		return storekit.Acquisition{}, replyError("acquire", v)
	}
	code, ok := asInt(arr[0])
	if !ok {
		return storekit.Acquisition{}, replyError("acquire", v)
	}
	var a storekit.Acquisition
	switch {
	case code == 5 && len(arr) == 1:
		a.Outcome = storekit.Mismatch
		return a, nil
	case (code == 1 && len(arr) == 3) || (code == 2 && len(arr) == 4):
		fence, ok1 := asInt(arr[1])
		attempts, ok2 := asInt(arr[2])
		if !ok1 || !ok2 {
			break
		}
		a.Outcome, a.Lease.Fence, a.Attempts = storekit.Acquired, fence, int(attempts)
		if code == 2 {
			a.Outcome = storekit.TakenOver
			a.PreviousOwner, _ = asString(arr[3])
		}
		return a, nil
	case code == 3 && len(arr) == 3:
		left, ok1 := asInt(arr[1])
		attempts, ok2 := asInt(arr[2])
		if !ok1 || !ok2 {
			break
		}
		a.Outcome, a.RetryAfter, a.Attempts = storekit.InProgress, time.Duration(left)*time.Microsecond, int(attempts)
		return a, nil
	case code == 4 && len(arr) == 4:
		st, ok1 := asString(arr[1])
		attempts, ok2 := asInt(arr[2])
		result, ok3 := asString(arr[3])
		state, ok4 := statemachine.ParseState(st)
		if !ok1 || !ok2 || !ok3 || !ok4 {
			break
		}
		a.Outcome, a.State, a.Attempts = storekit.Replay, state, int(attempts)
		if result != "" {
			a.Result = []byte(result)
		}
		return a, nil
	}
	return storekit.Acquisition{}, replyError("acquire", v)
}

// parseOK parses the 1/0 reply of complete.lua, release.lua and extend.lua.
func parseOK(name string, v any) error {
	n, ok := asInt(v)
	switch {
	case ok && n == 1:
		return nil
	case ok && n == 0:
		return fmt.Errorf("%w: the record is no longer held by this owner and fence", idem.ErrLeaseLost)
	}
	return replyError(name, v)
}

// parseFail parses the reply of fail.lua.
func parseFail(v any) (storekit.State, error) {
	if s, ok := v.(string); ok {
		if st, ok := statemachine.ParseState(s); ok && (st == storekit.StateReleased || st == storekit.StateFailed) {
			return st, nil
		}
	}
	if err := parseOK("fail", v); err != nil {
		return 0, err
	}
	return 0, replyError("fail", v)
}

// parseGet parses the reply of get.lua.
func parseGet(v any) (storekit.Record, error) {
	arr, ok := v.([]any)
	if !ok || len(arr) != 10 {
		return storekit.Record{}, replyError("get", v)
	}
	now, ok1 := asInt(arr[0])
	ttl, ok2 := asInt(arr[1])
	st, ok3 := asString(arr[2])
	if !ok1 || !ok2 || !ok3 {
		return storekit.Record{}, replyError("get", v)
	}
	if st == "" {
		return storekit.Record{}, storekit.ErrNotFound
	}
	state, ok := statemachine.ParseState(st)
	if !ok {
		return storekit.Record{}, replyError("get", v)
	}
	// A field of the wrong type means a value idem's scripts did not
	// write: refuse it rather than read it as empty.
	bad := false
	str := func(i int) string {
		s, ok := arr[i].(string)
		bad = bad || !ok
		return s
	}
	num := func(i int) int64 {
		n, ok := arr[i].(int64)
		bad = bad || !ok
		return n
	}
	rec := storekit.Record{
		State:       state,
		Fingerprint: str(3),
		Owner:       str(4),
		Fence:       num(5),
		Attempts:    int(num(7)),
		Now:         time.UnixMicro(now),
	}
	if c := num(8); c != 0 { // 0 in a record the relay wrote
		rec.Created = time.UnixMicro(c)
	}
	if r := str(9); r != "" {
		rec.Result = []byte(r)
	}
	if l := num(6); state == storekit.StateInProgress {
		rec.LeaseUntil = time.UnixMicro(l)
	}
	if bad {
		return storekit.Record{}, fmt.Errorf("redisstore: get: a record field has the wrong type: %w", replyError("get", v))
	}
	if ttl >= 0 {
		rec.ExpiresAt = rec.Now.Add(time.Duration(ttl) * time.Millisecond)
	}
	return rec, nil
}

// parseRelay parses the reply of relay.lua: 1 written, 2 already
// COMPLETED; both are success.
func parseRelay(v any) error {
	if n, ok := asInt(v); ok && (n == 1 || n == 2) {
		return nil
	}
	return replyError("relay", v)
}
