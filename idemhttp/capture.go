package idemhttp

import (
	"bufio"
	"io"
	"maps"
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
	return appendFields(b, h, names)
}

// appendFields appends the encoding of the fields of h named by names,
// which are sorted (see codec.go), to b.
func appendFields(b []byte, h http.Header, names []string) []byte {
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

// announcedTrailers returns the canonical names that the Trailer fields of
// h announce.
func announcedTrailers(h http.Header) []string {
	var names []string
	for _, v := range h["Trailer"] {
		for name := range strings.SplitSeq(v, ",") {
			if name = strings.TrimSpace(name); name != "" {
				names = append(names, http.CanonicalHeaderKey(name))
			}
		}
	}
	return names
}

// captureWriter records a response: its final status, its fields as they
// were when the header was written, and its body up to the middleware's
// limit. It holds the response back from the client until the middleware
// has stored it (see send), except for a stream, which it passes through as
// it is written, all but the last byte of a body of declared length (see
// end): a text/event-stream response, a response whose handler flushes it
// (unless httpkit.StreamOnFlush(false)), a body over the limit (from the write
// that crosses it), 101 Switching Protocols and a hijacked connection. Informational responses (103 Early Hints) always pass
// through. It implements Flush, FlushError and Hijack itself, so that
// handlers that assert http.Flusher keep working, and Unwrap for the rest
// of http.ResponseController (deadlines, full duplex).
type captureWriter struct {
	w http.ResponseWriter
	m *Middleware

	status   int    // final status; 0 until the header is written
	buf      []byte // encoded head, then the body; nil after an overflow
	head     int    // length of the head in buf
	overflow bool   // the body went over the limit and is not recorded
	hijacked bool   // the handler took the connection over
	sent     bool   // the header went to the client: the rest passes through

	// announced holds the trailer names that the header announced (the
	// Trailer field), when it was written.
	announced []string

	// frozen holds the fields as they were when the handler wrote the
	// header, once the handler asked for the field map again while the
	// response was held (to set trailers, or a field net/http would
	// ignore): the client gets them as net/http would have sent them.
	frozen http.Header

	// The end of a stream is withheld until the middleware has recorded
	// the response (see end): net/http writes the end of a body of
	// unknown length (the terminating chunk; END_STREAM on HTTP/2) only
	// when the handler returns, and the writer holds back the last byte
	// of a body of declared length. withhold is set when a stream's
	// header goes to the client with a Content-Length, length is that
	// length, passed the body bytes the client was sent, and tail the
	// withheld byte once the rest of the body passed (tailHeld).
	withhold bool
	tailHeld bool
	ended    bool // the end may reach the client
	length   int64
	passed   int64
	tail     [1]byte
}

var (
	_ http.Flusher    = (*captureWriter)(nil)
	_ http.Hijacker   = (*captureWriter)(nil)
	_ io.StringWriter = (*captureWriter)(nil)
)

func (c *captureWriter) Header() http.Header {
	if c.holding() && c.frozen == nil {
		c.frozen = c.w.Header().Clone()
	}
	return c.w.Header()
}

// Unwrap returns the wrapped writer, for http.ResponseController.
func (c *captureWriter) Unwrap() http.ResponseWriter { return c.w }

// holding reports whether the final header was written and is held back.
func (c *captureWriter) holding() bool { return c.status != 0 && !c.sent && !c.hijacked }

func (c *captureWriter) WriteHeader(code int) {
	switch {
	case c.hijacked || code < 100 || code > 999:
		// net/http logs the first and panics on the second, in the
		// handler, as without the middleware.
		c.w.WriteHeader(code)
	case c.status != 0:
		// A superfluous call: net/http logs it and ignores it.
		if c.sent {
			c.w.WriteHeader(code)
		}
	case code < 200 && code != http.StatusSwitchingProtocols:
		// Informational (103 Early Hints): the final status comes later.
		c.w.WriteHeader(code)
	default:
		c.snapshot(code)
		if c.m.streamAll || code == http.StatusSwitchingProtocols || isEventStream(c.w.Header()) {
			c.sent = true
			c.armEnd(c.w.Header())
			c.w.WriteHeader(code)
		}
	}
}

// isEventStream reports whether the fields announce a text/event-stream
// response (server-sent events), which is always streamed.
func isEventStream(h http.Header) bool {
	v := h["Content-Type"]
	if len(v) == 0 {
		return false
	}
	mt, _, _ := strings.Cut(v[0], ";")
	return strings.EqualFold(strings.TrimSpace(mt), "text/event-stream")
}

// snapshot records the final status and the fields as net/http sends them.
// A handler's own Idempotent-Replayed field (an upstream's, behind the idem
// proxy) is removed first: on a response that ran the handler it would
// tell the client that this execution was a replay.
func (c *captureWriter) snapshot(code int) {
	c.status = code
	h := c.w.Header()
	delete(h, ReplayedHeader)
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
	if len(h["Trailer"]) > 0 {
		c.announced = announcedTrailers(h)
	}
}

// recordTrailers adds the response's trailers to the recorded response,
// once the handler has returned: the values of the announced names, and
// the fields named with http.TrailerPrefix, as net/http sends them then.
func (c *captureWriter) recordTrailers() {
	if c.buf == nil || c.hijacked {
		return
	}
	h := c.w.Header()
	var stack [8]string
	names := stack[:0]
	for _, k := range c.announced {
		if _, ok := h[k]; ok && c.m.storable(k, h) {
			names = append(names, k)
		}
	}
	for k := range h {
		if name, ok := strings.CutPrefix(k, http.TrailerPrefix); ok && c.m.storable(name, h) {
			names = append(names, k)
		}
	}
	if len(names) == 0 {
		return
	}
	slices.Sort(names)
	names = slices.Compact(names)
	// The trailers go between the fields and the body (see codec.go).
	t := appendFields(nil, h, names)
	c.buf = slices.Insert(c.buf, c.head, t...)
	c.buf[0] = codecTrailers
	c.head += len(t)
}

func (c *captureWriter) implicitHeader() {
	if c.status == 0 && !c.hijacked {
		c.WriteHeader(http.StatusOK)
	}
}

func (c *captureWriter) Write(p []byte) (int, error) { return write(c, p, c.w.Write) }

func (c *captureWriter) WriteString(s string) (int, error) {
	return write(c, s, func(s string) (int, error) { return io.WriteString(c.w, s) })
}

// write records p and holds it back, or writes it to the client with
// through.
func write[T ~string | ~[]byte](c *captureWriter, p T, through func(T) (int, error)) (int, error) {
	c.implicitHeader()
	if c.holding() {
		if !bodyAllowed(c.status) {
			return 0, http.ErrBodyNotAllowed
		}
		if c.keep(len(p)) {
			c.buf = append(c.buf, p...)
			return len(p), nil
		}
		// Over the limit: keep sent what was held; p goes through.
	}
	n, err := pass(c, p, through)
	// The whole of p is recorded even if the client went away: the stored
	// response is what the handler produced, for the client's retry. What
	// net/http refuses to send (a body on a status without one, bytes past
	// the declared length) is not.
	if err != http.ErrBodyNotAllowed && err != http.ErrContentLength && c.keep(len(p)) {
		c.buf = append(c.buf, p...)
	}
	return n, err
}

// pass writes p to the client with through, withholding the last byte of a
// body of declared length until the end may pass (see end). A write past
// the declared length fails as net/http fails it.
func pass[T ~string | ~[]byte](c *captureWriter, p T, through func(T) (int, error)) (int, error) {
	if !c.withhold || len(p) == 0 {
		return through(p)
	}
	if c.tailHeld {
		return 0, http.ErrContentLength
	}
	if c.passed+int64(len(p)) != c.length {
		n, err := through(p)
		c.passed += int64(n)
		return n, err
	}
	n, err := through(p[:len(p)-1])
	c.passed += int64(n)
	if err != nil {
		return n, err
	}
	c.tail[0], c.tailHeld = p[len(p)-1], true
	return len(p), nil
}

// armEnd makes the writer withhold the last byte of the body, when the
// fields h that go to the client declare its length, until the end may
// pass. httpkit.StreamAll writes the whole response through, end included.
func (c *captureWriter) armEnd(h http.Header) {
	if c.ended || c.m.streamAll || c.status < 200 || !bodyAllowed(c.status) {
		return
	}
	v := h["Content-Length"]
	if len(v) != 1 {
		return
	}
	if n, err := strconv.ParseInt(v[0], 10, 64); err == nil && n > 0 {
		c.withhold, c.length = true, n
	}
}

// end lets the end of the response reach the client, once the middleware
// has recorded it (or decided not to): a held response is sent, and the
// withheld last byte of a stream is written. The handler's return then
// ends the response.
func (c *captureWriter) end() {
	c.ended = true
	c.send()
	if c.tailHeld {
		c.tailHeld = false
		_, _ = c.w.Write(c.tail[:])
	}
	c.withhold = false
}

// bodyAllowed reports whether a response with the status may have a body,
// as net/http decides.
func bodyAllowed(status int) bool {
	return status >= 200 && status != http.StatusNoContent && status != http.StatusNotModified
}

// keep reports whether n more body bytes are to be recorded. Once the body
// goes over the limit nothing more is: the response is not stored, and a
// response that was held is sent with what it held.
func (c *captureWriter) keep(n int) bool {
	if c.overflow || c.hijacked {
		return false
	}
	if len(c.buf)-c.head+n > c.m.maxResponse {
		c.send()
		c.overflow = true
		c.buf = nil
		return false
	}
	return true
}

// send writes a held response to the client: the header as the handler
// wrote it, and the body recorded so far. From then on the response passes
// through. It does nothing if the header was sent already or not written.
func (c *captureWriter) send() {
	if !c.holding() {
		return
	}
	c.sent = true
	if c.frozen != nil {
		// The fields as they were at WriteHeader for the header; the
		// handler's later values back for the trailers, which net/http
		// reads from the map when the handler returns.
		c.armEnd(c.frozen)
		h := c.w.Header()
		later := maps.Clone(h)
		clear(h)
		maps.Copy(h, c.frozen)
		// Trailers set since under http.TrailerPrefix go with the header,
		// which net/http leaves them out of: with them there it sends the
		// body in chunks, with room for the trailers, where it would
		// otherwise send a short body with a Content-Length and drop them.
		for k, vs := range later {
			if strings.HasPrefix(k, http.TrailerPrefix) {
				h[k] = vs
			}
		}
		c.w.WriteHeader(c.status)
		clear(h)
		maps.Copy(h, later)
	} else {
		c.armEnd(c.w.Header())
		c.w.WriteHeader(c.status)
	}
	if len(c.buf) > c.head {
		_, _ = pass(c, c.buf[c.head:], c.w.Write)
	}
}

// FlushError flushes the response to the client, as http.ResponseController
// does. A held response is sent first and streamed from then on, unless
// httpkit.StreamOnFlush(false) said that flushes do not make a stream: then a
// held response stays held and the flush does nothing.
func (c *captureWriter) FlushError() error {
	c.implicitHeader()
	if c.holding() {
		if !c.m.streamOnFlush {
			return nil
		}
		c.send()
	}
	return http.NewResponseController(c.w).Flush()
}

// Flush implements http.Flusher.
func (c *captureWriter) Flush() { _ = c.FlushError() }

// Hijack takes the connection over, if the wrapped writer supports it, after
// sending a held header, as net/http does. The middleware cannot know what
// is sent on a hijacked connection, so it releases the key instead of
// storing a response.
func (c *captureWriter) Hijack() (net.Conn, *bufio.ReadWriter, error) {
	c.send()
	conn, rw, err := http.NewResponseController(c.w).Hijack()
	if err == nil {
		c.hijacked, c.withhold = true, false
	}
	return conn, rw, err
}

// finish returns the final status, recording the header as net/http sends
// it if the handler wrote nothing (an implicit 200), and records the
// trailers. It sends nothing.
func (c *captureWriter) finish() int {
	if c.status == 0 && !c.hijacked {
		c.snapshot(http.StatusOK)
	}
	c.recordTrailers()
	return c.status
}
