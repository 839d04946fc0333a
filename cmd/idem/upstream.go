package main

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptrace"
	"net/http/httputil"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/idemgo/idem"
	"github.com/idemgo/idem/idemhttp"
	"go.opentelemetry.io/otel/propagation"
)

// How the proxy handles a covered request (one whose method the middleware
// covers):
//
//	gateway.ServeHTTP         creates the request's exchange
//	  idemhttp middleware     key, fingerprint, acquire; store or release after
//	    gateway.forward       httputil.ReverseProxy to the upstream
//
// The exchange is the request's context (without the client's
// cancellation: see exchange) and carries what the upstream call found out
// to the middleware's Policy, which decides what happens to the key:
//
//   - The upstream answered: the --store-policy decides, by default
//     DefaultPolicy (every status is stored except 408, 409, 425, 429 and
//     503, which release the key), also when the upstream itself answered
//     502 or 504.
//   - The request never reached the upstream (no connection, DNS failure,
//     TLS handshake failure: nothing was written to it): 502, key released,
//     a retry runs at once.
//   - The request was sent and no response came (timeout: 504; broken
//     connection: 502), or the response broke off half way: the upstream may
//     have acted, so the key is abandoned to its lease (idemhttp.AbandonKey)
//     and retries get 409 until the lease ends.

// upstreamFailure is what went wrong with an upstream call.
type upstreamFailure uint8

const (
	failUnreachable upstreamFailure = iota // nothing was sent
	failTimeout                            // sent, no response in time
	failBroken                             // sent, the connection failed
	upstreamFailureKinds
)

var upstreamFailureNames = [upstreamFailureKinds]string{"unreachable", "timeout", "broken"}

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
	failed       bool
	failure      upstreamFailure
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
// for a request that the middleware does not cover.
type passWriter struct{ http.ResponseWriter }

func (p passWriter) WriteHeader(code int) {
	if code >= 200 {
		keepContentType(p.ResponseWriter.Header())
	}
	p.ResponseWriter.WriteHeader(code)
}

// Unwrap returns the wrapped writer, for http.ResponseController.
func (p passWriter) Unwrap() http.ResponseWriter { return p.ResponseWriter }

func (c *clientWriter) Write(p []byte) (int, error) {
	_, _ = c.ResponseWriter.Write(p)
	return len(p), nil
}

// Unwrap returns the middleware's writer, for http.ResponseController
// (flushes, and the hijack of a protocol upgrade).
func (c *clientWriter) Unwrap() http.ResponseWriter { return c.ResponseWriter }

// gateway is the proxy's handler.
type gateway struct {
	protected http.Handler // the middleware around forward
	rp        *httputil.ReverseProxy
	covered   map[string]bool
	lease     time.Duration
	obs       *observer
	log       *slog.Logger
	tracing   *tracing // nil: tracing off

	// fenceHeader is the canonical name of the request header that carries
	// the attempt's fencing token to the upstream ("": off). Set before the
	// gateway serves.
	fenceHeader string
	// writeTimeout bounds the time a response takes to reach the client,
	// from its header (0: none). Set before the gateway serves.
	writeTimeout time.Duration
	// bodyTimeout bounds the time a request's body takes to arrive (0: no
	// bound); maxActive the requests handled at once (0: no bound). Set
	// before the gateway serves.
	bodyTimeout time.Duration
	maxActive   int64
	active      atomic.Int64
	// mw writes the proxy's own error responses, as its own
	// (--error-body, --problem-type-base).
	mw *idemhttp.Middleware
}

// writeError writes one of the proxy's own error responses.
func (g *gateway) writeError(w http.ResponseWriter, r *http.Request, p *idemhttp.Problem) {
	g.mw.WriteError(w, r, p)
}

// drain waits at most d for the requests being handled to end, once the
// server accepts no more, and reports whether they did. It looks every
// 10ms.
func (g *gateway) drain(d time.Duration) bool {
	deadline := time.Now().Add(d)
	for g.obs.inFlight.Load() > 0 {
		if time.Now().After(deadline) {
			return false
		}
		time.Sleep(10 * time.Millisecond)
	}
	return true
}

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

func newGateway(target *url.URL, transport http.RoundTripper, mw *idemhttp.Middleware, methods []string, lease time.Duration, obs *observer, log *slog.Logger) *gateway {
	g := &gateway{covered: make(map[string]bool), lease: lease, obs: obs, log: log, mw: mw}
	for _, m := range methods {
		g.covered[m] = true
	}
	g.rp = &httputil.ReverseProxy{
		Rewrite: func(pr *httputil.ProxyRequest) {
			pr.SetURL(target)
			pr.SetXForwarded()
			if pr.Out.Body == nil && g.covers(pr.Out.Method) {
				hideIdempotencyKey(pr.Out.Header)
			}
			// The client gets its 100 Continue from this server, when the
			// body is first read (by the middleware, or by the transport
			// as it sends it on). Forwarding Expect would relay the
			// upstream's 100 as a second one: the transport starts
			// sending the body before ReverseProxy relays the upstream's
			// 100, so the two race even for a request passed through.
			pr.Out.Header.Del("Expect")
			if exchangeFrom(pr.Out.Context()) != nil {
				// The response is stored for retries that may not accept
				// the encoding this client accepts: without the client's
				// Accept-Encoding the transport asks for gzip itself and
				// decodes it, so the identity form is stored, which every
				// retry accepts.
				pr.Out.Header.Del("Accept-Encoding")
			}
			stripTrailers(pr.Out.Trailer, g.fenceHeader)
			if g.fenceHeader != "" {
				setFence(pr.Out, g.fenceHeader)
			}
			if g.tracing != nil {
				// The upstream's spans become children of the proxy's
				// (without tracing, the client's traceparent passes
				// through as it is).
				g.tracing.prop.Inject(pr.Out.Context(), propagation.HeaderCarrier(pr.Out.Header))
			}
		},
		ModifyResponse: func(res *http.Response) error {
			if x := exchangeFrom(res.Request.Context()); x != nil {
				x.w.trailers = len(res.Trailer) > 0
			}
			return nil
		},
		Transport:    transport,
		BufferPool:   copyBuffers{},
		ErrorHandler: g.upstreamError,
		ErrorLog:     slog.NewLogLogger(log.Handler(), slog.LevelWarn),
	}
	g.protected = mw.Handler(http.HandlerFunc(g.forward))
	return g
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

// hideIdempotencyKey stores the Idempotency-Key and X-Idempotency-Key
// fields of an outgoing request without a body under lower-case names.
// net/http's transport takes a body-less request that carries one of them
// for replayable, and sends it again when a reused connection breaks after
// the request was written, when the upstream may have acted on it already.
// The upstream is not idempotent (that is why the proxy is in front of it),
// so it must not. Field names are case-insensitive: the upstream sees the
// same fields (HTTP/2 lower-cases every name anyway).
func hideIdempotencyKey(h http.Header) {
	for _, n := range [...]struct{ canonical, lower string }{
		{"Idempotency-Key", "idempotency-key"},
		{"X-Idempotency-Key", "x-idempotency-key"},
	} {
		if v, ok := h[n.canonical]; ok {
			delete(h, n.canonical)
			h[n.lower] = v
		}
	}
}

// setFence replaces the fence header (canonical name) of an outgoing
// request with the fencing token of the attempt that runs it. The client's
// own fields of that name are always removed, also from requests that run
// without a key (passthrough, fail open): only the proxy may tell the
// upstream a fence. So are those spelt with _ for -, which CGI-style
// servers (and frameworks built on their conventions) read as the same
// field.
func setFence(out *http.Request, name string) {
	for k := range out.Header {
		if sameFieldName(k, name) {
			delete(out.Header, k)
		}
	}
	if fence, ok := idem.FenceFrom(out.Context()); ok {
		out.Header[name] = []string{strconv.FormatInt(fence, 10)}
	}
}

// stripTrailers removes from a request's trailer the fields that only the
// proxy may tell the upstream, as it does from the header: the fence (name
// fence, "" for none) and the idempotency key. A client that sends them as
// trailers (after a chunked body) would otherwise reach the upstream with
// them.
func stripTrailers(trailer http.Header, fence string) {
	for k := range trailer {
		if sameFieldName(k, "Idempotency-Key") || sameFieldName(k, "X-Idempotency-Key") ||
			fence != "" && sameFieldName(k, fence) {
			delete(trailer, k)
		}
	}
}

// sameFieldName reports whether header field name a equals b, ignoring
// case and taking _ for -.
func sameFieldName(a, b string) bool {
	if len(a) != len(b) {
		return false
	}
	for i := 0; i < len(a); i++ {
		x, y := a[i], b[i]
		if x == '_' {
			x = '-'
		}
		if y == '_' {
			y = '-'
		}
		if 'A' <= x && x <= 'Z' {
			x += 'a' - 'A'
		}
		if 'A' <= y && y <= 'Z' {
			y += 'a' - 'A'
		}
		if x != y {
			return false
		}
	}
	return true
}

func (g *gateway) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	g.obs.inFlight.Add(1)
	defer g.obs.inFlight.Add(-1)
	if g.maxActive > 0 {
		if g.active.Add(1) > g.maxActive {
			g.active.Add(-1)
			g.busy(w, r)
			return
		}
		defer g.active.Add(-1)
	}
	if g.bodyTimeout > 0 && r.Body != nil && r.Body != http.NoBody {
		// The deadline is the connection's: it would also end the read
		// that the server's own goroutine makes once the body is in, and
		// that read failing cancels the request's context. So it is lifted
		// as soon as the body ends (deadlineBody). A body that did not end
		// keeps it: after the handler, what is left of the body is read
		// before the answer goes (drainBody), and that must not wait for
		// ever.
		rc := http.NewResponseController(w)
		deadline := time.Now().Add(g.bodyTimeout)
		if rc.SetReadDeadline(deadline) == nil {
			db := &deadlineBody{ReadCloser: r.Body, rc: rc, deadline: deadline}
			r.Body = db
			defer db.drain()
		}
	}
	if g.writeTimeout > 0 {
		w = &deadlineWriter{ResponseWriter: w, d: g.writeTimeout}
	}
	if g.tracing != nil {
		sw, r2, span := g.tracing.startSpan(w, r)
		aborted := true
		defer func() { endSpan(span, sw, aborted) }()
		g.serve(sw, r2)
		aborted = false
		return
	}
	g.serve(w, r)
}

// covers reports whether the middleware covers method: the methods are
// upper case, and compared ignoring case, as the middleware does.
func (g *gateway) covers(method string) bool {
	return g.covered[method] || g.covered[strings.ToUpper(method)]
}

func (g *gateway) serve(w http.ResponseWriter, r *http.Request) {
	if !g.covers(r.Method) {
		g.obs.passed.Inc()
		if g.tracing != nil {
			setOutcome(r.Context(), "passthrough")
		}
		// Through the middleware, which passes the request on to forward
		// and marks the response if it carries a key.
		g.protected.ServeHTTP(w, r)
		return
	}
	x := &exchange{parent: r.Context()}
	x.trace.WroteHeaders = x.wroteHeaders
	r = r.WithContext(httptrace.WithClientTrace(x, &x.trace))
	g.protected.ServeHTTP(w, r)
	if x.broke {
		// The client got a truncated response: abort the connection so
		// that it does not take it for a whole one (as ReverseProxy does).
		panic(http.ErrAbortHandler)
	}
}

// busy answers a request over --max-concurrent.
func (g *gateway) busy(w http.ResponseWriter, r *http.Request) {
	g.obs.busy.Inc()
	w.Header().Set("Retry-After", "1")
	g.writeError(w, r, &idemhttp.Problem{
		Type:       idemhttp.TypeServerBusy,
		Title:      "Server busy",
		Status:     http.StatusServiceUnavailable,
		Detail:     "The proxy handles as many requests as it may at once. The request was not processed; retry with the same idempotency key after the time given by Retry-After.",
		RetryAfter: time.Second,
	})
}

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

// forward runs the reverse proxy for a request the middleware let through.
func (g *gateway) forward(w http.ResponseWriter, r *http.Request) {
	x := exchangeFrom(r.Context())
	if x == nil { // a request the middleware does not cover
		g.rp.ServeHTTP(passWriter{w}, r)
		return
	}
	x.w.ResponseWriter = w
	start := time.Now()
	defer func() {
		x.upstreamTime = time.Since(start)
		if v := recover(); v != nil {
			if v != http.ErrAbortHandler {
				panic(v)
			}
			// Reading the upstream's response failed after its header
			// was sent on: it acted, and what it answered is lost.
			x.broke = true
		}
	}()
	g.rp.ServeHTTP(&x.w, r)
}

// proxyPolicy returns the middleware's Policy (see the comment at the
// top): base (--store-policy) decides for the upstream's answers.
func proxyPolicy(base idemhttp.Policy) idemhttp.Policy {
	return func(r *http.Request, status int) idemhttp.Decision {
		if x := exchangeFrom(r.Context()); x != nil {
			switch {
			case x.broke:
				return idemhttp.AbandonKey
			case x.failed && x.failure == failUnreachable:
				return idemhttp.ReleaseKey
			case x.failed:
				return idemhttp.AbandonKey
			}
		}
		return base(r, status)
	}
}

// storePolicies are the values of --store-policy.
var storePolicies = []struct {
	name   string
	policy idemhttp.Policy
}{
	{"default", idemhttp.DefaultPolicy},
	{"release-5xx", idemhttp.ReleaseServerErrors},
	{"only-2xx", idemhttp.StoreSuccessOnly},
}

// upstreamError is the ReverseProxy's ErrorHandler: the upstream call
// failed without a response.
func (g *gateway) upstreamError(w http.ResponseWriter, r *http.Request, err error) {
	x := exchangeFrom(r.Context())
	kind := failBroken
	switch {
	case x != nil && !x.sent.Load():
		kind = failUnreachable
	case isTimeout(err):
		kind = failTimeout
	}
	if x != nil {
		x.failed, x.failure = true, kind
	}
	g.obs.upstreamErrors[kind].Inc()
	g.log.LogAttrs(context.WithoutCancel(r.Context()), slog.LevelWarn, "upstream call failed",
		slog.String("method", r.Method), slog.String("path", r.URL.Path),
		slog.String("failure", upstreamFailureNames[kind]), slog.Any("error", err))

	p := &idemhttp.Problem{Type: "about:blank", Status: http.StatusBadGateway, Title: http.StatusText(http.StatusBadGateway)}
	switch {
	case x == nil:
		if isTimeout(err) {
			p.Status, p.Title = http.StatusGatewayTimeout, http.StatusText(http.StatusGatewayTimeout)
		}
		p.Detail = "The upstream server did not answer."
	case kind == failUnreachable:
		p.Detail = "The upstream server could not be reached; the request was not sent to it. Retry with the same idempotency key."
	default:
		if kind == failTimeout {
			p.Status, p.Title = http.StatusGatewayTimeout, http.StatusText(http.StatusGatewayTimeout)
			p.Detail = "The upstream server did not answer in time."
		} else {
			p.Detail = "The connection to the upstream server failed after the request was sent."
		}
		p.Detail += " It may have processed the request, so the idempotency key stays in progress until its lease ends (see Retry-After); a retry with the same key after that runs the request again."
		w.Header().Set("Retry-After", strconv.FormatInt(int64((g.lease+time.Second-1)/time.Second), 10))
	}
	g.writeError(w, r, p)
}

func isTimeout(err error) bool {
	if errors.Is(err, context.DeadlineExceeded) {
		return true
	}
	var ne net.Error
	return errors.As(err, &ne) && ne.Timeout()
}
