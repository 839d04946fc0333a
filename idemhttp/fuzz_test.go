package idemhttp

import (
	"bytes"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"testing/iotest"

	"github.com/idemgo/idem"
	"github.com/idemgo/idem/internal/canonjson"
	"github.com/idemgo/idem/internal/httpsyntax"
	"github.com/idemgo/idem/storekit"
)

func FuzzParseKey(f *testing.F) {
	for _, s := range []string{
		"abc", `"abc"`, `"a\"b\\c"`, `""`, `"`, `"abc`, `"a\nb"`, `"abc";p=1`,
		"  key\t", "a\x00b", "caf\xc3\xa9", strings.Repeat("k", 255), strings.Repeat("k", 256),
		`"` + strings.Repeat(`\\`, 255) + `"`, "8e03978e-40d5-43e8-bc93-6894a57f9324",
	} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, v string) {
		k, err := ParseKey(v)
		if err != nil {
			if !errors.Is(err, ErrInvalidKey) {
				t.Fatalf("ParseKey(%q): error %v does not wrap ErrInvalidKey", v, err)
			}
			return
		}
		if len(k) < 1 || len(k) > storekit.MaxKeyLen {
			t.Fatalf("ParseKey(%q) = %q: length %d out of [1, %d]", v, k, len(k), storekit.MaxKeyLen)
		}
		for i := 0; i < len(k); i++ {
			if k[i] < 0x20 || k[i] > 0x7e {
				t.Fatalf("ParseKey(%q) = %q: byte %#x at %d is not printable ASCII", v, k, k[i], i)
			}
		}
		// The key, quoted as an sf-string, parses back to itself.
		q := `"` + strings.NewReplacer(`\`, `\\`, `"`, `\"`).Replace(k) + `"`
		if k2, err := ParseKey(q); err != nil || k2 != k {
			t.Fatalf("ParseKey(%q) = %q, %v; want %q (quoted form of the key of %q)", q, k2, err, k, v)
		}
		// A bare key parses to itself.
		if k[0] != '"' && trimOWS(k) == k {
			if k2, err := ParseKey(k); err != nil || k2 != k {
				t.Fatalf("ParseKey(%q) = %q, %v; want it unchanged", k, k2, err)
			}
		}
	})
}

func FuzzFingerprint(f *testing.F) {
	f.Add("POST", "/p", "", "", []byte(`{"a":1}`), false)
	f.Add("POST", "/p", "x=1", "acct", []byte(`{"b":[1,2],"a":{"c":null}}`), true)
	f.Add("PATCH", "/a%2Fb", "", "", []byte("not json"), true)
	f.Add("POST", "/", "", "", []byte{}, true)
	f.Add("POST", "/", "", "v", bytes.Repeat([]byte("x"), 5000), false)
	mws := map[bool]*Middleware{}
	for _, canonical := range []bool{false, true} {
		mws[canonical] = newTestMiddleware(f, WithMaxBodySize(4096), WithCanonicalJSON(canonical), WithFingerprintHeaders("X-Account"))
	}
	f.Fuzz(func(t *testing.T, method, path, query, hdr string, body []byte, canonical bool) {
		if !httpsyntax.IsToken(method) || !strings.HasPrefix(path, "/") || !urlSafe(path+query) {
			return
		}
		m := mws[canonical]
		req := func(b []byte, oneByte bool) *http.Request {
			target := path
			if query != "" {
				target += "?" + query
			}
			r := httptest.NewRequest(method, "http://example.com"+target, bytes.NewReader(b))
			if oneByte { // a chunked body that arrives one byte at a time
				r.Body = http.NoBody
				if len(b) > 0 {
					r.Body = readCloser{iotest.OneByteReader(bytes.NewReader(b))}
				}
				r.ContentLength = -1
			}
			r.Header["X-Account"] = []string{hdr}
			return r
		}
		got, fp, err := m.fingerprint(req(body, false))
		if len(body) > 4096 {
			if err != errBodyTooLarge {
				t.Fatalf("body of %d bytes: got %v, want errBodyTooLarge", len(body), err)
			}
			return
		}
		if err != nil {
			t.Fatalf("fingerprint: %v", err)
		}
		if !bytes.Equal(got, body) {
			t.Fatalf("body: got %q, want %q", got, body)
		}
		if len(fp) != fingerprintLen || len(fp) > storekit.MaxFingerprintLen {
			t.Fatalf("fingerprint length %d, want %d", len(fp), fingerprintLen)
		}
		// Streamed in small reads, the fingerprint is the same.
		got2, fp2, err := m.fingerprint(req(body, true))
		if err != nil || fp2 != fp || !bytes.Equal(got2, body) {
			t.Fatalf("one byte at a time: got %x, %v, want %x", fp2, err, fp)
		}
		// Another body, or another selected field, is another fingerprint
		// (in canonical mode, unless both bodies canonicalise alike).
		other := append(append([]byte(nil), body...), ' ')
		if _, fp3, _ := m.fingerprint(req(other, false)); fp3 == fp {
			if _, ok := canonjson.Canonical(body); !canonical || !ok {
				t.Fatalf("body %q and %q share a fingerprint", body, other)
			}
		}
		r := req(body, false)
		r.Header["X-Account"] = []string{hdr + "x"}
		if _, fp4, _ := m.fingerprint(r); fp4 == fp {
			t.Fatalf("fields %q and %q share a fingerprint", hdr, hdr+"x")
		}
		if canonical {
			if c, ok := canonjson.Canonical(body); ok {
				c2, ok2 := canonjson.Canonical(c)
				if !ok2 || !bytes.Equal(c, c2) {
					t.Fatalf("canonical form %q is not canonical: %q, %v", c, c2, ok2)
				}
				if _, fp5, _ := m.fingerprint(req(c, false)); fp5 != fp {
					t.Fatalf("body %q and its canonical form %q have different fingerprints", body, c)
				}
			}
		}
	})
}

type readCloser struct{ r io.Reader }

func (rc readCloser) Read(p []byte) (int, error) { return rc.r.Read(p) }
func (readCloser) Close() error                  { return nil }

func FuzzDecodeResponse(f *testing.F) {
	m := newTestMiddleware(f)
	f.Add(append(m.appendHead(nil, 201, http.Header{"Content-Type": {"application/json"}, "X": {"a", "b"}, "Y": nil}), `{"ok":1}`...))
	f.Add([]byte{1, 200, 1, 0})
	f.Add(append(appendFields([]byte{2, 200, 1, 0}, http.Header{"X-Checksum": {"abc"}, "Trailer:X-Late": {"late"}}, []string{"Trailer:X-Late", "X-Checksum"}), "body"...))
	f.Add([]byte{1, 200, 1, 2, 1, 'A', 0, 1, 'A', 0})
	f.Add([]byte{})
	f.Fuzz(func(t *testing.T, blob []byte) {
		res, err := decodeResponse(blob, nil)
		if err != nil {
			if !errors.Is(err, idem.ErrCorruptResult) {
				t.Fatalf("error %v does not wrap idem.ErrCorruptResult", err)
			}
			return
		}
		if res.status < 200 || res.status > 999 {
			t.Fatalf("status %d", res.status)
		}
		if !bytes.HasSuffix(blob, res.body) {
			t.Fatalf("body %q is not the end of the blob", res.body)
		}
		// Re-encoding the storable part decodes to the same.
		again, err := decodeResponse(append(m.appendHead(nil, res.status, res.header), res.body...), nil)
		if err != nil || again.status != res.status || !bytes.Equal(again.body, res.body) {
			t.Fatalf("re-encoding: got %v %d %q, want %d %q", err, again.status, again.body, res.status, res.body)
		}
	})
}

// urlSafe reports whether s is printable ASCII without the characters that
// would make it another URL.
func urlSafe(s string) bool {
	for i := 0; i < len(s); i++ {
		if s[i] <= 0x20 || s[i] >= 0x7f || strings.IndexByte("#?%", s[i]) >= 0 {
			return false
		}
	}
	return true
}
