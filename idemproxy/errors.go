package idemproxy

import (
	"errors"

	"github.com/idemgo/idem"
)

// ErrDraining is returned by Ready once Drain was called: the proxy is
// shutting down and should get no new requests.
var ErrDraining = errors.New("idemproxy: shutting down")

// FieldError is returned by Init (and reported by ServeHTTP) when a field
// of the Proxy holds a value it cannot use. It wraps idem.ErrInvalid.
type FieldError struct {
	// Field is the name of the field, as in the Proxy type: "ScopeHeader".
	Field string
	// Reason says what is wrong with its value: `invalid header name "a b"`.
	Reason string
}

func (e *FieldError) Error() string { return "idemproxy: " + e.Field + ": " + e.Reason }

// Unwrap returns idem.ErrInvalid.
func (e *FieldError) Unwrap() error { return idem.ErrInvalid }
