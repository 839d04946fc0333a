package consumer

import (
	"bytes"
	"crypto/sha256"
	"encoding/base64"
	"encoding/json"
	"strconv"
)

// The key helpers below are shared by every adapter, whose KeyHeader,
// KeyField and KeyHash functions read the broker's headers or payload and
// call them. A key should name one operation: never use a field that is
// usually shared by several (a customer ID, an account, a partition key).

// HashKey returns a key made of the SHA-256 of parts (each prefixed with
// its length, so that ("ab", "c") and ("a", "bc") differ), in unpadded
// base64url (43 bytes): for payloads that carry no key but whose listed
// parts identify the operation. List only parts that are the same in every
// copy of the message (not a timestamp of the send, not a trace ID).
func HashKey(parts ...string) string {
	h := sha256.New()
	var n [20]byte
	for _, p := range parts {
		h.Write(strconv.AppendInt(n[:0], int64(len(p)), 10))
		h.Write([]byte{':'})
		h.Write([]byte(p))
	}
	return base64.RawURLEncoding.EncodeToString(h.Sum(nil))
}

// JSONField returns the top-level field name of the JSON object payload: a
// string as it is, a number or a boolean as its JSON text. It returns ""
// when payload is not a JSON object, lacks the field, or holds another
// type (null, an object, an array) there.
func JSONField(payload []byte, name string) string {
	v, ok := jsonFields(payload, name)[name]
	if !ok {
		return ""
	}
	return v
}

// JSONHash returns HashKey of the listed top-level fields of the JSON
// object payload, each as JSONField reads it (a missing one as ""). It
// returns "" when none of them is present: the message has no key.
func JSONHash(payload []byte, fields ...string) string {
	got := jsonFields(payload, fields...)
	if len(got) == 0 {
		return ""
	}
	parts := make([]string, len(fields))
	for i, f := range fields {
		parts[i] = got[f]
	}
	return HashKey(parts...)
}

// jsonFields returns the scalar values of the listed top-level fields of a
// JSON object.
func jsonFields(payload []byte, names ...string) map[string]string {
	var obj map[string]json.RawMessage
	if json.Unmarshal(payload, &obj) != nil {
		return nil
	}
	out := make(map[string]string, len(names))
	for _, n := range names {
		raw, ok := obj[n]
		if !ok {
			continue
		}
		raw = bytes.TrimSpace(raw)
		switch {
		case len(raw) == 0 || raw[0] == 'n' || raw[0] == '{' || raw[0] == '[':
		case raw[0] == '"':
			var s string
			if json.Unmarshal(raw, &s) == nil {
				out[n] = s
			}
		default:
			out[n] = string(raw)
		}
	}
	return out
}
