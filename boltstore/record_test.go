package boltstore

import (
	"bytes"
	"errors"
	"reflect"
	"strings"
	"testing"

	"github.com/idemgo/idem"
)

func TestRecordRoundTrip(t *testing.T) {
	for _, r := range []*record{
		{state: idem.StateInProgress, fingerprint: "fp", owner: "o", fence: 1, attempts: 1, created: 1, leaseUntil: 2, expiresAt: 3},
		{state: idem.StateCompleted, fingerprint: strings.Repeat("f", idem.MaxFingerprintLen), owner: strings.Repeat("o", idem.MaxOwnerLen),
			fence: 1<<63 - 1, attempts: 1<<31 - 1, created: -5, expiresAt: 1 << 60, result: bytes.Repeat([]byte{0, 0xff}, 1<<16)},
		{state: idem.StateFailed, fence: 42, attempts: 3},
		{state: idem.StateReleased, fence: 7, attempts: 2, created: 1795262400000000, expiresAt: 1795262400000001},
	} {
		b := r.encode()
		got, err := decode(b, true)
		if err != nil {
			t.Fatalf("decode(encode(%+v)): %v", r, err)
		}
		if !reflect.DeepEqual(got, r) {
			t.Fatalf("round trip: got %+v, want %+v", got, r)
		}
	}
	// The encoding is compact: a typical IN_PROGRESS record (digest
	// fingerprint, executor owner token) takes well under 100 bytes.
	r := &record{state: idem.StateInProgress, fingerprint: strings.Repeat("f", 43), owner: "AAAAAAAAAAAA.1z", fence: 1795262400000000,
		attempts: 1, created: 1795262400000000, leaseUntil: 1795262430000000, expiresAt: 1795262460000000}
	if n := len(r.encode()); n > 100 {
		t.Errorf("encoded IN_PROGRESS record: %d bytes", n)
	}
}

func TestDecodeErrors(t *testing.T) {
	good := (&record{state: idem.StateCompleted, fingerprint: "fp", owner: "o", fence: 9, attempts: 1, result: []byte("res")}).encode()
	for name, b := range map[string][]byte{
		"empty":             nil,
		"one byte":          {recordVersion},
		"unknown version":   append([]byte{9}, good[1:]...),
		"unknown state":     append([]byte{recordVersion, 0}, good[2:]...),
		"state past FAILED": append([]byte{recordVersion, 5}, good[2:]...),
		"truncated":         good[:len(good)-1],
		"trailing bytes":    append(append([]byte(nil), good...), 0),
		"bad varint":        {recordVersion, 1, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff},
		"fence too large":   {recordVersion, 1, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x01},
		"huge length":       append(append([]byte(nil), good[:len(good)-4]...), 0xff, 0xff, 0xff, 0xff, 0x0f),
	} {
		if _, err := decode(b, true); !errors.Is(err, ErrCorrupt) {
			t.Errorf("%s: got %v, want ErrCorrupt", name, err)
		}
	}
}

func FuzzDecode(f *testing.F) {
	f.Add((&record{state: idem.StateCompleted, fingerprint: "fp", owner: "o", fence: 9, attempts: 1, result: []byte("res")}).encode())
	f.Add((&record{state: idem.StateInProgress, fence: 1, leaseUntil: -1}).encode())
	f.Fuzz(func(t *testing.T, b []byte) {
		r, err := decode(b, false)
		if err != nil {
			if !errors.Is(err, ErrCorrupt) {
				t.Fatalf("error not wrapping ErrCorrupt: %v", err)
			}
			return
		}
		// Whatever decodes encodes back to the same bytes.
		if again := r.encode(); !bytes.Equal(again, b) {
			t.Fatalf("re-encoding differs:\n%x\n%x", again, b)
		}
	})
}

func TestExpiryKeyOrder(t *testing.T) {
	times := []int64{-1 << 62, -1, 0, 1, 1795262400000000, 1<<63 - 1}
	for i := 1; i < len(times); i++ {
		a, b := expiryKey(times[i-1], "k"), expiryKey(times[i], "k")
		if bytes.Compare(a, b) >= 0 {
			t.Errorf("expiryKey(%d) sorts after expiryKey(%d)", times[i-1], times[i])
		}
		exp, key, err := parseExpiryKey(b)
		if err != nil || exp != times[i] || string(key) != "k" {
			t.Errorf("parseExpiryKey: got %d %q %v", exp, key, err)
		}
	}
	if _, _, err := parseExpiryKey([]byte{1, 2}); !errors.Is(err, ErrCorrupt) {
		t.Errorf("short entry: got %v, want ErrCorrupt", err)
	}
}
