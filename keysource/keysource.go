package keysource

import (
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"unicode/utf8"

	"github.com/idemgo/idem/internal/httpsyntax"
	"github.com/idemgo/idem/storekit"
)

// ErrNoKey is wrapped by the errors Source.Key returns when the message
// has no key where the source says: the header field is absent, or the
// body is not JSON, or it lacks the member (or holds null there). An HTTP
// layer answers it as a missing key (idemhttp: 400, TypeKeyMissing).
var ErrNoKey = errors.New("keysource: no idempotency key")

// ErrInvalidKey is wrapped by the errors Source.Key returns when the key
// is there but cannot be used: a header field that appears more than
// once; a JSON member that is not a string or a number, or a string that
// is empty, longer than storekit.MaxKeyLen bytes or not UTF-8. An HTTP layer
// answers it as an invalid key (idemhttp: 400, TypeKeyInvalid).
var ErrInvalidKey = errors.New("keysource: invalid idempotency key")

// DefaultHeader is the header field of the default Source, the one of
// draft-ietf-httpapi-idempotency-key-header.
const DefaultHeader = "Idempotency-Key"

// Source says where a message's key is: a header field or a member of a
// JSON body. Make one with Parse or FromHeader; the zero Source is none
// (IsZero), and its Key fails.
type Source struct {
	header  string  // header:NAME, as given
	pointer pointer // json:POINTER
	spec    string
}

// FromHeader returns the Source of the header field name ("header:"+name).
// It returns an error if name is not a valid field name (an RFC 9110 token).
func FromHeader(name string) (Source, error) {
	return Parse("header:" + name)
}

// Parse returns the Source that spec describes: "header:NAME" or
// "json:POINTER" (see the package documentation). Its error says what is
// wrong and what a good spec looks like.
func Parse(spec string) (Source, error) {
	kind, arg, ok := strings.Cut(spec, ":")
	switch {
	case !ok:
	case kind == "header":
		if !httpsyntax.IsToken(arg) {
			return Source{}, fmt.Errorf("keysource: invalid key source %q: %q is not a header field name", spec, arg)
		}
		return Source{header: arg, spec: spec}, nil
	case kind == "json":
		p, err := parsePointer(arg)
		if err != nil {
			return Source{}, fmt.Errorf("keysource: invalid key source %q: %w", spec, err)
		}
		return Source{pointer: p, spec: spec}, nil
	}
	return Source{}, fmt.Errorf("keysource: invalid key source %q: want header:NAME (e.g. header:Idempotency-Key) or json:POINTER (an RFC 6901 JSON Pointer, e.g. json:/id)", spec)
}

// String returns the spec the Source was parsed from ("" for the zero
// Source).
func (s Source) String() string { return s.spec }

// IsZero reports whether s is the zero Source, which names no key.
func (s Source) IsZero() bool { return s.spec == "" }

// Header returns the name of the header field that holds the key, as
// given in the spec, or "" for a source in the body.
func (s Source) Header() string { return s.header }

// InBody reports whether the key is in the body: the body must be read
// before the key is known.
func (s Source) InBody() bool { return s.spec != "" && s.header == "" }

// Key returns the key of a message whose header fields header returns by
// name (http.Header.Values, for an HTTP request) and whose body is body.
//
// For a header source, the field's value is returned as it is: the
// caller parses it as its protocol says (idemhttp.ParseKey for HTTP). For
// a JSON source, a string member is returned unescaped and a number as it
// is written (1.0 and 1 are two keys); see ErrNoKey and ErrInvalidKey for
// the errors. header may be nil for a JSON source.
func (s Source) Key(header func(name string) []string, body []byte) (string, error) {
	switch {
	case s.header != "":
		var vs []string
		if header != nil {
			vs = header(s.header)
		}
		switch len(vs) {
		case 0:
			return "", fmt.Errorf("%w: no %s header field", ErrNoKey, s.header)
		case 1:
			return vs[0], nil
		}
		return "", fmt.Errorf("%w: the %s header field appears %d times; send it once", ErrInvalidKey, s.header, len(vs))
	case s.spec == "":
		return "", fmt.Errorf("%w: no key source configured", ErrNoKey)
	}
	if !json.Valid(body) {
		return "", fmt.Errorf("%w: the body is not JSON, and the key is its member %s", ErrNoKey, s.pointer)
	}
	v, ok := lookup(body, s.pointer)
	if !ok || string(v) == "null" {
		return "", fmt.Errorf("%w: the JSON body has no member %s", ErrNoKey, s.pointer)
	}
	var key string
	switch v[0] {
	case '"':
		if k, ok := plainString(v); ok {
			key = k
		} else if err := json.Unmarshal(v, &key); err != nil {
			return "", fmt.Errorf("%w: the member %s: %v", ErrInvalidKey, s.pointer, err)
		}
	case '-', '0', '1', '2', '3', '4', '5', '6', '7', '8', '9':
		key = string(v)
	default:
		return "", fmt.Errorf("%w: the member %s is %s, not a string or a number", ErrInvalidKey, s.pointer, kindOf(v[0]))
	}
	switch {
	case key == "":
		return "", fmt.Errorf("%w: the member %s is an empty string", ErrInvalidKey, s.pointer)
	case len(key) > storekit.MaxKeyLen:
		return "", fmt.Errorf("%w: the member %s is %d bytes long, over the limit of %d", ErrInvalidKey, s.pointer, len(key), storekit.MaxKeyLen)
	case !utf8.ValidString(key):
		return "", fmt.Errorf("%w: the member %s is not valid UTF-8", ErrInvalidKey, s.pointer)
	}
	return key, nil
}

// plainString returns the contents of the JSON string v when it has no
// escapes.
func plainString(v []byte) (string, bool) {
	in := v[1 : len(v)-1]
	for _, c := range in {
		if c == '\\' {
			return "", false
		}
	}
	return string(in), true
}

func kindOf(c byte) string {
	switch c {
	case '{':
		return "an object"
	case '[':
		return "an array"
	case 't', 'f':
		return "a boolean"
	}
	return "null"
}
