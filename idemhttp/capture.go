package idemhttp

import (
	"bufio"
	"io"
	"net"
	"net/http"
	"slices"
	"strconv"
	"strings"
)

// hopByHop lists the fields that describe one connection, not the response
// (RFC 9110 section 7.6.1), as net/http/httputil.ReverseProxy does. They are
// never stored.
var hopByHop = map[string]bool{
	"Connection":          true,
	"Proxy-Connection":    true,
	"Keep-Alive":          true,
	"Proxy-Authenticate":  true,
	"Proxy-Authorization": true,
	"Te":                  true,
	"Trailer":             true,
	"Transfer-Encoding":   true,
	"Upgrade":             true,
}

// storable reports whether the response field name is stored and replayed.
func (m *Middleware) storable(name string, h http.Header) bool {
	c := http.CanonicalHeaderKey(name)
	if hopByHop[c] || m.deny[c] || c == ReplayedHeader || strings.HasPrefix(c, http.TrailerPrefix) {
		return false
	}
	// Fields named by the Connection field are hop-by-hop too.
	for _, v := range h["Connection"] {
		for tok := range strings.SplitSeq(v, ",") {
			if http.CanonicalHeaderKey(strings.TrimSpace(tok)) == c {
				return false
			}
		}
	}
	return true
}

// appendHead appends the encoding of status and the storable fields of h
// (see codec.go) to b.
func (m *Middleware) appendHead(b []byte, status int, h http.Header) []byte {
	var stack [24]string
	names := stack[:0]
	for k := range h {
		if m.storable(k, h) {
			names = append(names, k)
		}
	}
	slices.Sort(names)
	b = append(b, codecVersion)
	b = appendUvarint(b, status)
	b = appendUvarint(b, len(names))
	for _, k := range names {
		vs := h[k]
		b = appendString(b, k)
		b = appendUvarint(b, len(vs))
		for _, v := range vs {
			b = appendString(b, v)
		}
	}
	return b
}

// captureWriter passes a response through to the client and records its
// status, its fields as they were when the header was written, and its body
// up to the middleware's limit. It implements Flush, FlushError and Hijack
// itself, so that handlers that assert http.Flusher keep working, and Unwrap
// for the rest of http.ResponseController (deadlines, full duplex).
type captureWriter struct {
	w http.ResponseWriter
	m *Middleware

	status   int    // final status; 0 until the header is written
	buf      []byte // encoded head, then the body; nil after an overflow
	head     int    // length of the head in buf
	overflow bool   // the body went over the limit and is not recorded
	hijacked bool   // the handler took the connection over
}

var (
	_ http.Flusher    = (*captureWriter)(nil)
	_ http.Hijacker   = (*captureWriter)(nil)
	_ io.StringWriter = (*captureWriter)(nil)
)

func (c *captureWriter) Header() http.Header { return c.w.Header() }

// Unwrap returns the wrapped writer, for http.ResponseController.
func (c *captureWriter) Unwrap() http.ResponseWriter { return c.w }

func (c *captureWriter) WriteHeader(code int) {
	// Informational responses (103 Early Hints) pass through: the final
	// status comes later. 101 Switching Protocols is final.
	if c.status == 0 && !c.hijacked && (code < 100 || code > 199 || code == http.StatusSwitchingProtocols) {
		c.snapshot(code)
	}
	c.w.WriteHeader(code)
}

// snapshot records the final status and the fields as net/http sends them.
func (c *captureWriter) snapshot(code int) {
	c.status = code
	h := c.w.Header()
	// Room for the head and, when the handler announced its length, the
	// body, so that the buffer is allocated once.
	size := 1024
	if v := h["Content-Length"]; len(v) == 1 {
		if cl, err := strconv.Atoi(v[0]); err == nil && cl >= 0 && cl <= c.m.maxResponse {
			size = 256 + cl
		}
	}
	c.buf = c.m.appendHead(make([]byte, 0, size), code, h)
	c.head = len(c.buf)
}

func (c *captureWriter) implicitHeader() {
	if c.status == 0 && !c.hijacked {
		c.WriteHeader(http.StatusOK)
	}
}

func (c *captureWriter) Write(p []byte) (int, error) {
	c.implicitHeader()
	n, err := c.w.Write(p)
	// The whole of p is recorded even if the client went away: the stored
	// response is what the handler produced, for the client's retry.
	if err != http.ErrBodyNotAllowed && c.room(len(p)) {
		c.buf = append(c.buf, p...)
	}
	return n, err
}

func (c *captureWriter) WriteString(s string) (int, error) {
	c.implicitHeader()
	n, err := io.WriteString(c.w, s)
	if err != http.ErrBodyNotAllowed && c.room(len(s)) {
		c.buf = append(c.buf, s...)
	}
	return n, err
}

// room reports whether n more body bytes are to be recorded. Once the body
// goes over the limit, nothing more is.
func (c *captureWriter) room(n int) bool {
	if c.overflow || c.hijacked {
		return false
	}
	if len(c.buf)-c.head+n > c.m.maxResponse {
		c.overflow = true
		c.buf = nil
		return false
	}
	return true
}

// FlushError flushes the response to the client, as http.ResponseController
// does.
func (c *captureWriter) FlushError() error {
	c.implicitHeader()
	return http.NewResponseController(c.w).Flush()
}

// Flush implements http.Flusher.
func (c *captureWriter) Flush() { _ = c.FlushError() }

// Hijack takes the connection over, if the wrapped writer supports it. The
// middleware cannot know what is sent on a hijacked connection, so it
// releases the key instead of storing a response.
func (c *captureWriter) Hijack() (net.Conn, *bufio.ReadWriter, error) {
	conn, rw, err := http.NewResponseController(c.w).Hijack()
	if err == nil {
		c.hijacked = true
	}
	return conn, rw, err
}

// finish returns the final status, recording the header as net/http sends
// it if the handler wrote nothing (an implicit 200).
func (c *captureWriter) finish() int {
	if c.status == 0 && !c.hijacked {
		c.snapshot(http.StatusOK)
	}
	return c.status
}
