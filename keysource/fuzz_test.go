package keysource

import (
	"bytes"
	"encoding/json"
	"strconv"
	"strings"
	"testing"

	"github.com/idemgo/idem/internal/canonjson"
)

// reference finds the value p names in doc by decoding doc whole with
// encoding/json: what lookup must agree with.
func reference(doc []byte, p pointer) (any, bool) {
	dec := json.NewDecoder(bytes.NewReader(doc))
	dec.UseNumber()
	var v any
	if dec.Decode(&v) != nil {
		return nil, false
	}
	for _, tok := range p.tokens {
		switch x := v.(type) {
		case map[string]any:
			var ok bool
			if v, ok = x[tok]; !ok {
				return nil, false
			}
		case []any:
			n, ok := arrayIndex(tok)
			if !ok || n >= len(x) {
				return nil, false
			}
			v = x[n]
		default:
			return nil, false
		}
	}
	return v, true
}

// FuzzLookup checks that the scanner finds what a full decode finds, for
// any valid JSON and pointer, and never panics on either.
func FuzzLookup(f *testing.F) {
	for _, s := range []struct{ doc, ptr string }{
		{`{"id":"x"}`, "/id"},
		{`{"a":{"b":[1,{"c":"\"]}"}]}}`, "/a/b/1/c"},
		{`{"a":1,"a":2}`, "/a"},
		{`[[],[{}],{"":0}]`, "/2/"},
		{`{"a\/b":{"~":true}}`, "/a~1b/~0"},
		{` {"x" : [ 1 , 2 , 3 ] } `, "/x/2"},
		{`{"\u0061":null}`, "/a"},
	} {
		f.Add([]byte(s.doc), s.ptr)
	}
	f.Fuzz(func(t *testing.T, doc []byte, ptr string) {
		p, err := parsePointer(ptr)
		if err != nil {
			return
		}
		if !json.Valid(doc) {
			return
		}
		got, ok := lookup(doc, p)
		want, wantOK := reference(doc, p)
		if ok != wantOK {
			t.Fatalf("lookup(%q, %q): found %v, want %v", doc, ptr, ok, wantOK)
		}
		if !ok {
			return
		}
		c, cok := canonjson.Canonical(got)
		w, _ := json.Marshal(want)
		if !cok || !bytes.Equal(c, w) {
			t.Fatalf("lookup(%q, %q): got %s, want %s", doc, ptr, got, w)
		}
	})
}

// FuzzParse checks that a parsed spec prints as it was written and never
// panics, and that Key on any body returns a key or one of the two errors.
func FuzzParse(f *testing.F) {
	f.Add("json:/id", []byte(`{"id":"x"}`))
	f.Add("header:X-GitHub-Delivery", []byte(``))
	f.Add("json:/a/0", []byte(`{"a":[7]}`))
	f.Fuzz(func(t *testing.T, spec string, body []byte) {
		s, err := Parse(spec)
		if err != nil {
			return
		}
		if s.String() != spec {
			t.Fatalf("Parse(%q).String() = %q", spec, s)
		}
		k, err := s.Key(func(string) []string { return []string{"v"} }, body)
		if err == nil && (k == "" || s.InBody() && len(k) > 255) {
			t.Fatalf("Key: got %q", k)
		}
		fp, err := ParseFingerprint("json:" + s.pointer.text)
		if s.InBody() && !strings.Contains(s.pointer.text, ",") && err != nil {
			t.Fatalf("ParseFingerprint(json:%s): %v", s.pointer.text, err)
		}
		_ = fp.AppendBody(nil, body)
		_ = strconv.Quote(k)
	})
}
