package idemproxy

import (
	"context"
	"io"
	"net/http"
	"net/http/httptrace"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

type exchangeKey struct{}

// exchange is the state of one covered request, and its context: it holds
// the values of the request's context but not its cancellation (as
// context.WithoutCancel), so that a client that goes away does not cancel
// the upstream call. The call then runs to its end and its response is
// stored, for the client's retry; otherwise the outcome would be unknown and
// the key stuck until its lease ends. One allocation holds it all.
type exchange struct {
	parent context.Context
	trace  httptrace.ClientTrace
	w      clientWriter

	// sent is set once the request's header was written to an upstream
	// connection, by the transport's goroutine.
	sent atomic.Bool

	// Set on the request's goroutine, read by the Policy and the hook
	// after the upstream call returned.
	failure      UpstreamFailure
	broke        bool          // the response broke off after its header
	upstreamTime time.Duration // the upstream call, body included
}

func (x *exchange) Deadline() (time.Time, bool) { return time.Time{}, false }
func (x *exchange) Done() <-chan struct{}       { return nil }
func (x *exchange) Err() error                  { return nil }
func (x *exchange) Value(key any) any {
	if key == (exchangeKey{}) {
		return x
	}
	return x.parent.Value(key)
}

func (x *exchange) wroteHeaders() { x.sent.Store(true) }

func exchangeFrom(ctx context.Context) *exchange {
	x, _ := ctx.Value(exchangeKey{}).(*exchange)
	return x
}

// clientWriter is what the reverse proxy writes the upstream's response to.
// It hides write errors (the client went away), so that the proxy reads the
// whole response and the middleware stores it for the client's retry.
type clientWriter struct {
	http.ResponseWriter

	// header is the field map, as the writer returned it before the final
	// header was written; final is set when it is. trailers is set (by
	// ModifyResponse) when the upstream's response announces trailers.
	header   http.Header
	final    bool
	trailers bool
}

// Header returns the response's field map. After the final header,
// ReverseProxy asks for the map again to copy the upstream's trailers into
// it, also when there are none; the middleware's writer would then keep a
// copy of the fields as they were, so that later changes go to the trailers
// only. A response without announced trailers has nothing to copy (an
// unannounced one comes as http.TrailerPrefix fields, which net/http
// never sends in a header), so it gets the map it had, and no copy is
// made.
func (c *clientWriter) Header() http.Header {
	if c.final && !c.trailers && c.header != nil {
		return c.header
	}
	c.header = c.ResponseWriter.Header()
	return c.header
}

func (c *clientWriter) WriteHeader(code int) {
	if code >= 200 {
		c.final = true
		keepContentType(c.ResponseWriter.Header())
	}
	c.ResponseWriter.WriteHeader(code)
}

func (c *clientWriter) Write(p []byte) (int, error) {
	_, _ = c.ResponseWriter.Write(p)
	return len(p), nil
}

// Unwrap returns the middleware's writer, for http.ResponseController
// (flushes, and the hijack of a protocol upgrade).
func (c *clientWriter) Unwrap() http.ResponseWriter { return c.ResponseWriter }

// keepContentType keeps net/http from adding a Content-Type to an
// upstream's response that has none (by sniffing the body): the field is
// set with no value, which net/http sends as nothing. The transport
// decodes a body it asked gzip for (the proxy does not pass the client's
// Accept-Encoding on with covered requests) and removes its
// Content-Encoding, after which net/http would sniff and add one; the
// client is to get the upstream's fields exactly, and so is a replay.
func keepContentType(h http.Header) {
	if _, ok := h["Content-Type"]; !ok {
		h["Content-Type"] = nil
	}
}

// passWriter is what the reverse proxy writes the upstream's response to
// for a request that the middleware does not cover. It records the status
// and the upstream's failure for the Observer.
type passWriter struct {
	http.ResponseWriter
	status  int
	failure UpstreamFailure
}

func (p *passWriter) WriteHeader(code int) {
	if code >= 200 {
		keepContentType(p.ResponseWriter.Header())
		if p.status == 0 {
			p.status = code
		}
	}
	p.ResponseWriter.WriteHeader(code)
}

func (p *passWriter) Write(b []byte) (int, error) {
	if p.status == 0 {
		p.status = http.StatusOK
	}
	return p.ResponseWriter.Write(b)
}

// Unwrap returns the wrapped writer, for http.ResponseController.
func (p *passWriter) Unwrap() http.ResponseWriter { return p.ResponseWriter }

// deadlineWriter sets the connection's write deadline when the final
// header of a response is written: from then on the client has the write
// timeout to receive the response. A slow reader would otherwise hold its
// request, and what the proxy holds for it, for as long as it likes.
// text/event-stream responses, which last as long as their stream, have
// no deadline.
type deadlineWriter struct {
	http.ResponseWriter
	d     time.Duration
	armed bool
}

func (w *deadlineWriter) arm(code int) {
	if w.armed || code < 200 {
		// Informational, or 101 Switching Protocols: an upgraded
		// connection (hijacked) keeps no deadline of the response's.
		return
	}
	w.armed = true
	if ct := w.Header().Get("Content-Type"); strings.HasPrefix(strings.ToLower(strings.TrimSpace(ct)), "text/event-stream") {
		return
	}
	_ = http.NewResponseController(w.ResponseWriter).SetWriteDeadline(time.Now().Add(w.d))
}

func (w *deadlineWriter) WriteHeader(code int) {
	w.arm(code)
	w.ResponseWriter.WriteHeader(code)
}

func (w *deadlineWriter) Write(p []byte) (int, error) {
	w.arm(http.StatusOK)
	return w.ResponseWriter.Write(p)
}

// Unwrap returns the wrapped writer, for http.ResponseController.
func (w *deadlineWriter) Unwrap() http.ResponseWriter { return w.ResponseWriter }

// deadlineBody is a request body read under a connection read deadline,
// which it lifts when the body has arrived whole.
type deadlineBody struct {
	io.ReadCloser
	rc       *http.ResponseController
	deadline time.Time
	lifted   bool
}

func (b *deadlineBody) Read(p []byte) (int, error) {
	n, err := b.ReadCloser.Read(p)
	if err == io.EOF && !b.lifted {
		b.lifted = true
		_ = b.rc.SetReadDeadline(time.Time{})
	}
	return n, err
}

// Bounds of drain: as much as net/http reads of a body its handler left,
// for as long as a client that is sending takes to send it.
const (
	maxDrain  = 256 << 10
	drainWait = time.Second
)

// drain reads and discards what is left of a body the handler did not
// read to its end (a request refused before its body was in: 503 when the
// bodies' memory is full, 413), at most maxDrain bytes for at most
// drainWait and not past the body deadline, before the answer goes.
// net/http does as much for a client that keeps its connection, not for
// one that asked to close it (or any HTTP/1.0 client): closed with bytes
// it did not read, the connection is reset (RST), and a reset that
// overtakes the answer (a loaded machine can delay its sending) destroys
// it, or fails the client's write of its body, which Go's client then
// reports instead of the answer. A stalled body's deadline passed already:
// nothing is read.
func (b *deadlineBody) drain() {
	if b.lifted {
		return
	}
	if d := time.Now().Add(drainWait); d.Before(b.deadline) {
		_ = b.rc.SetReadDeadline(d)
	}
	io.CopyN(io.Discard, b, maxDrain)
}

// copyBufferSize is the size of the buffers that copy response bodies, as
// ReverseProxy's own.
const copyBufferSize = 32 << 10

var copyBufferPool = sync.Pool{New: func() any { return new([copyBufferSize]byte) }}

// copyBuffers is the ReverseProxy's BufferPool: without one, it allocates
// 32 KiB per response. Arrays are pooled by pointer, so that Put does not
// allocate either.
type copyBuffers struct{}

func (copyBuffers) Get() []byte { return copyBufferPool.Get().(*[copyBufferSize]byte)[:] }

func (copyBuffers) Put(b []byte) {
	if len(b) == copyBufferSize {
		copyBufferPool.Put((*[copyBufferSize]byte)(b))
	}
}
