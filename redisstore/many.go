package redisstore

import (
	"context"
	"errors"
	"fmt"
)

// maxPerScript bounds the keys of one batch script. Redis runs a script to
// its end before it serves anyone else, so a large batch is split into
// scripts of at most this many keys, all sent in one pipeline.
const maxPerScript = 128

// oneScript reports whether the keys of a batch may share a script: always
// on a standalone server, and on a Cluster when the store has a hash tag
// (WithHashTag), which puts every record in one slot. Otherwise a batch is a
// pipeline of one-key scripts.
func (s *Store) oneScript() bool { return s.tag != "" || !s.isCluster() }

// span is the calls [lo, hi) of a batch that one batch script carries.
type span struct{ lo, hi int }

// packAcquire turns one-key acquire calls (args: acquireCall) into
// acquire_many calls: consecutive calls with the same lease, retention, max
// attempts and ttl share a script, up to maxPerScript keys.
func packAcquire(calls []evalCall) ([]evalCall, []span) {
	var many []evalCall
	var spans []span
	for lo := 0; lo < len(calls); {
		shared := acquireShared(calls[lo].Args)
		hi := lo + 1
		for hi < len(calls) && hi-lo < maxPerScript && acquireShared(calls[hi].Args) == shared {
			hi++
		}
		m := evalCall{Keys: make([]string, 0, hi-lo), Args: make([]string, 0, 4+2*(hi-lo))}
		m.Args = append(m.Args, shared[:]...)
		for _, c := range calls[lo:hi] {
			m.Keys = append(m.Keys, c.Keys[0])
			m.Args = append(m.Args, c.Args[0], c.Args[1])
		}
		many = append(many, m)
		spans = append(spans, span{lo, hi})
		lo = hi
	}
	return many, spans
}

// acquireShared returns the arguments that acquire_many.lua takes once for
// all its keys (lease, retention, max attempts, ttl) from the arguments of
// one acquire.lua call (acquireCall: without an attempt limit, max attempts
// 0 and a retention acquire does not read).
func acquireShared(args []string) [4]string {
	if len(args) < 6 {
		return [4]string{args[2], "0", "0", args[3]}
	}
	return [4]string{args[2], args[5], args[4], args[3]}
}

// chunk splits n calls into spans of at most maxPerScript.
func chunk(n int) []span {
	var spans []span
	for lo := 0; lo < n; lo += maxPerScript {
		spans = append(spans, span{lo, min(lo+maxPerScript, n)})
	}
	return spans
}

// unpackMany spreads the replies of batch scripts over the calls they
// carried: reply i of a script is the reply of call span.lo+i, and a failed
// script fails each of its calls. Element replies that are strings are the
// scripts' error messages.
func unpackMany(name string, n int, spans []span, replies []any, errs []error) ([]any, []error) {
	out := make([]any, n)
	outErrs := make([]error, n)
	for j, sp := range spans {
		arr, ok := replies[j].([]any)
		switch {
		case errs[j] != nil:
		case !ok || len(arr) != sp.hi-sp.lo:
			errs[j] = replyError(name, replies[j])
		}
		for i := sp.lo; i < sp.hi; i++ {
			if errs[j] != nil {
				outErrs[i] = errs[j]
				continue
			}
			out[i] = arr[i-sp.lo]
		}
	}
	return out, outErrs
}

// elementError returns the error an element of a batch reply stands for:
// {0, message} from acquire_many, a message from the complete scripts (whose
// other replies are integers), or nil.
func elementError(name string, v any) error {
	var msg string
	switch x := v.(type) {
	case string:
		msg = x
	case []any:
		if len(x) == 2 {
			if code, ok := asInt(x[0]); ok && code == 0 {
				msg, _ = asString(x[1])
			}
		}
	}
	if msg == "" {
		return nil
	}
	return fmt.Errorf("redisstore: %s: %w", name, errors.New(msg))
}

// runBatch runs the one-key calls of sc in a pipeline, or, when the store's
// keys may share a script, packed into the batch scripts of many (pack
// groups them), and returns one reply or error per call as runMulti does.
func (s *Store) runBatch(ctx context.Context, sc, many *script, calls []evalCall, pack func([]evalCall) ([]evalCall, []span)) ([]any, []error) {
	if len(calls) < 2 || !s.oneScript() {
		return s.runMulti(ctx, sc, calls)
	}
	packed, spans := pack(calls)
	replies, errs := s.runMulti(ctx, many, packed)
	replies, errs = unpackMany(many.Name, len(calls), spans, replies, errs)
	for i, err := range errs {
		if err == nil {
			errs[i] = elementError(many.Name, replies[i])
		}
	}
	return replies, errs
}

// packComplete turns one-key complete calls (args: owner, fence, result,
// retention, notification command, channel) into complete_many calls.
func packComplete(calls []evalCall) ([]evalCall, []span) {
	spans := chunk(len(calls))
	many := make([]evalCall, len(spans))
	for j, sp := range spans {
		m := evalCall{Keys: make([]string, 0, sp.hi-sp.lo), Args: make([]string, 0, 2+3*(sp.hi-sp.lo))}
		m.Args = append(m.Args, calls[sp.lo].Args[3], calls[sp.lo].Args[4])
		for _, c := range calls[sp.lo:sp.hi] {
			m.Keys = append(m.Keys, c.Keys[0])
			m.Args = append(m.Args, c.Args[0], c.Args[1], c.Args[2])
		}
		many[j] = m
	}
	return many, spans
}

// packCompleteAck turns one-key complete_ack calls (keys: record, stream;
// args: owner, fence, result, retention, notification command, channel,
// group, entry ID) into complete_ack_many calls. All calls are for one
// stream and group.
func packCompleteAck(calls []evalCall) ([]evalCall, []span) {
	spans := chunk(len(calls))
	many := make([]evalCall, len(spans))
	for j, sp := range spans {
		first := calls[sp.lo]
		m := evalCall{Keys: make([]string, 0, 1+sp.hi-sp.lo), Args: make([]string, 0, 3+4*(sp.hi-sp.lo))}
		m.Keys = append(m.Keys, first.Keys[1])
		m.Args = append(m.Args, first.Args[3], first.Args[4], first.Args[6])
		for _, c := range calls[sp.lo:sp.hi] {
			m.Keys = append(m.Keys, c.Keys[0])
			m.Args = append(m.Args, c.Args[0], c.Args[1], c.Args[2], c.Args[7])
		}
		many[j] = m
	}
	return many, spans
}
