// Package canonjson writes JSON in one canonical form, so that two bodies
// that differ only in member order, whitespace or string escapes have the
// same fingerprint (idemhttp.WithCanonicalJSON, keysource's json:
// fingerprints).
package canonjson

import (
	"bytes"
	"encoding/json"
	"io"
)

// Canonical returns b in a canonical JSON form: object members sorted by
// key, no insignificant whitespace, strings escaped one way. Numbers are
// kept as written (1.0 and 1 differ); of duplicate keys the last counts. ok
// is false if b is not one JSON value.
func Canonical(b []byte) (c []byte, ok bool) {
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.UseNumber()
	var v any
	if err := dec.Decode(&v); err != nil {
		return nil, false
	}
	if _, err := dec.Token(); err != io.EOF {
		return nil, false // trailing data
	}
	c, err := json.Marshal(v)
	if err != nil {
		return nil, false
	}
	return c, true
}
