// Package kit hands idemhttp/httpkit what idemhttp keeps unexported: the
// options that only programs built on the middleware set, and the decoder
// of stored responses. idemhttp sets the variables in its init; httpkit
// imports idemhttp, so they are set before it reads them.
package kit

import "net/http"

var (
	// StreamOnFlush, StreamAll and EmptyPrincipal return an idemhttp.Option
	// (as any: this package cannot import idemhttp).
	StreamOnFlush, StreamAll, EmptyPrincipal func(bool) any
	// Decode decodes the value of a COMPLETED record written by the
	// middleware.
	Decode func(value []byte) (status int, header, trailer http.Header, body []byte, err error)
)
