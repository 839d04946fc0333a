// Package keysource says where a message's idempotency key and the part of
// it that its fingerprint covers come from, for an HTTP request as for a
// broker message: anything with named header fields and a body.
//
// A Source is parsed from a spec:
//
//	header:NAME   the value of the header field NAME (Idempotency-Key,
//	              X-GitHub-Delivery, webhook-id, ...)
//	json:POINTER  a member of a JSON body, named by an RFC 6901 JSON
//	              Pointer: json:/id, json:/data/object/id, json:/items/0/id
//
// A Fingerprint is parsed from a spec too:
//
//	body                   the body's bytes (the default: the zero Fingerprint)
//	none                   nothing of the body
//	json:POINTER,POINTER…  only those members of a JSON body, in a
//	                       canonical JSON form
//
// The paths are JSON Pointers (RFC 6901) rather than dotted paths because
// a Pointer names any member, even one whose name holds a dot or a
// bracket: each segment after a / is a member name, or an array index
// (0, 1, ...; no leading zeros), with ~1 standing for / and ~0 for ~. A
// member name that holds a comma cannot be listed in a fingerprint spec,
// whose pointers are separated by commas.
//
//	src, err := keysource.Parse("json:/id")
//	if err != nil { … }                       // a bad spec, at start
//	key, err := src.Key(r.Header.Values, body)
//	if errors.Is(err, keysource.ErrNoKey) { … } // 400, as for a missing key
//
// Sources and fingerprints only find the key: the key is still scoped by
// whoever uses it (idemhttp scopes it by method, route and principal), so
// that a key taken from a body never reaches another route's or another
// client's record. Parse, ParseFingerprint and the methods are safe for
// concurrent use; a Source and a Fingerprint are values that never change.
package keysource
