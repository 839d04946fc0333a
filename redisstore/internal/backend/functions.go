package backend

import (
	"context"
	"strings"
)

// Library is a Redis Functions library (redisstore's buildLibrary makes
// them).
type Library struct {
	Name string // <kind>_<version>
	Code string // the FUNCTION LOAD source
}

// Holds reports whether code, the code of the library of lib's name that a
// server holds (found false: none), is lib's.
func (lib *Library) Holds(code string, found bool) bool { return found && code == lib.Code }

// FunctionNode is one server, for LoadOn.
type FunctionNode interface {
	// FunctionLoad sends FUNCTION LOAD [REPLACE] code.
	FunctionLoad(ctx context.Context, code string, replace bool) error
	// LibraryCode returns the code of the library name, and whether the
	// server has one (FUNCTION LIST LIBRARYNAME name WITHCODE).
	LibraryCode(ctx context.Context, name string) (code string, found bool, err error)
}

// LoadOn loads lib on n: FUNCTION LOAD; when a library of that name is
// already there, its code is checked, and the library replaced (FUNCTION
// LOAD REPLACE) if it holds other code. No other library is touched.
func LoadOn(ctx context.Context, n FunctionNode, lib *Library) error {
	err := n.FunctionLoad(ctx, lib.Code, false)
	if err == nil || !libraryExists(err) {
		return err
	}
	code, found, err := n.LibraryCode(ctx, lib.Name)
	if err != nil {
		return err
	}
	if lib.Holds(code, found) {
		return nil // loaded meanwhile, by another client
	}
	return n.FunctionLoad(ctx, lib.Code, true)
}

// libraryExists reports whether err is FUNCTION LOAD's reply for a library
// that is already loaded.
func libraryExists(err error) bool {
	msg, ok := ServerError(err)
	return ok && strings.HasPrefix(msg, "Library '") && strings.HasSuffix(msg, "' already exists")
}

// serverErrors are the client packages' ways to read an error reply
// (RegisterServerError).
var serverErrors []func(error) (string, bool)

// RegisterServerError adds a client library's way to tell an error reply
// of the server: f returns its message without the ERR code, and whether
// err is one. A client package calls it from its init.
func RegisterServerError(f func(error) (string, bool)) {
	serverErrors = append(serverErrors, f)
}

// ServerError returns the message of an error reply of the server (without
// the ERR code), and whether err is one, whichever client returned it.
func ServerError(err error) (string, bool) {
	if err == nil {
		return "", false
	}
	for _, f := range serverErrors {
		if msg, ok := f(err); ok {
			return msg, true
		}
	}
	return "", false
}

// ServerErrorHas reports whether err is an error reply of the server that
// starts with prefix (after the ERR code).
func ServerErrorHas(err error, prefix string) bool {
	msg, ok := ServerError(err)
	return ok && strings.HasPrefix(msg, prefix)
}
