package main

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"github.com/idemgo/idem"
	"github.com/idemgo/idem/cmd/idem/internal/cli"
	"github.com/idemgo/idem/cmd/idem/internal/recordview"
	"github.com/idemgo/idem/cmd/idem/internal/size"
	"github.com/idemgo/idem/idemhttp"
	"github.com/idemgo/idem/storekit"
)

// adminFlags are the flags of get, ls and rm: the store, and what the proxy
// used to compute a key's digest.
type adminFlags struct {
	store       storeFlags
	method      string
	path        string
	principal   string
	scopeHeader string
	digest      string
	maxResponse int64
	fs          *cli.Set
}

const adminScopeDoc = `

KEY is the Idempotency-Key value a client sent. The record's address also
depends on the request's method (--method) and path (--path), and, when the
proxy runs with --scope-header, on that header's value (--principal): give
the same values as the request. Or address a record by its digest, as logged
by the proxy and printed by ls, with --digest.

The store flags are the proxy's. The embedded store can only be opened while
no proxy uses it; Redis can be inspected while proxies run.`

func (a *adminFlags) register(fs *cli.Set, scope bool) {
	a.fs = fs
	fs.Define(a.store.flags()...)
	a.maxResponse = readLimit
	if scope {
		fs.String(&a.method, "method", "METHOD", "POST", "method of the request")
		fs.String(&a.path, "path", "PATH", "/", "URL path of the request, e.g. /payments (without the query)")
		fs.String(&a.principal, "principal", "VALUE", "", "value of the proxy's --scope-header in the request")
		fs.String(&a.scopeHeader, "scope-header", "NAME", "", "the proxy's --scope-header; when set, keys are scoped by --principal (even empty)")
		fs.String(&a.digest, "digest", "DIGEST", "", "address the record by its digest instead of KEY and the scope flags")
	}
	fs.Define(cli.Def{Name: "max-response", Placeholder: "SIZE", Value: cli.Size(&a.maxResponse), Usage: "largest stored response to decode; the default reads any the proxy stores, whatever its --max-response"})
}

// storeKey returns the store key (digest) that args and the flags address.
func (a *adminFlags) storeKey(cmd string, args []string) (string, error) {
	if a.digest != "" {
		if len(args) > 0 {
			return "", cli.Usagef("%s: give KEY or --digest, not both", cmd)
		}
		if err := storekit.ValidateStoreKey(a.digest); err != nil {
			return "", cli.Usagef("%s: invalid --digest: %v", cmd, err)
		}
		return a.digest, nil
	}
	switch len(args) {
	case 0:
		return "", cli.Usagef("%s: missing KEY (the Idempotency-Key value), or give --digest", cmd)
	case 1:
	default:
		return "", cli.Usagef("%s: one KEY at a time; got %d arguments", cmd, len(args))
	}
	id, err := idemhttp.ParseKey(args[0])
	if err != nil {
		return "", cli.Usagef("%s: %v", cmd, err)
	}
	method := strings.ToUpper(a.method)
	if !strings.HasPrefix(a.path, "/") {
		return "", cli.Usagef("%s: --path %q must start with /", cmd, a.path)
	}
	if a.scopeHeader != "" || a.fs.IsSet("principal") {
		return idemhttp.PrincipalPathKey(method, a.path, a.principal, id).Digest(), nil
	}
	return idemhttp.PathKey(method, a.path, id).Digest(), nil
}

// notFound is the error of get and rm when the store has no record at
// key: it says where it looked, and how to look elsewhere, since a key
// given without the request's method and path is looked for in POST /.
func (a *adminFlags) notFound(key string, st *openedStore, what string) error {
	if a.digest != "" {
		return fmt.Errorf("no record for digest %s in the %s%s", key, st.Describe, what)
	}
	scope := strings.ToUpper(a.method) + " " + a.path
	if a.scopeHeader != "" || a.fs.IsSet("principal") {
		scope += " with that --principal"
	}
	return fmt.Errorf("no record for this key in scope %s (digest %s) in the %s%s; a key's record belongs to the request's method and path: "+
		"pass them with --method and --path (e.g. --method POST --path /orders), and --principal if the proxy runs with --scope-header, "+
		"or give a digest from 'idem ls' with --digest", scope, key, st.Describe, what)
}

func (a *adminFlags) open(ctx context.Context) (*openedStore, *idem.Executor, error) {
	if err := a.store.validate(); err != nil {
		return nil, nil, err
	}
	if a.maxResponse > readLimit {
		return nil, nil, cli.Usagef("--max-response %s is over the limit of %s", size.Format(a.maxResponse), size.Format(readLimit))
	}
	a.store.allowEviction = true // reading and deleting records evicts nothing
	st, err := a.store.open(ctx, false)
	if err != nil {
		return nil, nil, err
	}
	// The executor only decodes results; it never runs anything.
	exec, err := idem.New(st.Store, idem.WithMaxResultSize(int(a.maxResponse)))
	if err != nil {
		st.Close()
		return nil, nil, err
	}
	return st, exec, nil
}

func getCommand() *command {
	return &command{
		name:    "get",
		args:    "KEY [flags]",
		summary: "show the record of an idempotency key",
		doc: `
Shows the record of KEY: its state, fence, attempts, the lease left on an
in-progress record, when it expires, and the stored response's status and
size. The body is shown only with --show-body.` + adminScopeDoc,
		flags: func(fs *cli.Set) func(context.Context, *env, []string) error {
			var a adminFlags
			var showBody bool
			a.register(fs, true)
			fs.Bool(&showBody, "show-body", false, "also print the stored response's header fields and body")
			return func(ctx context.Context, e *env, args []string) error {
				key, err := a.storeKey("get", args)
				if err != nil {
					return err
				}
				st, exec, err := a.open(ctx)
				if err != nil {
					return err
				}
				defer st.Close()
				rec, err := st.Store.Get(ctx, key)
				if errors.Is(err, storekit.ErrNotFound) {
					return a.notFound(key, st, "")
				}
				if err != nil {
					return fmt.Errorf("reading %s: %v", key, err)
				}
				redisKey := ""
				if st.RedisKey != nil {
					redisKey = st.RedisKey(key)
				}
				return recordview.Print(e.stdout, exec, key, redisKey, rec, showBody)
			}
		},
	}
}

func lsCommand() *command {
	return &command{
		name:    "ls",
		args:    "[flags]",
		summary: "list records",
		doc: `
Lists up to --limit records: digest, state, fence, attempts, age, time to
expiry, and the stored status and size. On Redis it walks the keys with SCAN
(never KEYS), on every primary of a Cluster, in no particular order; the
embedded store lists in digest order. Use a digest with get --digest or
rm --digest.

The store flags are the proxy's. The embedded store can only be opened while
no proxy uses it; Redis can be listed while proxies run.`,
		flags: func(fs *cli.Set) func(context.Context, *env, []string) error {
			var a adminFlags
			limit := 100
			a.register(fs, false)
			fs.Int(&limit, "limit", "N", 100, "list at most N records")
			return func(ctx context.Context, e *env, args []string) error {
				if len(args) > 0 {
					return cli.Usagef("ls: unexpected argument %q", args[0])
				}
				if limit <= 0 {
					return cli.Usagef("ls: --limit must be positive")
				}
				st, exec, err := a.open(ctx)
				if err != nil {
					return err
				}
				defer st.Close()
				entries, err := st.List(ctx, limit)
				if err != nil {
					return fmt.Errorf("listing the %s: %v", st.Describe, err)
				}
				if err := recordview.List(e.stdout, exec, entries); err != nil {
					return err
				}
				if len(entries) == limit {
					fmt.Fprintf(e.stderr, "(showing the first %d records; raise --limit for more)\n", limit)
				}
				return nil
			}
		},
	}
}

func rmCommand() *command {
	return &command{
		name:    "rm",
		args:    "KEY [flags]",
		summary: "delete the record of an idempotency key",
		doc: `
Deletes the record of KEY whatever its state, so that the next request with
the key runs again. A request still running with the key can no longer store
its response. Use it to repair a key stuck in progress or FAILED. When there
is no such record, rm says where it looked and exits with status 1.` + adminScopeDoc,
		flags: func(fs *cli.Set) func(context.Context, *env, []string) error {
			var a adminFlags
			a.register(fs, true)
			return func(ctx context.Context, e *env, args []string) error {
				key, err := a.storeKey("rm", args)
				if err != nil {
					return err
				}
				st, _, err := a.open(ctx)
				if err != nil {
					return err
				}
				defer st.Close()
				rec, err := st.Store.Get(ctx, key)
				if errors.Is(err, storekit.ErrNotFound) {
					return a.notFound(key, st, "; nothing deleted")
				}
				if err != nil {
					return fmt.Errorf("reading %s: %v", key, err)
				}
				if err := st.Store.Delete(ctx, key); err != nil {
					return fmt.Errorf("deleting %s: %v", key, err)
				}
				fmt.Fprintf(e.stdout, "deleted %s (was %s, fence %d)\n", key, rec.State, rec.Fence)
				return nil
			}
		},
	}
}
