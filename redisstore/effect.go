package redisstore

import (
	"context"
	_ "embed"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/idemgo/idem"
	"github.com/idemgo/idem/redisstore/internal/backend"
	"github.com/idemgo/idem/storekit"
	"github.com/idemgo/idem/storekit/statemachine"
)

var (
	//go:embed lua/complete_effect.lua
	completeEffectSrc string
	//go:embed lua/effect.lib.lua
	effectLib string
)

// Limits on a registered effect and on one application of it.
const (
	// MaxEffectNameLen is the longest effect name.
	MaxEffectNameLen = 64
	// MaxEffectKeys is the largest number of keys of one Effect.
	MaxEffectKeys = 256
	// MaxEffectArgs is the largest number of arguments of one Effect.
	MaxEffectArgs = 4096
)

// effectDef is an effect given to WithEffect.
type effectDef struct{ name, body string }

// WithEffect registers the Redis-side effect name, applied with the
// completion of a record when the operation attached a storekit.Effect of that
// name (idem.SetEffect): atomically, in the completion's script or function
// call, after the check that the caller still owns the record and before
// the COMPLETED write (docs/design.md#redis-scripts-functions-and-effects).
// So the effect happens once per key, exactly when the completion does: a
// stale owner's effect is never applied, and a completion repeated after a
// lost reply finds the record completed by its own fence and does not apply
// the effect again.
//
// body is the body of a Lua function called as effect(KEYS, ARGV, FENCE):
// KEYS are the Effect's Keys, ARGV its Args, both as an EVAL script sees
// them, and FENCE the attempt's fencing token as a decimal string. Its
// return value is ignored, except an error: a body that raises one (error,
// a failing redis.call) or returns redis.error_reply(message) fails the
// completion: no COMPLETED record is written (nor, for CompleteAndAck, the
// XACK), and the call returns an *storekit.EffectError with the message.
//
// Redis does not undo what a script wrote before it failed, so the store
// tells two failures apart by what the body's redis.call and redis.pcall
// did. A body that fails before its first write (no command but reads such
// as GET, HGET, EXISTS, TYPE, TTL, LRANGE or ZSCORE succeeded: the list is
// in lua/effect.lib.lua; a command that Redis refused, such as a WRONGTYPE,
// OOM or ACL error, wrote nothing) changed nothing: the record stays
// IN_PROGRESS and the failure policy releases or fails the key, as for an
// operation's own error. A body that fails after it may have written ends
// the record FAILED in the same call, and the error wraps
// idem.ErrEffectPartial: no retry runs the operation and its first writes
// again (a broker consumer dead-letters the message), and what it wrote
// needs looking at. So a body checks everything it can (types, amounts,
// stock) before its first write — "validate before the first write" — as
// idem's own scripts do, and a refusal before that write leaves the key
// free for a retry. For example:
//
//	redisstore.WithEffect("reserve", `
//	  local stock = tonumber(redis.call('GET', KEYS[1]) or '0')
//	  local n = tonumber(ARGV[1])
//	  if not n or n <= 0 then return redis.error_reply('bad amount') end
//	  if stock < n then return redis.error_reply('out of stock') end
//	  redis.call('DECRBY', KEYS[1], n)
//	  redis.call('XADD', KEYS[2], '*', 'sku', ARGV[2], 'n', n, 'fence', FENCE)`)
//
// Effects run as scripts (one per effect: the completion, the body, then
// the effect's call, cached by SHA) or, with WithFunctions, as a second
// library idemfx_<version> loaded beside idem's. On a Cluster, and with a
// hash tag, every key of an Effect must carry the record's hash tag (see
// EffectKey); CheckEffect refuses other keys before anything is sent. The
// commands a body calls must be allowed to the Redis user (ACL).
//
// name must be 1 to MaxEffectNameLen letters, digits or underscores, and
// registered once per store. The default is no effects.
func WithEffect(name, body string) Option {
	return func(c *config) { c.effects = append(c.effects, effectDef{name, body}) }
}

// buildEffects makes the scripts of the registered effects, and in
// Functions mode their library.
func buildEffects(defs []effectDef, functions bool) (map[string]*script, error) {
	if len(defs) == 0 {
		return nil, nil
	}
	m := make(map[string]*script, len(defs))
	scripts := make([]*script, 0, len(defs))
	for _, d := range defs {
		if err := validEffectName(d.name); err != nil {
			return nil, err
		}
		if _, dup := m[d.name]; dup {
			return nil, fmt.Errorf("%w: effect %q registered twice", idem.ErrInvalid, d.name)
		}
		if strings.TrimSpace(d.body) == "" {
			return nil, fmt.Errorf("%w: effect %q has an empty body", idem.ErrInvalid, d.name)
		}
		src := completeLib + effectLib + "local function effect(KEYS, ARGV, FENCE)\nlocal redis = tracked\n" + d.body + "\nend\n" + completeEffectSrc
		sc := makeScript(d.name, src)
		m[d.name] = sc
		scripts = append(scripts, sc)
	}
	if functions {
		buildLibrary("idemfx", scripts)
	}
	return m, nil
}

func validEffectName(name string) error {
	if name == "" || len(name) > MaxEffectNameLen {
		return fmt.Errorf("%w: effect name %q is not 1 to %d bytes", idem.ErrInvalid, name, MaxEffectNameLen)
	}
	for _, r := range name {
		if !(r == '_' || r >= '0' && r <= '9' || r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z') {
			return fmt.Errorf("%w: effect name %q has a character other than a letter, a digit or '_'", idem.ErrInvalid, name)
		}
	}
	return nil
}

// EffectKey returns a key name for an effect's data that carries the hash
// tag of key's record, so that the completion call may touch both on a
// Redis Cluster: "{<tag>}<name>", where tag is the store's hash tag
// (WithHashTag) or, without one, the digest of key — then the data belongs
// to that one record's slot, and data shared by many records (a stock
// counter) needs a store with a hash tag. On a standalone server without a
// hash tag any key name may be used instead.
func (s *Store) EffectKey(key idem.Key, name string) string {
	tag := s.tag
	if tag == "" {
		tag = key.Digest()
	}
	return "{" + tag + "}" + name
}

// CheckEffect implements storekit.EffectStore: it reports, without I/O, whether
// e names an effect registered with WithEffect, has at most MaxEffectKeys
// keys and MaxEffectArgs arguments, no empty key, does not name the record
// itself, and — on a Cluster or with a hash tag — whether every key carries
// the hash tag of key's record (EffectKey makes such keys). Errors wrap
// idem.ErrInvalid.
func (s *Store) CheckEffect(key string, e storekit.Effect) error {
	if err := storekit.ValidateStoreKey(key); err != nil {
		return err
	}
	if _, ok := s.effects[e.Name]; !ok {
		return fmt.Errorf("%w: no effect %q is registered with the store (redisstore.WithEffect)", idem.ErrInvalid, e.Name)
	}
	if len(e.Keys) > MaxEffectKeys || len(e.Args) > MaxEffectArgs {
		return fmt.Errorf("%w: effect %q has %d keys and %d arguments, over the limits of %d and %d",
			idem.ErrInvalid, e.Name, len(e.Keys), len(e.Args), MaxEffectKeys, MaxEffectArgs)
	}
	record := s.Key(key)
	tag := ""
	if s.tag != "" || s.isCluster() {
		tag = KeyHashTag(record)
	}
	for _, k := range e.Keys {
		switch {
		case k == "":
			return fmt.Errorf("%w: effect %q has an empty key", idem.ErrInvalid, e.Name)
		case k == record:
			return fmt.Errorf("%w: effect %q names idem's own record", idem.ErrInvalid, e.Name)
		case tag != "" && KeyHashTag(k) != tag:
			return fmt.Errorf("%w: effect %q key %q has hash tag %q, want the record's %q (make it with Store.EffectKey)",
				idem.ErrInvalid, e.Name, k, KeyHashTag(k), tag)
		}
	}
	return nil
}

// CompleteEffect implements storekit.EffectStore: Complete with the registered
// effect e applied in the same script or function call (see WithEffect). It
// returns an error wrapping idem.ErrLeaseLost, and applies nothing, when
// the caller no longer owns the record; an *storekit.EffectError, and writes no
// COMPLETED record, when the effect failed: before its first write the
// record stays IN_PROGRESS; after it, the record ends FAILED with
// e.PartialResult() and the error wraps idem.ErrEffectPartial, again when
// the call is repeated (see WithEffect). Repeating a call that
// succeeded (same lease and result) succeeds again and does not apply e
// again. With WithWait or WithWaitAOF it waits as Complete does. result
// must not be modified during the call. It is safe for concurrent use.
func (s *Store) CompleteEffect(ctx context.Context, key string, lease storekit.Lease, result []byte, retention time.Duration, e storekit.Effect) error {
	if err := statemachine.CheckLease(key, lease); err != nil {
		return err
	}
	if err := storekit.ValidateDuration("retention", retention); err != nil {
		return err
	}
	if err := s.CheckEffect(key, e); err != nil {
		return err
	}
	c := s.effectCall(key, lease, result, retention, e, "", "", "")
	reply, err := s.runKeys(ctx, s.effects[e.Name], c.Keys, c.Args, true)
	if reply == nil {
		return effectError(e.Name, err)
	}
	if perr := parseOK(e.Name, reply); perr != nil {
		return perr
	}
	return err // nil or ErrNotDurable
}

// effectCall is the call of complete_effect.lua for e: with an XACK of the
// entry id of stream in group when group is not "".
func (s *Store) effectCall(key string, lease storekit.Lease, result []byte, retention time.Duration, e storekit.Effect, stream, group, id string) evalCall {
	c := evalCall{Keys: make([]string, 0, 2+len(e.Keys)), Args: make([]string, 0, 9+len(e.Args))}
	c.Keys = append(c.Keys, s.Key(key))
	if group != "" {
		c.Keys = append(c.Keys, stream)
	}
	c.Keys = append(c.Keys, e.Keys...)
	c.Args = append(c.Args, lease.Owner, strconv.FormatInt(lease.Fence, 10), bytesArg(result), ms(retention), s.pub, s.channel(key), group, id,
		bytesArg(e.PartialResult()))
	c.Args = append(c.Args, e.Args...)
	return c
}

// The error replies of complete_effect.lua for an effect that failed
// before its first write (the record is still IN_PROGRESS) and for one
// that failed after it may have written (the record is FAILED).
const (
	effectErrorPrefix   = "IDEMEFFECT "
	effectPartialPrefix = "IDEMPARTIAL "
)

// effectError turns the error reply of a failed effect into an
// *storekit.EffectError (wrapped with the store's context); other errors are
// returned as they are.
func effectError(name string, err error) error {
	msg, ok := backend.ServerError(err)
	if !ok {
		return err
	}
	e := &storekit.EffectError{Name: name}
	var found bool
	if e.Message, found = strings.CutPrefix(msg, effectPartialPrefix); found {
		e.Partial = true
	} else if e.Message, found = strings.CutPrefix(msg, effectErrorPrefix); !found {
		return err
	}
	return fmt.Errorf("redisstore: %w", e)
}

// CompleteEffectBatch implements storekit.EffectBatchStore: CompleteBatch
// where effects[i], when not nil, is applied with the completion of
// keys[i] as CompleteEffect applies it. The records without an effect go
// as CompleteBatch sends them; each record with one is one call of its
// effect's script or function (atomic for that record), and those calls
// go in one pipeline per registered effect (on a Cluster, one per node),
// so a batch of records with one effect costs two round trips at most.
// A store configured with WithWait or WithWaitAOF refuses batches (every
// error wraps idem.ErrInvalid). The results must not be modified during
// the call. It is safe for concurrent use.
func (s *Store) CompleteEffectBatch(ctx context.Context, keys []string, leases []storekit.Lease, results [][]byte, retention time.Duration, effects []*storekit.Effect) []error {
	errs := make([]error, len(keys))
	if len(leases) != len(keys) || len(results) != len(keys) || len(effects) != len(keys) {
		for i := range errs {
			errs[i] = fmt.Errorf("%w: %d keys, %d leases, %d results and %d effects", idem.ErrInvalid, len(keys), len(leases), len(results), len(effects))
		}
		return errs
	}
	var plain, withEffect []int
	for i, e := range effects {
		if e == nil {
			plain = append(plain, i)
		} else {
			withEffect = append(withEffect, i)
		}
	}
	if len(withEffect) == 0 {
		return s.CompleteBatch(ctx, keys, leases, results, retention)
	}
	if len(plain) > 0 {
		perrs := s.CompleteBatch(ctx, subset(keys, plain), subset(leases, plain), subset(results, plain), retention)
		for k, i := range plain {
			errs[i] = perrs[k]
		}
	}
	retentionErr := storekit.ValidateDuration("retention", retention)
	acks := make([]StreamAck, len(keys))
	idx := make([]int, 0, len(withEffect))
	for _, i := range withEffect {
		switch {
		case s.wait != nil:
			errs[i] = errBatchWait
		case retentionErr != nil:
			errs[i] = retentionErr
		default:
			if errs[i] = statemachine.CheckLease(keys[i], leases[i]); errs[i] == nil {
				acks[i] = StreamAck{Key: keys[i], Lease: leases[i], Result: results[i], Effect: effects[i]}
				idx = append(idx, i)
			}
		}
	}
	if len(idx) > 0 {
		s.completeAckEffects(ctx, "", "", retention, acks, idx, errs)
	}
	return errs
}

var _ storekit.EffectBatchStore = (*Store)(nil)

// completeAckEffects completes the elements idx of acks that carry an
// effect and, when group is not "", acknowledges their entries of stream:
// each in one call of its effect's script (all in one pipeline per
// effect), and sets errs.
func (s *Store) completeAckEffects(ctx context.Context, stream, group string, retention time.Duration, acks []StreamAck, idx []int, errs []error) {
	byName := map[string][]int{}
	for _, i := range idx {
		if err := s.CheckEffect(acks[i].Key, *acks[i].Effect); err != nil {
			errs[i] = err
			continue
		}
		byName[acks[i].Effect.Name] = append(byName[acks[i].Effect.Name], i)
	}
	for name, is := range byName {
		calls := make([]evalCall, len(is))
		for k, i := range is {
			a := acks[i]
			calls[k] = s.effectCall(a.Key, a.Lease, a.Result, retention, *a.Effect, stream, group, a.ID)
		}
		replies, rerrs := s.runMulti(ctx, s.effects[name], calls)
		for k, i := range is {
			if rerrs[k] != nil {
				errs[i] = effectError(name, rerrs[k])
				continue
			}
			errs[i] = parseOK(name, replies[k])
		}
	}
}

var _ storekit.EffectStore = (*Store)(nil)
