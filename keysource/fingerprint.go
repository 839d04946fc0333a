package keysource

import (
	"encoding/binary"
	"encoding/json"
	"fmt"
	"strings"

	"github.com/idemgo/idem/internal/canonjson"
)

// Fingerprint says which part of a message's body its fingerprint covers,
// so that a retry with the same key and another payload is told apart
// from a true retry. The zero Fingerprint covers the whole body (body).
type Fingerprint struct {
	none     bool
	pointers []pointer // json:POINTER,...
	spec     string
}

// ParseFingerprint returns the Fingerprint that spec describes: "body",
// "none" or "json:POINTER,POINTER…" (see the package documentation). Its
// error says what is wrong and what a good spec looks like.
func ParseFingerprint(spec string) (Fingerprint, error) {
	switch spec {
	case "body":
		return Fingerprint{}, nil
	case "none":
		return Fingerprint{none: true, spec: spec}, nil
	}
	list, ok := strings.CutPrefix(spec, "json:")
	if !ok {
		return Fingerprint{}, fmt.Errorf("keysource: invalid fingerprint %q: want body, none or json:POINTER,POINTER... (RFC 6901 JSON Pointers, e.g. json:/amount,/currency)", spec)
	}
	f := Fingerprint{spec: spec}
	seen := make(map[string]bool)
	for _, s := range strings.Split(list, ",") {
		p, err := parsePointer(s)
		if err != nil {
			return Fingerprint{}, fmt.Errorf("keysource: invalid fingerprint %q: %w", spec, err)
		}
		if seen[p.text] {
			return Fingerprint{}, fmt.Errorf("keysource: invalid fingerprint %q: %s is listed twice", spec, p.text)
		}
		seen[p.text] = true
		f.pointers = append(f.pointers, p)
	}
	return f, nil
}

// String returns the spec of f: "body" for the zero Fingerprint.
func (f Fingerprint) String() string {
	if f.spec == "" {
		return "body"
	}
	return f.spec
}

// IsBody reports whether f covers the whole body as it is (the zero
// Fingerprint).
func (f Fingerprint) IsBody() bool { return !f.none && f.pointers == nil }

// AppendBody appends to dst what of body the fingerprint covers, for the
// caller to hash with the rest of the message (method, path, ...):
//
//   - body: body as it is;
//   - none: nothing;
//   - json:…: for each pointer in the order listed, its member in
//     canonical JSON (members sorted, no insignificant whitespace,
//     numbers as written) or a mark that it is absent, each
//     length-prefixed, so that fields outside the list change nothing
//     and no two selections share an encoding. A body that is not JSON is
//     appended as it is, after a mark no JSON selection starts with: it
//     still fingerprints, as a whole.
func (f Fingerprint) AppendBody(dst, body []byte) []byte {
	switch {
	case f.none:
		return dst
	case f.pointers == nil:
		return append(dst, body...)
	}
	if !json.Valid(body) {
		dst = append(dst, 0xff)
		return append(dst, body...)
	}
	for _, p := range f.pointers {
		v, ok := lookup(body, p)
		if !ok {
			dst = append(dst, 0)
			continue
		}
		c, _ := canonjson.Canonical(v) // v is valid JSON
		dst = append(dst, 1)
		dst = binary.AppendUvarint(dst, uint64(len(c)))
		dst = append(dst, c...)
	}
	return dst
}
