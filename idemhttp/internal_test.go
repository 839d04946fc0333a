package idemhttp

import (
	"bytes"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"reflect"
	"strings"
	"testing"
	"testing/iotest"
	"time"

	"github.com/idemgo/idem"
	"github.com/idemgo/idem/internal/canonjson"
	"github.com/idemgo/idem/memstore"
)

func newTestMiddleware(t testing.TB, opts ...Option) *Middleware {
	t.Helper()
	s, err := memstore.New()
	if err != nil {
		t.Fatal(err)
	}
	exec, err := idem.New(s)
	if err != nil {
		t.Fatal(err)
	}
	m, err := New(exec, opts...)
	if err != nil {
		t.Fatal(err)
	}
	return m
}

func TestCodecRoundTrip(t *testing.T) {
	m := newTestMiddleware(t)
	tests := []struct {
		name   string
		status int
		header http.Header
		body   string
	}{
		{"empty", 200, http.Header{}, ""},
		{"fields", 201, http.Header{
			"Content-Type":    {"application/json"},
			"X-Multi":         {"a", "b", ""},
			"X-Nil":           nil,
			"x-non-canonical": {"v"},
			"Set-Cookie":      {"dropped=1"},
			"Connection":      {"close, X-Hop"},
			"X-Hop":           {"dropped"},
			"Trailer:X-Sum":   {"dropped"},
		}, `{"ok":true}`},
		{"binary body", 500, http.Header{"X": {strings.Repeat("v", 300)}}, "\x00\x01\xff" + strings.Repeat("b", 70000)},
		{"high status", 999, http.Header{}, "x"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			blob := append(m.appendHead(nil, tt.status, tt.header), tt.body...)
			got, err := decodeResponse(blob, nil)
			if err != nil {
				t.Fatalf("decodeResponse: %v", err)
			}
			want := http.Header{}
			for k, v := range tt.header {
				if m.storable(k, tt.header) {
					want[k] = v
				}
			}
			if got.status != tt.status || string(got.body) != tt.body || !reflect.DeepEqual(got.header, want) {
				t.Errorf("got %d %v %d bytes, want %d %v %d bytes", got.status, got.header, len(got.body), tt.status, want, len(tt.body))
			}
			// Equal responses encode to equal bytes.
			if again := append(m.appendHead(nil, tt.status, tt.header), tt.body...); !bytes.Equal(again, blob) {
				t.Errorf("encoding is not deterministic")
			}
		})
	}
}

func TestDecodeCorrupt(t *testing.T) {
	m := newTestMiddleware(t)
	good := append(m.appendHead(nil, 200, http.Header{"A": {"b"}}), "body"...)
	tests := []struct {
		name string
		blob []byte
		want string
	}{
		// 200 is the uvarint {200, 1}.
		{"empty", nil, "empty"},
		{"version", append([]byte{3}, good[1:]...), "unknown stored response version 3"},
		{"version 2 without trailers", append(append([]byte{2}, good[1:len(good)-4]...), 0), "without trailers"},
		{"status 0", []byte{1, 0, 0}, "invalid status 0"},
		{"status 1xx", []byte{1, 100, 0}, "invalid status 100"},
		{"status over 999", []byte{1, 0xe8, 0x07, 0}, "invalid"},
		{"no status", []byte{1}, "invalid number"},
		{"huge count", []byte{1, 200, 1, 0xff, 0xff, 0xff, 0xff, 0x0f}, "invalid number"},
		{"too many names", []byte{1, 200, 1, 100}, "header names"},
		{"truncated name", []byte{1, 200, 1, 1, 5, 'a', 'b'}, "string of 5 bytes"},
		{"truncated values", good[:6], ""},
		{"duplicate name", []byte{1, 200, 1, 2, 1, 'A', 0, 1, 'A', 0}, "out of order"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := decodeResponse(tt.blob, nil)
			if !errors.Is(err, idem.ErrCorruptResult) || !strings.Contains(err.Error(), tt.want) {
				t.Errorf("got %v, want an ErrCorruptResult containing %q", err, tt.want)
			}
		})
	}
	// A corrupt blob leaves the destination alone; a good one adds to it.
	h := http.Header{"X-Outer": {"1"}}
	if _, err := decodeResponse(good[:len(good)-5], h); err == nil || len(h) != 1 {
		t.Errorf("truncated blob: got %v and fields %v, want an error and X-Outer only", err, h)
	}
	if _, err := decodeResponse(good, h); err != nil || len(h) != 2 || h.Get("A") != "b" {
		t.Errorf("good blob: got %v and fields %v, want X-Outer and A", err, h)
	}
	// Every truncation of a good blob before its body is an error.
	head := len(m.appendHead(nil, 200, http.Header{"A": {"b"}}))
	for i := range head {
		if _, err := decodeResponse(good[:i], nil); err == nil {
			t.Errorf("truncated to %d bytes: got no error", i)
		}
	}
}

// TestReadBody checks the body limit, with reads of every size.
func TestReadBody(t *testing.T) {
	body := strings.Repeat("0123456789", 100) // 1000 bytes
	readers := map[string]func() io.Reader{
		"whole":    func() io.Reader { return strings.NewReader(body) },
		"one byte": func() io.Reader { return iotest.OneByteReader(strings.NewReader(body)) },
		"half":     func() io.Reader { return iotest.HalfReader(strings.NewReader(body)) },
		"data+EOF": func() io.Reader { return iotest.DataErrReader(strings.NewReader(body)) },
	}
	for name, r := range readers {
		for _, cl := range []int64{-1, 1000} {
			for _, tt := range []struct {
				limit int64
				ok    bool
			}{{999, false}, {1000, true}, {4096, true}} {
				var h bytes.Buffer
				got, err := readBody(r(), cl, tt.limit, &h, nil)
				if tt.ok && (err != nil || string(got) != body || h.String() != body) {
					t.Errorf("%s, length %d, limit %d: got %d bytes (%d hashed), %v, want all %d", name, cl, tt.limit, len(got), h.Len(), err, len(body))
				}
				if !tt.ok && err != errBodyTooLarge {
					t.Errorf("%s, length %d, limit %d: got %v, want errBodyTooLarge", name, cl, tt.limit, err)
				}
			}
		}
	}
	if got, err := readBody(http.NoBody, 0, 10, io.Discard, nil); got != nil || err != nil {
		t.Errorf("NoBody: got %q, %v, want nil, nil", got, err)
	}
}

func TestCanonicalJSON(t *testing.T) {
	tests := []struct {
		in, want string
		ok       bool
	}{
		{`{"b":1,"a":2}`, `{"a":2,"b":1}`, true},
		{" [ 1 , {\"z\" : null, \"y\": [true, false]} ]\n", `[1,{"y":[true,false],"z":null}]`, true},
		{`"\u0041"`, `"A"`, true},
		{`1.50`, `1.50`, true},
		{`{"a":1,"a":2}`, `{"a":2}`, true},
		{`{"a":1} {"b":2}`, "", false},
		{`{"a":`, "", false},
		{``, "", false},
		{`abc`, "", false},
	}
	for _, tt := range tests {
		got, ok := canonjson.Canonical([]byte(tt.in))
		if ok != tt.ok || string(got) != tt.want {
			t.Errorf("canonicalJSON(%q): got %q, %v, want %q, %v", tt.in, got, ok, tt.want, tt.ok)
		}
	}
}

func TestRetryAfterSeconds(t *testing.T) {
	for d, want := range map[string]string{"0s": "1", "-1s": "1", "1ns": "1", "1s": "1", "1.001s": "2", "29.5s": "30", "30s": "30"} {
		dur, _ := timeParse(d)
		if got := retryAfterSeconds(dur); got != want {
			t.Errorf("retryAfterSeconds(%s): got %s, want %s", d, got, want)
		}
	}
}

// TestCaptureWriter checks what the capturing writer records, directly.
func TestCaptureWriter(t *testing.T) {
	m := newTestMiddleware(t, WithMaxResponseSize(10))
	rec := httptest.NewRecorder()
	c := &captureWriter{w: rec, m: m}
	c.Header().Set("X-A", "1")
	c.Write([]byte("hello"))
	c.Header().Set("X-Late", "1") // after the header was written: not recorded
	io.WriteString(c, "world")
	if c.overflow || c.finish() != 200 {
		t.Fatalf("got overflow=%v status=%d, want false 200", c.overflow, c.status)
	}
	res, err := decodeResponse(c.buf, nil)
	if err != nil || string(res.body) != "helloworld" || res.header.Get("X-A") != "1" || res.header.Get("X-Late") != "" {
		t.Errorf("got %v %q %v, want X-A only and \"helloworld\"", err, res.body, res.header)
	}
	if rec.Body.Len() != 0 || !c.holding() {
		t.Fatalf("held response: the client got %q before it was sent", rec.Body.String())
	}
	c.Write([]byte("!"))
	if got := rec.Result().Header; got.Get("X-A") != "1" || got.Get("X-Late") != "" {
		t.Errorf("sent fields: got %v, want X-A only, as at WriteHeader", got)
	}
	if !c.overflow || c.buf != nil || rec.Body.String() != "helloworld!" {
		t.Errorf("over the limit: got overflow=%v, %d bytes kept, client got %q, want overflow, none kept, client got all", c.overflow, len(c.buf), rec.Body.String())
	}
	if c.Unwrap() != rec {
		t.Errorf("Unwrap: got %v, want the recorder", c.Unwrap())
	}

	// No write at all: an implicit 200 with the fields set by then.
	rec = httptest.NewRecorder()
	c = &captureWriter{w: rec, m: m}
	c.Header().Set("X-B", "2")
	if c.finish() != 200 {
		t.Errorf("implicit status: got %d, want 200", c.status)
	}
	if res, err := decodeResponse(c.buf, nil); err != nil || res.header.Get("X-B") != "2" || len(res.body) != 0 {
		t.Errorf("implicit response: got %v %v %q", err, res.header, res.body)
	}

	// Flush before any write sends the header.
	rec = httptest.NewRecorder()
	c = &captureWriter{w: rec, m: m}
	c.Flush()
	if c.status != 200 || !rec.Flushed {
		t.Errorf("Flush: got status %d flushed %v, want 200 true", c.status, rec.Flushed)
	}
	// A body on a 204 is not recorded.
	rec = httptest.NewRecorder()
	c = &captureWriter{w: rec, m: m}
	c.WriteHeader(204)
	c.Write([]byte("x")) // the recorder accepts it; net/http would not
	if c.status != 204 {
		t.Errorf("status: got %d, want 204", c.status)
	}
	// Hijack on a writer that cannot: an error, nothing marked.
	if _, _, err := c.Hijack(); err == nil || c.hijacked {
		t.Errorf("Hijack on a recorder: got %v, hijacked=%v, want an error", err, c.hijacked)
	}
}

var timeParse = time.ParseDuration

// TestCaptureWriterWithholdsEnd: a stream of declared length reaches the
// client all but its last byte until end; a write past the length fails
// as net/http fails it; with httpkit.StreamAll nothing is withheld.
func TestCaptureWriterWithholdsEnd(t *testing.T) {
	for _, tt := range []struct {
		name     string
		opts     []Option
		withheld bool
	}{
		{"stream", nil, true},
		{"stream all", []Option{func(m *Middleware) { m.streamAll = true }}, false},
	} {
		t.Run(tt.name, func(t *testing.T) {
			rec := httptest.NewRecorder()
			c := &captureWriter{w: rec, m: newTestMiddleware(t, tt.opts...)}
			c.Header().Set("Content-Type", "text/event-stream")
			c.Header().Set("Content-Length", "10")
			c.Write([]byte("hello"))
			io.WriteString(c, "world")
			want := "helloworld"
			if tt.withheld {
				want = "helloworl"
				if n, err := c.Write([]byte("!")); n != 0 || err != http.ErrContentLength {
					t.Errorf("write past the length: got %d, %v, want 0, ErrContentLength", n, err)
				}
			}
			if got := rec.Body.String(); got != want {
				t.Fatalf("before end: the client got %q, want %q", got, want)
			}
			c.end()
			if got := rec.Body.String(); got != "helloworld" {
				t.Errorf("after end: the client got %q, want %q", got, "helloworld")
			}
			if res, err := decodeResponse(c.buf, nil); err != nil || string(res.body) != "helloworld" {
				t.Errorf("recorded: got %q, %v, want the whole body", res.body, err)
			}
		})
	}
}
