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
