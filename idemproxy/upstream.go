package idemproxy

import (
	"context"
	"errors"
	"log/slog"
	"net"
	"net/http"
	"net/http/httputil"
	"strconv"
	"time"

	"github.com/idemgo/idem"
	"github.com/idemgo/idem/idemhttp"
)

// How the proxy handles a covered request (one whose method the middleware
// covers):
//
//	Proxy.ServeHTTP           creates the request's exchange
//	  idemhttp middleware     key, fingerprint, acquire; store or release after
//	    gateway.forward       httputil.ReverseProxy to the upstream
//
// The exchange is the request's context (without the client's
// cancellation: see exchange) and carries what the upstream call found out
// to the middleware's Policy, which decides what happens to the key:
//
//   - The upstream answered: Proxy.Policy decides, by default
//     idemhttp.DefaultPolicy (every status is stored except 408, 409, 425,
//     429 and 503, which release the key), also when the upstream itself
//     answered 502 or 504.
//   - The request never reached the upstream (no connection, DNS failure,
//     TLS handshake failure: nothing was written to it): 502, key released,
//     a retry runs at once.
//   - The request was sent and no response came (timeout: 504; broken
//     connection: 502), or the response broke off half way: the upstream may
//     have acted, so the key is abandoned to its lease (idemhttp.AbandonKey)
//     and retries get 409 until the lease ends.

// rewrite is the ReverseProxy's Rewrite: the outgoing request goes to the
// target, with the fields only the proxy may tell the upstream set by the
// proxy alone.
func (g *gateway) rewrite(pr *httputil.ProxyRequest) {
	pr.SetURL(g.target)
	pr.SetXForwarded()
	if g.userRewrite != nil {
		g.userRewrite(pr)
	}
	if pr.Out.Body == nil && g.covers(pr.Out.Method) {
		hideIdempotencyKey(pr.Out.Header)
	}
	// The client gets its 100 Continue from this server, when the body is
	// first read (by the middleware, or by the transport as it sends it
	// on). Forwarding Expect would relay the upstream's 100 as a second
	// one: the transport starts sending the body before ReverseProxy
	// relays the upstream's 100, so the two race even for a request passed
	// through.
	pr.Out.Header.Del("Expect")
	if exchangeFrom(pr.Out.Context()) != nil {
		// The response is stored for retries that may not accept the
		// encoding this client accepts: without the client's
		// Accept-Encoding the transport asks for gzip itself and decodes
		// it, so the identity form is stored, which every retry accepts.
		pr.Out.Header.Del("Accept-Encoding")
	}
	stripTrailers(pr.Out.Trailer, g.fenceHeader)
	if g.fenceHeader != "" {
		setFence(pr.Out, g.fenceHeader)
	}
}

// modifyResponse is the ReverseProxy's ModifyResponse: it tells the
// client's writer whether the response announces trailers.
func modifyResponse(res *http.Response) error {
	if x := exchangeFrom(res.Request.Context()); x != nil {
		x.w.trailers = len(res.Trailer) > 0
	}
	return nil
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
		if fold(a[i]) != fold(b[i]) {
			return false
		}
	}
	return true
}

// fold maps c to lower case, and _ to -.
func fold(c byte) byte {
	switch {
	case c == '_':
		return '-'
	case 'A' <= c && c <= 'Z':
		return c + 'a' - 'A'
	}
	return c
}

// policy returns the middleware's Policy (see the comment at the top):
// base decides for the upstream's answers.
func policy(base idemhttp.Policy) idemhttp.Policy {
	return func(r *http.Request, status int) idemhttp.Decision {
		if x := exchangeFrom(r.Context()); x != nil {
			switch {
			case x.broke:
				return idemhttp.AbandonKey
			case x.failure == UpstreamUnreachable:
				return idemhttp.ReleaseKey
			case x.failure != UpstreamOK:
				return idemhttp.AbandonKey
			}
		}
		return base(r, status)
	}
}

// upstreamError is the ReverseProxy's ErrorHandler: the upstream call
// failed without a response.
func (g *gateway) upstreamError(w http.ResponseWriter, r *http.Request, err error) {
	x := exchangeFrom(r.Context())
	kind := UpstreamBroken
	switch {
	case x != nil && !x.sent.Load():
		kind = UpstreamUnreachable
	case isTimeout(err):
		kind = UpstreamTimeout
	}
	if x != nil {
		x.failure = kind
	} else if pw, ok := w.(*passWriter); ok {
		pw.failure = kind
	}
	g.log.LogAttrs(context.WithoutCancel(r.Context()), slog.LevelWarn, "upstream call failed",
		slog.String("method", r.Method), slog.String("path", r.URL.Path),
		slog.String("failure", kind.String()), slog.Any("error", err))
	g.mw.WriteError(w, r, g.upstreamProblem(w, x != nil, kind))
}

// upstreamProblem returns the answer to a request whose upstream call
// failed (covered says whether it is covered), and sets its Retry-After.
func (g *gateway) upstreamProblem(w http.ResponseWriter, covered bool, kind UpstreamFailure) *idemhttp.Problem {
	p := &idemhttp.Problem{Type: "about:blank", Status: http.StatusBadGateway, Title: http.StatusText(http.StatusBadGateway)}
	if kind == UpstreamTimeout {
		p.Status, p.Title = http.StatusGatewayTimeout, http.StatusText(http.StatusGatewayTimeout)
	}
	switch {
	case !covered:
		p.Detail = "The upstream server did not answer."
		return p
	case kind == UpstreamUnreachable:
		p.Detail = "The upstream server could not be reached; the request was not sent to it. Retry with the same idempotency key."
		return p
	case kind == UpstreamTimeout:
		p.Detail = "The upstream server did not answer in time."
	default:
		p.Detail = "The connection to the upstream server failed after the request was sent."
	}
	p.Detail += " It may have processed the request, so the idempotency key stays in progress until its lease ends (see Retry-After); a retry with the same key after that runs the request again."
	w.Header().Set("Retry-After", strconv.FormatInt(int64((g.lease+time.Second-1)/time.Second), 10))
	return p
}

func isTimeout(err error) bool {
	if errors.Is(err, context.DeadlineExceeded) {
		return true
	}
	var ne net.Error
	return errors.As(err, &ne) && ne.Timeout()
}
