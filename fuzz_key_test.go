package idem_test

import (
	"crypto/sha256"
	"encoding/base64"
	"encoding/binary"
	"strings"
	"testing"

	"github.com/idemgo/idem"
	"github.com/idemgo/idem/storekit"
)

// digestInput is the byte string whose SHA-256 Key.Digest documents: the
// scope's length (8 bytes, big endian), the scope, the ID.
func digestInput(k idem.Key) []byte {
	b := binary.BigEndian.AppendUint64(nil, uint64(len(k.Scope)))
	return append(append(b, k.Scope...), k.ID...)
}

// FuzzKeyDigest checks key derivation: Digest is the documented function of
// (scope, ID) (128 bits of SHA-256 over the length-prefixed scope and the
// ID, base64url), is a valid store key of DigestLen characters, and two
// different (scope, ID) pairs never hash the same input, so that they can
// never share a record (a SHA-256 collision aside). The seeds include pairs
// that a plain concatenation would confuse ("ab"+"c" and "a"+"bc").
func FuzzKeyDigest(f *testing.F) {
	long := strings.Repeat("k", storekit.MaxKeyLen)
	for _, s := range [][4]string{
		{"ab", "c", "a", "bc"},
		{"", "abc", "abc", ""},
		{"", "x", "", "x"},
		{"POST u:/p", "k", "POST u:/p\x00", "k"},
		{"\x00\x00\x00\x00\x00\x00\x00\x01a", "b", "", "\x00\x00\x00\x00\x00\x00\x00\x01ab"},
		{strings.Repeat("s", 600), long, strings.Repeat("s", 599), "s" + long},
		{"caf\xc3\xa9", "\"quoted\"", "café", `"quoted"`},
		{"\r\n\t", "\x7f", "\xff\xfe", "\u2028"},
	} {
		f.Add(s[0], s[1], s[2], s[3])
	}
	f.Fuzz(func(t *testing.T, scope1, id1, scope2, id2 string) {
		k1, k2 := idem.Key{Scope: scope1, ID: id1}, idem.Key{Scope: scope2, ID: id2}
		for _, k := range []idem.Key{k1, k2} {
			d := k.Digest()
			if len(d) != storekit.DigestLen {
				t.Fatalf("Digest(%q) = %q: %d characters, want %d", k, d, len(d), storekit.DigestLen)
			}
			if err := storekit.ValidateStoreKey(d); err != nil {
				t.Fatalf("Digest(%q) = %q is not a valid store key: %v", k, d, err)
			}
			sum := sha256.Sum256(digestInput(k))
			if want := base64.RawURLEncoding.EncodeToString(sum[:16]); d != want {
				t.Fatalf("Digest(%q) = %q, want %q", k, d, want)
			}
			if d2 := k.Digest(); d2 != d {
				t.Fatalf("Digest(%q) is not deterministic: %q then %q", k, d, d2)
			}
		}
		same := k1 == k2
		if sameInput := string(digestInput(k1)) == string(digestInput(k2)); sameInput != same {
			t.Fatalf("keys %q and %q: equal=%v but their digest inputs equal=%v", k1, k2, same, sameInput)
		}
		if !same && k1.Digest() == k2.Digest() {
			t.Fatalf("different keys %q and %q share the digest %q", k1, k2, k1.Digest())
		}
	})
}
