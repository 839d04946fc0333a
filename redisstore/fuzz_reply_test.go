package redisstore

import (
	"encoding/binary"
	"errors"
	"testing"

	"github.com/idemgo/idem/storekit"
)

// replyFrom builds a script reply, in the normalized shapes the client
// adapters return (nil, int64, string, []any), from fuzz bytes: each value
// starts with a tag byte. It returns the value and the bytes left.
func replyFrom(b []byte, depth int) (any, []byte) {
	if len(b) == 0 {
		return nil, b
	}
	tag, b := b[0], b[1:]
	switch tag % 5 {
	case 0:
		return nil, b
	case 1: // an integer
		var buf [8]byte
		n := copy(buf[:], b)
		return int64(binary.BigEndian.Uint64(buf[:])), b[n:]
	case 2, 3: // a string of up to 63 bytes
		n := min(int(tag>>2)&63, len(b))
		return string(b[:n]), b[n:]
	default: // an array of up to 15 values
		if depth > 3 {
			return nil, b
		}
		n := int(tag>>4) & 15
		arr := make([]any, 0, n)
		for range n {
			var v any
			v, b = replyFrom(b, depth+1)
			arr = append(arr, v)
		}
		return arr, b
	}
}

// FuzzParseReply checks the functions that parse the scripts' replies (one
// per script, docs/design.md#records-and-keys) on any reply shape: they
// never panic, an unexpected shape is an error, and what they accept is a
// well-formed outcome. A reply the script could send (an array led by a
// valid code) parses to the matching outcome.
func FuzzParseReply(f *testing.F) {
	f.Add([]byte{0x34, 1, 0, 0, 0, 0, 0, 0, 0, 1, 1, 0, 0, 0, 0, 0, 0, 0, 5, 1})
	f.Add([]byte{0x44, 1, 0, 0, 0, 0, 0, 0, 0, 4, 0x06, 'c', 1, 0, 0, 0, 0, 0, 0, 0, 1, 0x0a, 'o', 'k'})
	f.Add([]byte{0xa4, 1, 0, 0, 0, 0, 0, 0, 0, 1})
	f.Add([]byte{0x14, 1, 0, 0, 0, 0, 0, 0, 0, 5})
	f.Add([]byte{0x06, 'f'})
	f.Add([]byte{1, 0, 0, 0, 0, 0, 0, 0, 1})
	f.Add([]byte{})
	f.Fuzz(func(t *testing.T, b []byte) {
		v, _ := replyFrom(b, 0)
		if a, err := parseAcquire(v); err == nil {
			switch a.Outcome {
			case storekit.Acquired, storekit.TakenOver, storekit.InProgress, storekit.Mismatch:
			case storekit.Replay:
				if a.State == 0 {
					t.Fatalf("parseAcquire(%#v) = a replay without a state", v)
				}
			default:
				t.Fatalf("parseAcquire(%#v) = outcome %v", v, a.Outcome)
			}
		} else if err.Error() == "" {
			t.Fatalf("parseAcquire(%#v): empty error", v)
		}
		if rec, err := parseGet(v); err == nil {
			if rec.State == 0 {
				t.Fatalf("parseGet(%#v) = a record without a state", v)
			}
		} else if !errors.Is(err, storekit.ErrNotFound) && err.Error() == "" {
			t.Fatalf("parseGet(%#v): empty error", v)
		}
		for _, name := range []string{"complete", "release", "extend"} {
			err := parseOK(name, v)
			if n, ok := asInt(v); ok && n == 1 { // 1, as an integer or its string
				if err != nil {
					t.Fatalf("parseOK(%q, 1) = %v, want nil", name, err)
				}
			} else if err == nil {
				t.Fatalf("parseOK(%q, %#v) = nil, want an error", name, v)
			}
		}
		if err := parseRelay(v); err == nil {
			if n, ok := asInt(v); !ok || (n != 1 && n != 2) {
				t.Fatalf("parseRelay(%#v) = nil, want an error", v)
			}
		}
		if st, err := parseFail(v); err == nil && st != storekit.StateReleased && st != storekit.StateFailed {
			t.Fatalf("parseFail(%#v) = %v, nil", v, st)
		}
	})
}
