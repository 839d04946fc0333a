package sidecar

import (
	"bytes"
	"encoding/base64"
	"encoding/json"
	"net/http"
	"testing"
	"unicode/utf8"
)

// marshalled is the BatchMessage of it as encoding/json writes it: what
// appendJSON must write, byte for byte (docs/consume.md's protocol).
func marshalled(t testing.TB, it *batchItem) []byte {
	t.Helper()
	m := BatchMessage{Key: it.key, Fence: it.fence, Replayed: it.dup, Headers: map[string]string{}, Body: string(it.body), Encoding: it.encoding}
	for i := 0; i < len(it.header.kv); i += 2 {
		m.Headers[it.header.kv[i]] = it.header.kv[i+1]
	}
	if it.encoding == "base64" {
		m.Body = base64.StdEncoding.EncodeToString(it.body)
	}
	b, err := json.Marshal(m)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// TestBatchMessageJSON: a batch message's JSON is encoding/json's of its
// BatchMessage, for strings that encoding/json escapes (quotes,
// backslashes, controls, HTML characters, invalid UTF-8, U+2028/U+2029),
// headers in any order, fences and duplicates, text and base64 bodies.
func TestBatchMessageJSON(t *testing.T) {
	odd := []string{"", "plain", `q"uote\back`, "<a&b>", "\x00\x01\x1f\x7f\b\f\n\r\t", "\xff\xfe", "é\u2028\u2029€😀", "a\xc3"}
	for k, s := range odd {
		it := &batchItem{key: s, fence: int64(k) * 1764400000000001, dup: k%2 == 1, body: []byte(s), encoding: "text"}
		if !utf8.ValidString(s) {
			it.encoding = "base64"
		}
		it.header.from(http.Header{"Z-Last": {s, "second"}, "Content-Type": {"application/json"}, "Empty": {}})
		it.header.set("idem-header-"+s, s)
		it.header.set(HeaderKey, s)
		it.header.set(HeaderKey, s+"again")
		want := marshalled(t, it)
		if got := it.appendJSON(nil); !bytes.Equal(got, want) {
			t.Errorf("%q: got %s, want %s", s, got, want)
		}
	}
}

// FuzzBatchMessageJSON: appendJSON writes what encoding/json writes for
// any key, header and body.
func FuzzBatchMessageJSON(f *testing.F) {
	f.Add("k", "X-A", "v", []byte(`{"amount":1}`), int64(1))
	f.Add("<&>", "\u2028", "\xff", []byte{0xff, 0}, int64(0))
	f.Fuzz(func(t *testing.T, key, name, value string, body []byte, fence int64) {
		it := &batchItem{key: key, fence: fence, dup: fence == 0, body: body, encoding: "text"}
		if !utf8.Valid(body) {
			it.encoding = "base64"
		}
		it.header.set(name, value)
		it.header.set(HeaderKey, key)
		if got, want := it.appendJSON(nil), marshalled(t, it); !bytes.Equal(got, want) {
			t.Errorf("got %s, want %s", got, want)
		}
	})
}

// TestResultJSON: a stored result's JSON is encoding/json's of its
// Result (what the records hold, and what readers of them decode), for
// headers in any number and order, nil and empty values, odd strings,
// empty and binary bodies, truncated and gate results.
func TestResultJSON(t *testing.T) {
	odd := []string{"", "plain", `q"uote\back`, "<a&b>", "\x00\x1f\x7f", "\xff\xfe", "é\u2028\u2029€😀"}
	many := http.Header{}
	for k := range 12 {
		many[string(rune('Z'-k))+"-Name"] = []string{odd[k%len(odd)], "second"}
	}
	cases := []Result{
		{Status: 200},
		{Status: 201, Body: []byte(`{"ok":true}`)},
		{Status: 200, Header: http.Header{}, Body: []byte{}},
		{Status: 204, Header: http.Header{"Content-Type": {"application/json"}, "Nil": nil, "Empty": {}}},
		{Status: 200, Header: many, Body: []byte{0xff, 0, 1}, Truncated: true},
		{Status: http.StatusOK, Body: []byte("row"), Gate: true},
	}
	for _, s := range odd {
		cases = append(cases, Result{Status: 299, Header: http.Header{s: {s}, "X-" + s: {s, s}}, Body: []byte(s)})
	}
	for _, r := range cases {
		want, err := json.Marshal(r)
		if err != nil {
			t.Fatal(err)
		}
		if got := r.appendJSON(nil); !bytes.Equal(got, want) {
			t.Errorf("got %s, want %s", got, want)
		}
	}
}

// FuzzResultJSON: Result.appendJSON writes what encoding/json writes for
// any header and body.
func FuzzResultJSON(f *testing.F) {
	f.Add("Content-Type", "text/plain", []byte(`ok`), true)
	f.Add("<&>", "\u2028\xff", []byte{0xff, 0}, false)
	f.Fuzz(func(t *testing.T, name, value string, body []byte, flag bool) {
		r := Result{Status: 200, Header: http.Header{name: {value}, "B": nil}, Body: body, Truncated: flag, Gate: !flag}
		want, err := json.Marshal(r)
		if err != nil {
			t.Fatal(err)
		}
		if got := r.appendJSON(nil); !bytes.Equal(got, want) {
			t.Errorf("got %s, want %s", got, want)
		}
	})
}
