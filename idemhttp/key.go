package idemhttp

import (
	"errors"
	"fmt"

	"github.com/idemgo/idem/storekit"
)

// ErrInvalidKey is wrapped by the errors ParseKey returns. The middleware
// answers such keys with 400 and a problem of type TypeKeyInvalid whose
// detail is the error's text.
var ErrInvalidKey = errors.New("idemhttp: invalid idempotency key")

// ParseKey returns the idempotency key carried by one Idempotency-Key field
// value.
//
// The draft (draft-ietf-httpapi-idempotency-key-header) defines the value as
// an RFC 8941 sf-string: a quoted string of printable ASCII in which only \"
// and \\ are escapes. A value that starts with a double quote is parsed as
// one and unquoted; parameters after the closing quote are rejected. Many
// clients (Stripe's among them) send the key bare, without quotes, so a value
// that does not start with a quote is accepted as it is when it is printable
// ASCII (0x20 to 0x7E). The quoted and the bare spelling of the same
// characters are the same key. Spaces and tabs around the value are ignored,
// as HTTP does.
//
// The key must be 1 to storekit.MaxKeyLen (255) characters long after
// unquoting. Any violation returns an error wrapping ErrInvalidKey.
func ParseKey(value string) (string, error) {
	value = trimOWS(value)
	if value == "" {
		return "", fmt.Errorf("%w: the key is empty", ErrInvalidKey)
	}
	// A quoted value may need two bytes per character plus the quotes; a
	// longer one cannot be valid. This bounds the work on hostile input.
	if len(value) > 2*storekit.MaxKeyLen+2 {
		return "", fmt.Errorf("%w: the key is %d characters long, over the limit of %d", ErrInvalidKey, len(value), storekit.MaxKeyLen)
	}
	var key string
	if value[0] == '"' {
		k, err := parseSFString(value)
		if err != nil {
			return "", err
		}
		key = k
	} else {
		for i := 0; i < len(value); i++ {
			if c := value[i]; c < 0x20 || c > 0x7e {
				return "", badByte(c, i)
			}
		}
		key = value
	}
	switch {
	case key == "":
		return "", fmt.Errorf("%w: the key is empty", ErrInvalidKey)
	case len(key) > storekit.MaxKeyLen:
		return "", fmt.Errorf("%w: the key is %d characters long, over the limit of %d", ErrInvalidKey, len(key), storekit.MaxKeyLen)
	}
	return key, nil
}

// parseSFString parses v, which starts with a double quote, as an RFC 8941
// sf-string (section 4.2.5) that must make up the whole value.
func parseSFString(v string) (string, error) {
	var out []byte // allocated at the first escape only
	start := 1
	for i := 1; i < len(v); i++ {
		c := v[i]
		switch {
		case c == '\\':
			if i+1 == len(v) {
				return "", fmt.Errorf("%w: the quoted key ends inside an escape", ErrInvalidKey)
			}
			if n := v[i+1]; n != '"' && n != '\\' {
				return "", fmt.Errorf("%w: invalid escape \\%s in the quoted key at position %d; only \\\" and \\\\ are allowed", ErrInvalidKey, printable(n), i)
			}
			if out == nil {
				out = make([]byte, 0, len(v))
			}
			out = append(out, v[start:i]...)
			i++
			start = i
		case c == '"':
			if i != len(v)-1 {
				return "", fmt.Errorf("%w: unexpected characters after the closing quote at position %d", ErrInvalidKey, i+1)
			}
			if out == nil {
				return v[1:i], nil
			}
			return string(append(out, v[start:i]...)), nil
		case c < 0x20 || c > 0x7e:
			return "", badByte(c, i)
		}
	}
	return "", fmt.Errorf("%w: the quoted key has no closing quote", ErrInvalidKey)
}

func badByte(c byte, i int) error {
	if c < 0x20 || c == 0x7f {
		return fmt.Errorf("%w: control character %#02x at position %d", ErrInvalidKey, c, i)
	}
	return fmt.Errorf("%w: non-ASCII byte %#02x at position %d; the key must be printable ASCII", ErrInvalidKey, c, i)
}

// printable renders c for an error message.
func printable(c byte) string {
	if c < 0x20 || c > 0x7e {
		return fmt.Sprintf("%#02x", c)
	}
	return string(c)
}

// trimOWS removes the optional whitespace (spaces and tabs) that HTTP allows
// around a field value.
func trimOWS(s string) string {
	for s != "" && (s[0] == ' ' || s[0] == '\t') {
		s = s[1:]
	}
	for s != "" && (s[len(s)-1] == ' ' || s[len(s)-1] == '\t') {
		s = s[:len(s)-1]
	}
	return s
}
