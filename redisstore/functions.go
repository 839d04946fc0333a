package redisstore

import (
	"cmp"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"

	"github.com/redis/go-redis/v9"
	"github.com/redis/rueidis"
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

// library is a Redis Functions library made from scripts.
type library struct {
	name string // <kind>_<version>
	code string // the FUNCTION LOAD source
}

// buildLibrary makes the library kind_<version> from scripts: each one's
// source becomes the body of the function <kind>_<version>_<script name>,
// called with the same KEYS and ARGV. The version is the first 12 hex
// digits of SHA-256 over the scripts' names, flags and sources, so it
// changes whenever the code does. It sets each script's fn and lib.
func buildLibrary(kind string, scripts []*script) *library {
	scripts = slices.SortedFunc(slices.Values(scripts), func(a, b *script) int { return cmp.Compare(a.name, b.name) })
	h := sha256.New()
	for _, s := range scripts {
		fmt.Fprintf(h, "%s\x00%t\x00%d\x00%s", s.name, s.ro, len(s.src), s.src)
	}
	lib := &library{name: kind + "_" + hex.EncodeToString(h.Sum(nil))[:12]}
	var b strings.Builder
	b.WriteString("#!lua name=" + lib.name + "\n")
	for _, s := range scripts {
		s.fn, s.lib = lib.name+"_"+s.name, lib
		// The body keeps its locals: each call runs it afresh, as EVAL
		// does.
		fmt.Fprintf(&b, "redis.register_function{function_name='%s', callback=function(KEYS, ARGV)\n%s\nend", s.fn, s.src)
		if s.ro {
			b.WriteString(", flags={'no-writes'}")
		}
		b.WriteString("}\n")
	}
	lib.code = b.String()
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
func LibraryName() string { return coreLibrary().name }

// functionNotFound reports whether err is Redis's reply to an FCALL of a
// function that no library on that node defines.
func functionNotFound(err error) bool { return serverErrorHas(err, "Function not found") }

// libraryExists reports whether err is FUNCTION LOAD's reply for a library
// that is already loaded.
func libraryExists(err error) bool {
	msg, ok := serverError(err)
	return ok && strings.HasPrefix(msg, "Library '") && strings.HasSuffix(msg, "' already exists")
}

// serverError returns the message of an error reply of the server (without
// the ERR code), and whether err is one.
func serverError(err error) (string, bool) {
	var ge redis.Error
	if errors.As(err, &ge) {
		return strings.TrimPrefix(ge.Error(), "ERR "), true
	}
	var re *rueidis.RedisError
	if errors.As(err, &re) && !re.IsNil() {
		return strings.TrimPrefix(re.Error(), "ERR "), true
	}
	return "", false
}

// serverErrorHas reports whether err is an error reply of the server that
// starts with prefix (after the ERR code).
func serverErrorHas(err error, prefix string) bool {
	msg, ok := serverError(err)
	return ok && strings.HasPrefix(msg, prefix)
}

// load loads lib where it is missing, or held with other code: on every
// primary (a standalone server is its only primary), with loadOn.
func (s *Store) load(ctx context.Context, lib *library) error {
	if err := s.b.load(ctx, lib); err != nil {
		return fmt.Errorf("redisstore: FUNCTION LOAD %s: %w", lib.name, err)
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

// state is the one check of a loaded library: whether code, the code of
// the library of lib's name that a server holds (found false: none), is
// lib's.
func (lib *library) state(code string, found bool) LibraryStatus {
	switch {
	case !found:
		return LibraryMissing
	case code == lib.code:
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
	code, found, err := goRedisFunctions{c}.libraryCode(ctx, lib.name)
	if err != nil {
		return LibraryMissing, err
	}
	return lib.state(code, found), nil
}

// functionNode is one server, for loadOn.
type functionNode interface {
	// functionLoad sends FUNCTION LOAD [REPLACE] code.
	functionLoad(ctx context.Context, code string, replace bool) error
	// libraryCode returns the code of the library name, and whether the
	// server has one (FUNCTION LIST LIBRARYNAME name WITHCODE).
	libraryCode(ctx context.Context, name string) (code string, found bool, err error)
}

// loadOn loads lib on n: FUNCTION LOAD; when a library of that name is
// already there, its code is checked, and the library replaced (FUNCTION
// LOAD REPLACE) if it holds other code. No other library is touched.
func loadOn(ctx context.Context, n functionNode, lib *library) error {
	err := n.functionLoad(ctx, lib.code, false)
	if err == nil || !libraryExists(err) {
		return err
	}
	code, found, err := n.libraryCode(ctx, lib.name)
	if err != nil {
		return err
	}
	if lib.state(code, found) == LibraryLoaded {
		return nil // loaded meanwhile, by another client
	}
	return n.functionLoad(ctx, lib.code, true)
}

// goRedisFunctions is a functionNode on a go-redis client of one server.
type goRedisFunctions struct{ c *redis.Client }

func (n goRedisFunctions) functionLoad(ctx context.Context, code string, replace bool) error {
	if replace {
		return n.c.FunctionLoadReplace(ctx, code).Err()
	}
	return n.c.FunctionLoad(ctx, code).Err()
}

func (n goRedisFunctions) libraryCode(ctx context.Context, name string) (string, bool, error) {
	libs, err := n.c.FunctionList(ctx, redis.FunctionListQuery{LibraryNamePattern: name, WithCode: true}).Result()
	if err != nil {
		return "", false, err
	}
	for _, l := range libs {
		if l.Name == name {
			return l.Code, true, nil
		}
	}
	return "", false, nil
}

// rueidisFunctions is a functionNode on a rueidis client of one server.
type rueidisFunctions struct{ c rueidis.Client }

func (n rueidisFunctions) functionLoad(ctx context.Context, code string, replace bool) error {
	if replace {
		return n.c.Do(ctx, n.c.B().FunctionLoad().Replace().FunctionCode(code).Build()).Error()
	}
	return n.c.Do(ctx, n.c.B().FunctionLoad().FunctionCode(code).Build()).Error()
}

func (n rueidisFunctions) libraryCode(ctx context.Context, name string) (string, bool, error) {
	arr, err := n.c.Do(ctx, n.c.B().FunctionList().Libraryname(name).Withcode().Build()).ToArray()
	if err != nil {
		return "", false, err
	}
	for _, l := range arr {
		m, err := l.AsMap()
		if err != nil {
			return "", false, err
		}
		if v := m["library_name"]; !v.IsString() {
			continue
		} else if got, _ := v.ToString(); got != name {
			continue
		}
		c := m["library_code"]
		code, err := c.ToString()
		return code, err == nil, err
	}
	return "", false, nil
}

func (b *goRedis) load(ctx context.Context, lib *library) error {
	return loadOn(ctx, goRedisFunctions{b.c}, lib)
}

func (b *goRedisCluster) load(ctx context.Context, lib *library) error {
	return b.c.ForEachMaster(ctx, func(ctx context.Context, c *redis.Client) error {
		return loadOn(ctx, goRedisFunctions{c}, lib)
	})
}

func (b *rueidisBackend) load(ctx context.Context, lib *library) error {
	if b.c.Mode() != rueidis.ClientModeCluster {
		return loadOn(ctx, rueidisFunctions{b.c}, lib)
	}
	// Nodes lists replicas too: they refuse the write and get the library
	// from their primary.
	var errs []error
	loaded := false
	for _, n := range b.c.Nodes() {
		err := loadOn(ctx, rueidisFunctions{n}, lib)
		switch {
		case err == nil:
			loaded = true
		case !serverErrorHas(err, "READONLY"):
			errs = append(errs, err)
		}
	}
	if !loaded && len(errs) == 0 {
		return errors.New("no primary answered")
	}
	return errors.Join(errs...)
}

// LoadedLibraries returns the names of the Functions libraries of idem
// (idem_<version> and idemfx_<version>) loaded on the server, on every
// primary of a Cluster (each name once), for admin tools such as idem
// doctor. It is safe for concurrent use.
func (s *Store) LoadedLibraries(ctx context.Context) ([]string, error) {
	names, err := s.b.libraries(ctx)
	if err != nil {
		return nil, fmt.Errorf("redisstore: FUNCTION LIST: %w", err)
	}
	slices.Sort(names)
	return slices.Compact(names), nil
}

func goRedisLibraries(ctx context.Context, c *redis.Client) ([]string, error) {
	libs, err := c.FunctionList(ctx, redis.FunctionListQuery{LibraryNamePattern: "idem*"}).Result()
	if err != nil {
		return nil, err
	}
	var out []string
	for _, l := range libs {
		out = append(out, l.Name)
	}
	return out, nil
}

func (b *goRedis) libraries(ctx context.Context) ([]string, error) {
	return goRedisLibraries(ctx, b.c)
}

func (b *goRedisCluster) libraries(ctx context.Context) ([]string, error) {
	var mu sync.Mutex
	var out []string
	err := b.c.ForEachMaster(ctx, func(ctx context.Context, c *redis.Client) error {
		names, err := goRedisLibraries(ctx, c)
		mu.Lock()
		out = append(out, names...)
		mu.Unlock()
		return err
	})
	return out, err
}

func (b *rueidisBackend) libraries(ctx context.Context) ([]string, error) {
	var out []string
	for _, n := range b.c.Nodes() {
		arr, err := n.Do(ctx, n.B().FunctionList().Libraryname("idem*").Build()).ToArray()
		if err != nil {
			return nil, err
		}
		for _, l := range arr {
			m, err := l.AsMap()
			if err != nil {
				return nil, err
			}
			v := m["library_name"]
			name, err := v.ToString()
			if err != nil {
				return nil, err
			}
			out = append(out, name)
		}
	}
	return out, nil
}
