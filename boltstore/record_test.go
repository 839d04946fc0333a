package boltstore

import (
	"bytes"
	"errors"
	"reflect"
	"strings"
	"testing"

	"github.com/idemgo/idem/storekit"
)

func TestRecordRoundTrip(t *testing.T) {
	for _, r := range []*record{
		{State: storekit.StateInProgress, Fingerprint: "fp", Owner: "o", Fence: 1, Attempts: 1, Created: 1, LeaseUntil: 2, ExpiresAt: 3},
		{State: storekit.StateCompleted, Fingerprint: strings.Repeat("f", storekit.MaxFingerprintLen), Owner: strings.Repeat("o", storekit.MaxOwnerLen),
			Fence: 1<<63 - 1, Attempts: 1<<31 - 1, Created: -5, ExpiresAt: 1 << 60, Result: bytes.Repeat([]byte{0, 0xff}, 1<<16)},
		{State: storekit.StateFailed, Fence: 42, Attempts: 3},
		{State: storekit.StateReleased, Fence: 7, Attempts: 2, Created: 1795262400000000, ExpiresAt: 1795262400000001},
	} {
		b := encode(r)
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
	r := &record{State: storekit.StateInProgress, Fingerprint: strings.Repeat("f", 43), Owner: "AAAAAAAAAAAA.1z", Fence: 1795262400000000,
		Attempts: 1, Created: 1795262400000000, LeaseUntil: 1795262430000000, ExpiresAt: 1795262460000000}
	if n := len(encode(r)); n > 100 {
		t.Errorf("encoded IN_PROGRESS record: %d bytes", n)
	}
}

func TestDecodeErrors(t *testing.T) {
	good := encode(&record{State: storekit.StateCompleted, Fingerprint: "fp", Owner: "o", Fence: 9, Attempts: 1, Result: []byte("res")})
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
	f.Add(encode(&record{State: storekit.StateCompleted, Fingerprint: "fp", Owner: "o", Fence: 9, Attempts: 1, Result: []byte("res")}))
	f.Add(encode(&record{State: storekit.StateInProgress, Fence: 1, LeaseUntil: -1}))
	f.Fuzz(func(t *testing.T, b []byte) {
		r, err := decode(b, false)
		if err != nil {
			if !errors.Is(err, ErrCorrupt) {
				t.Fatalf("error not wrapping ErrCorrupt: %v", err)
			}
			return
		}
		// Whatever decodes encodes back to the same bytes.
		if again := encode(r); !bytes.Equal(again, b) {
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
