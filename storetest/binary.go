package storetest

import (
	"testing"

	"github.com/idemgo/idem/storekit"
)

// testBinaryFingerprint checks that a fingerprint is any bytes: idemhttp's
// are a hash, not text (a store that keeps them as text rejects them).
func testBinaryFingerprint(t *testing.T, s storekit.Store) {
	key := newKey(t)
	fp := "\xc0\xe5\x00\xff binary"
	r := req(fp, longLease)
	a := acquire(t, s, key, r, storekit.Acquired)
	if rec := get(t, s, key); rec.Fingerprint != fp {
		t.Fatalf("fingerprint: got %q, want %q", rec.Fingerprint, fp)
	}
	acquire(t, s, key, req("\xc0\xe5\x00\xfe binary", longLease), storekit.Mismatch)
	if err := s.Complete(t.Context(), key, a.Lease, []byte("r"), retention); err != nil {
		t.Fatalf("Complete: %v", err)
	}
	acquire(t, s, key, req(fp, longLease), storekit.Replay)
}
