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
// library is loaded with FUNCTION LOAD (never REPLACE, never FUNCTION
// FLUSH) the first time a call finds it missing ("Function not found"): at
// first use, on every primary of a Cluster, and again on a node that lost
// it (FUNCTION FLUSH, a new node, a failover to a replica that never had
// it). Registered effects (WithEffect) are a second library,
// idemfx_<version>, loaded the same way.
//
// Behaviour is the same as in script mode (the conformance suite runs on
// both). Choose Functions mode when scripts may not be sent (an ACL that
// denies EVAL), when the server's script cache is flushed or bounded, or
// to see idem's code in FUNCTION LIST; script mode needs no FUNCTION LOAD
// right and nothing to manage on the server. ACL rights: script mode needs
// EVALSHA and EVAL; Functions mode needs FCALL, FCALL_RO and FUNCTION LOAD
// (and FUNCTION LIST for idem doctor). In both modes the commands that the
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

// load loads lib where it is missing: with FUNCTION LOAD, on every primary
// (a standalone server is its only primary). A library already loaded is
// left as it is.
func (s *Store) load(ctx context.Context, lib *library) error {
	if err := s.b.load(ctx, lib.code); err != nil {
		return fmt.Errorf("redisstore: FUNCTION LOAD %s: %w", lib.name, err)
	}
	return nil
}

// loadErr is the error of one FUNCTION LOAD: nil when the library is
// already there.
func loadErr(err error) error {
	if err == nil || libraryExists(err) {
		return nil
	}
	return err
}

func (b *goRedis) load(ctx context.Context, code string) error {
	return loadErr(b.c.FunctionLoad(ctx, code).Err())
}

func (b *goRedisCluster) load(ctx context.Context, code string) error {
	return b.c.ForEachMaster(ctx, func(ctx context.Context, c *redis.Client) error {
		return loadErr(c.FunctionLoad(ctx, code).Err())
	})
}

func (b *rueidisBackend) load(ctx context.Context, code string) error {
	if b.c.Mode() != rueidis.ClientModeCluster {
		return loadErr(b.c.Do(ctx, b.c.B().FunctionLoad().FunctionCode(code).Build()).Error())
	}
	// Nodes lists replicas too: they refuse the write and get the library
	// from their primary.
	var errs []error
	loaded := false
	for _, n := range b.c.Nodes() {
		err := loadErr(n.Do(ctx, n.B().FunctionLoad().FunctionCode(code).Build()).Error())
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
