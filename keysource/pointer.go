package keysource

import (
	"encoding/json"
	"errors"
	"fmt"
	"strings"
)

// pointer is a parsed RFC 6901 JSON Pointer.
type pointer struct {
	text   string   // as written
	tokens []string // unescaped reference tokens
}

func (p pointer) String() string { return p.text }

// parsePointer parses an RFC 6901 JSON Pointer that names a member below
// the root ("" and "/" alone name the whole document or its "" member,
// neither of which a key or a fingerprint wants).
func parsePointer(s string) (pointer, error) {
	switch {
	case s == "":
		return pointer{}, errors.New("empty JSON Pointer: want one such as /id or /data/object/id")
	case s[0] != '/':
		return pointer{}, fmt.Errorf("JSON Pointer %q does not start with /: want one such as /%s (RFC 6901)", s, s)
	}
	p := pointer{text: s}
	for _, tok := range strings.Split(s[1:], "/") {
		if tok == "" {
			return pointer{}, fmt.Errorf("JSON Pointer %q has an empty segment", s)
		}
		for i := 0; i < len(tok); i++ {
			if tok[i] == '~' && (i+1 == len(tok) || tok[i+1] != '0' && tok[i+1] != '1') {
				return pointer{}, fmt.Errorf("JSON Pointer %q: ~ must be followed by 0 (for ~) or 1 (for /)", s)
			}
		}
		tok = strings.ReplaceAll(strings.ReplaceAll(tok, "~1", "/"), "~0", "~")
		p.tokens = append(p.tokens, tok)
	}
	return p, nil
}

// lookup returns the JSON value that p names in doc, which must be valid
// JSON (json.Valid), without decoding what it passes over. Of duplicate
// member names the last counts, as for encoding/json. ok is false if doc
// has no such value.
func lookup(doc []byte, p pointer) (v []byte, ok bool) {
	v = doc[skipWS(doc, 0):valueEnd(doc, skipWS(doc, 0))]
	for _, tok := range p.tokens {
		switch v[0] {
		case '{':
			v, ok = member(v, tok)
		case '[':
			v, ok = element(v, tok)
		default:
			return nil, false
		}
		if !ok {
			return nil, false
		}
	}
	return v, true
}

// member returns the value of the last member named name of the object
// obj.
func member(obj []byte, name string) (v []byte, ok bool) {
	i := skipWS(obj, 1)
	for obj[i] != '}' {
		end := stringEnd(obj, i)
		k := obj[i:end]
		i = skipWS(obj, end)
		i = skipWS(obj, i+1) // the colon
		vend := valueEnd(obj, i)
		if keyIs(k, name) {
			v, ok = obj[i:vend], true
		}
		i = skipWS(obj, vend)
		if obj[i] == ',' {
			i = skipWS(obj, i+1)
		}
	}
	return v, ok
}

// keyIs reports whether the JSON string k holds name.
func keyIs(k []byte, name string) bool {
	if s, ok := plainString(k); ok {
		return s == name
	}
	var s string
	return json.Unmarshal(k, &s) == nil && s == name
}

// element returns the element of the array arr whose index tok is.
func element(arr []byte, tok string) ([]byte, bool) {
	n, ok := arrayIndex(tok)
	if !ok {
		return nil, false
	}
	i := skipWS(arr, 1)
	for idx := 0; arr[i] != ']'; idx++ {
		end := valueEnd(arr, i)
		if idx == n {
			return arr[i:end], true
		}
		i = skipWS(arr, end)
		if arr[i] == ',' {
			i = skipWS(arr, i+1)
		}
	}
	return nil, false
}

// arrayIndex parses an RFC 6901 array index: 0, or digits without a
// leading zero.
func arrayIndex(tok string) (int, bool) {
	if tok == "" || len(tok) > 9 || len(tok) > 1 && tok[0] == '0' {
		return 0, false
	}
	n := 0
	for i := 0; i < len(tok); i++ {
		c := tok[i]
		if c < '0' || c > '9' {
			return 0, false
		}
		n = n*10 + int(c-'0')
	}
	return n, true
}

func skipWS(b []byte, i int) int {
	for i < len(b) && (b[i] == ' ' || b[i] == '\t' || b[i] == '\n' || b[i] == '\r') {
		i++
	}
	return i
}

// stringEnd returns the index just past the JSON string that starts at i.
func stringEnd(b []byte, i int) int {
	for i++; i < len(b); i++ {
		switch b[i] {
		case '\\':
			i++
		case '"':
			return i + 1
		}
	}
	return len(b)
}

// valueEnd returns the index just past the valid JSON value that starts
// at i.
func valueEnd(b []byte, i int) int {
	switch b[i] {
	case '"':
		return stringEnd(b, i)
	case '{', '[':
		depth := 0
		for ; i < len(b); i++ {
			switch b[i] {
			case '"':
				i = stringEnd(b, i) - 1
			case '{', '[':
				depth++
			case '}', ']':
				if depth--; depth == 0 {
					return i + 1
				}
			}
		}
		return len(b)
	}
	for ; i < len(b); i++ {
		switch b[i] {
		case ',', '}', ']', ' ', '\t', '\n', '\r':
			return i
		}
	}
	return i
}
