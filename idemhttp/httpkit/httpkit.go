// Package httpkit is for programs built on idemhttp's middleware, as
// idemproxy is, and for tools that read the records it writes, as the idem
// binary's get command does. A handler author needs none of it: these are
// the middleware's options that only make sense where the handler is a
// reverse proxy or a test of the middleware's guarantees, and the decoder
// of its stored responses.
//
//	mw, err := idemhttp.New(exec,
//		httpkit.StreamOnFlush(false), // httputil.ReverseProxy flushes every response of unknown length
//		httpkit.EmptyPrincipal(true),
//	)
package httpkit

import (
	"net/http"

	"github.com/idemgo/idem/idemhttp"
	"github.com/idemgo/idem/idemhttp/internal/kit"
)

// StreamOnFlush sets whether a handler that flushes its response makes it
// a stream. The middleware holds a response back from the client until it
// is stored, so that a client is never told a success that was not
// recorded; a stream is sent as it is written instead, and stored after
// the handler returns (see the idemhttp package documentation). With true,
// the first flush sends what was held and streams the rest; with false,
// flushes of a held response do nothing, and only text/event-stream
// responses and bodies over the size limit stream. Use false for handlers
// that flush without streaming, such as net/http/httputil.ReverseProxy,
// which flushes every response of unknown length. The default is true.
func StreamOnFlush(on bool) idemhttp.Option { return kit.StreamOnFlush(on).(idemhttp.Option) }

// StreamAll makes every response a stream written through whole: sent to
// the client as the handler writes it, end included, and stored after the
// handler returns. A client then gets its response sooner, but if storing
// fails it has been told the handler's answer although nothing was
// recorded, and a retry after the lease runs the handler again (other
// streams withhold their end until they are recorded). Use it only where
// that is acceptable; the reliability suite uses it as the negative
// control of record before success. The default is false.
func StreamAll(on bool) idemhttp.Option { return kit.StreamAll(on).(idemhttp.Option) }

// EmptyPrincipal sets whether a request for which the principal function
// (idemhttp.WithPrincipal) returns "" is served. When true, all such
// requests share one anonymous scope, so one anonymous client can be
// replayed another's response with the same key: use it only where
// anonymous requests carry random keys and their responses are not
// private (the proxy's scope header made optional). The default is false:
// they are answered with 400 (idemhttp.TypePrincipalMissing).
func EmptyPrincipal(allowed bool) idemhttp.Option {
	return kit.EmptyPrincipal(allowed).(idemhttp.Option)
}

// Response is a response as the middleware stores it.
type Response struct {
	Status int
	// Header holds the stored fields (hop-by-hop fields and the deny-list
	// are never stored).
	Header http.Header
	// Trailer holds the stored trailers, nil if the response had none. A
	// name that starts with http.TrailerPrefix was sent without being
	// announced in the Trailer field.
	Trailer http.Header
	Body    []byte
}

// DecodeResponse decodes the value of a COMPLETED record written by the
// middleware, as adapterkit.DecodeResult returns it. It is for tools
// that inspect records; the middleware replays responses itself. Body
// shares memory with value. Errors wrap idem.ErrCorruptResult.
func DecodeResponse(value []byte) (Response, error) {
	status, header, trailer, body, err := kit.Decode(value)
	if err != nil {
		return Response{}, err
	}
	return Response{Status: status, Header: header, Trailer: trailer, Body: body}, nil
}
