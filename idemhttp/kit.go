package idemhttp

import (
	"net/http"

	"github.com/idemgo/idem/idemhttp/internal/kit"
)

// The options and the decoder of idemhttp/httpkit, for programs built on
// the middleware (idemproxy) and tools that read its records.
func init() {
	kit.StreamOnFlush = func(on bool) any { return Option(func(m *Middleware) { m.streamOnFlush = on }) }
	kit.StreamAll = func(on bool) any { return Option(func(m *Middleware) { m.streamAll = on }) }
	kit.EmptyPrincipal = func(allowed bool) any { return Option(func(m *Middleware) { m.emptyPrincipal = allowed }) }
	kit.Decode = func(value []byte) (int, http.Header, http.Header, []byte, error) {
		res, err := decodeResponse(value, nil)
		return res.status, res.header, res.trailer, res.body, err
	}
}
