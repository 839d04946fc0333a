package idem

import (
	"crypto/sha256"
	"encoding/base64"
	"encoding/binary"

	"github.com/idemgo/idem/storekit"
)

// Key is an idempotency key: the client's ID within a scope. Two keys with the
// same ID in different scopes are unrelated, so that one client (or one
// route) can never replay another's result. The zero Scope is a valid scope.
type Key struct {
	// Scope is the namespace of ID: for example an operation name, an HTTP
	// method and route, or a principal. It may be empty.
	Scope string
	// ID is the client's idempotency key: 1 to storekit.MaxKeyLen bytes.
	ID string
	// Kind, if set, names the kind of Scope for an Observer (see
	// WithObserver), where Scope itself would make too many metric
	// series: idemhttp sets "http", since its scopes hold the route. It is
	// not part of the key: two keys that differ only in Kind are the same
	// key. When empty, observers are given Scope.
	Kind string
}

// Validate reports whether k may be used: ID must be 1 to storekit.MaxKeyLen bytes.
func (k Key) Validate() error {
	if k.ID == "" {
		return invalidf("empty idempotency key")
	}
	if len(k.ID) > storekit.MaxKeyLen {
		return invalidf("idempotency key is %d bytes, over the limit of %d", len(k.ID), storekit.MaxKeyLen)
	}
	return nil
}

// Digest returns the key under which stores keep k's record: the first 128
// bits of SHA-256 over the scope's length, the scope and the ID, encoded as
// 22 characters of unpadded base64url. Raw keys never reach a store, a log
// or a metric label; the digest does.
func (k Key) Digest() string {
	var out [storekit.DigestLen]byte
	return string(k.appendDigest(out[:0]))
}

// appendDigest appends k's digest to dst.
func (k Key) appendDigest(dst []byte) []byte {
	var stack [512]byte
	var buf []byte
	if n := 8 + len(k.Scope) + len(k.ID); n <= len(stack) {
		buf = stack[:0]
	} else {
		buf = make([]byte, 0, n)
	}
	buf = binary.BigEndian.AppendUint64(buf, uint64(len(k.Scope)))
	buf = append(buf, k.Scope...)
	buf = append(buf, k.ID...)
	sum := sha256.Sum256(buf)
	return base64.RawURLEncoding.AppendEncode(dst, sum[:16])
}
