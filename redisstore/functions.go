package redisstore

import (
	"cmp"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"slices"
	"strings"
	"sync"

	"github.com/idemgo/idem/redisstore/internal/backend"
	"github.com/idemgo/idem/redisstore/internal/goredis"
	"github.com/redis/go-redis/v9"
)

// WithFunctions makes the store run its transitions as Redis Functions
// instead of cached scripts: the package's Lua scripts (the same files
// script mode runs) are the functions of one library, named
// idem_<version>, called with FCALL, and FCALL_RO for reads. The version is
// a digest of the library's code, so that two versions of idem can run
// side by side during a rolling deploy, each with its own library. The
// library is loaded with FUNCTION LOAD (never FUNCTION FLUSH) the first
// time a call finds it missing ("Function not found"): at first use, on
// every primary of a Cluster, and again on a node that lost it (FUNCTION
// FLUSH, a new node, a failover to a replica that never had it). A node
// whose library of that name lacks the function called holds other code
// under idem's name (CheckLibrary tells): the store then replaces that
// library with its own (FUNCTION LOAD REPLACE), since every idem of this
// version expects this code under this name; it never replaces nor
// deletes a library of another name. Registered effects (WithEffect) are
// a second library, idemfx_<version>, loaded the same way.
//
// Behaviour is the same as in script mode (the conformance suite runs on
// both). Choose Functions mode when scripts may not be sent (an ACL that
// denies EVAL), when the server's script cache is flushed or bounded, or
// to see idem's code in FUNCTION LIST; script mode needs no FUNCTION LOAD
// right and nothing to manage on the server. ACL rights: script mode needs
// EVALSHA and EVAL; Functions mode needs FCALL, FCALL_RO, FUNCTION LOAD and
// FUNCTION LIST (to check a library of idem's name that lacks a function,
// and for idem doctor). In both modes the commands that the
// Lua code calls are checked against the user too: GET, SET, TIME, PTTL,
// PUBLISH or SPUBLISH, and XACK, XPENDING and XADD for the Redis Streams
// consumer, plus whatever registered effects call. The default is script
// mode.
func WithFunctions() Option { return func(c *config) { c.functions = true } }

// library is a Redis Functions library made from scripts (Name is
// <kind>_<version>, Code the FUNCTION LOAD source).
type library = backend.Library

// buildLibrary makes the library kind_<version> from scripts: each one's
// source becomes the body of the function <kind>_<version>_<script name>,
// called with the same KEYS and ARGV. The version is the first 12 hex
// digits of SHA-256 over the scripts' names, flags and sources, so it
// changes whenever the code does. It sets each script's Fn and lib.
func buildLibrary(kind string, scripts []*script) *library {
	scripts = slices.SortedFunc(slices.Values(scripts), func(a, b *script) int { return cmp.Compare(a.Name, b.Name) })
	h := sha256.New()
	for _, s := range scripts {
		fmt.Fprintf(h, "%s\x00%t\x00%d\x00%s", s.Name, s.RO, len(s.Src), s.Src)
	}
	lib := &library{Name: kind + "_" + hex.EncodeToString(h.Sum(nil))[:12]}
	var b strings.Builder
	b.WriteString("#!lua name=" + lib.Name + "\n")
	for _, s := range scripts {
		s.Fn, s.lib = lib.Name+"_"+s.Name, lib
		// The body keeps its locals: each call runs it afresh, as EVAL
		// does.
		fmt.Fprintf(&b, "redis.register_function{function_name='%s', callback=function(KEYS, ARGV)\n%s\nend", s.Fn, s.Src)
		if s.RO {
			b.WriteString(", flags={'no-writes'}")
		}
		b.WriteString("}\n")
	}
	lib.Code = b.String()
	return lib
}

var (
	coreOnce sync.Once
	coreLib  *library
)

// coreLibrary returns the library of every script of the package (the
// registry), built at its first use.
func coreLibrary() *library {
	coreOnce.Do(func() { coreLib = buildLibrary("idem", registry) })
	return coreLib
}

// LibraryName returns the name of the Functions library that this version
// of the package loads in Functions mode (WithFunctions): idem_ followed by
// the library's version.
func LibraryName() string { return coreLibrary().Name }

// functionNotFound reports whether err is Redis's reply to an FCALL of a
// function that no library on that node defines.
func functionNotFound(err error) bool { return backend.ServerErrorHas(err, "Function not found") }

// load loads lib where it is missing, or held with other code: on every
// primary (a standalone server is its only primary), with backend.LoadOn.
func (s *Store) load(ctx context.Context, lib *library) error {
	if err := s.b.Load(ctx, lib); err != nil {
		return fmt.Errorf("redisstore: FUNCTION LOAD %s: %w", lib.Name, err)
	}
	return nil
}

// LibraryStatus is the state of a Functions library of idem on a server,
// as CheckLibrary finds it.
type LibraryStatus uint8

const (
	// LibraryMissing: no library of that name is loaded; the store loads
	// it at first use in Functions mode.
	LibraryMissing LibraryStatus = iota
	// LibraryLoaded: the library is loaded with this version's code.
	LibraryLoaded
	// LibraryForeign: a library of that name is loaded with other code
	// (other functions, or other bodies), so FCALLs of this version fail
	// ("Function not found") or run other code; the store replaces it at
	// its first call that finds a function missing.
	LibraryForeign
)

// libraryState is the one check of a loaded library: whether code, the
// code of the library of lib's name that a server holds (found false:
// none), is lib's.
func libraryState(lib *library, code string, found bool) LibraryStatus {
	switch {
	case !found:
		return LibraryMissing
	case lib.Holds(code, found):
		return LibraryLoaded
	}
	return LibraryForeign
}

// CheckLibrary reports the state of the library that this version of the
// package loads in Functions mode (LibraryName) on the server c: missing,
// loaded with this version's code, or a library of that name with other
// code, which the store replaces when a call finds a function missing (see
// WithFunctions). It sends FUNCTION LIST LIBRARYNAME <name> WITHCODE to c,
// one server: on a Cluster, call it for each primary. idem doctor uses it.
func CheckLibrary(ctx context.Context, c *redis.Client) (LibraryStatus, error) {
	lib := coreLibrary()
	code, found, err := goredis.Functions{C: c}.LibraryCode(ctx, lib.Name)
	if err != nil {
		return LibraryMissing, err
	}
	return libraryState(lib, code, found), nil
}

// LoadedLibraries returns the names of the Functions libraries of idem
// (idem_<version> and idemfx_<version>) loaded on the server, on every
// primary of a Cluster (each name once), for admin tools such as idem
// doctor. It is safe for concurrent use.
func (s *Store) LoadedLibraries(ctx context.Context) ([]string, error) {
	names, err := s.b.Libraries(ctx)
	if err != nil {
		return nil, fmt.Errorf("redisstore: FUNCTION LIST: %w", err)
	}
	slices.Sort(names)
	return slices.Compact(names), nil
}
