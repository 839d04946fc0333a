// Package storeopen opens the stores idem's commands run on: Redis (one
// server, a Cluster, or behind Sentinels), the embedded store (boltstore)
// and PostgreSQL (pgstore). It turns what goes wrong at start into the one
// line a command prints, naming the fix: a server that is not Redis, an
// evicting or too old Redis, an embedded store that is locked, damaged or
// not readable. The flags are main's; this package takes their values:
// RedisTarget is the Redis that the values of the Redis flags name, and
// Pool opens the PostgreSQL database of a URL flag.
package storeopen

import (
	"bufio"
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/redis/go-redis/v9"

	"github.com/idemgo/idem"
	"github.com/idemgo/idem/boltstore"
	"github.com/idemgo/idem/cmd/idem/internal/cli"
	"github.com/idemgo/idem/postgres/pgstore"
	"github.com/idemgo/idem/redisstore"
	"github.com/idemgo/idem/storekit"
)

// ConnectTimeout bounds the checks made at start (pinging Redis, probing
// what answers on its port).
const ConnectTimeout = 3 * time.Second

// Store is an opened store, with what the admin commands need beyond
// idem.Store.
type Store struct {
	Store    idem.Store
	Describe string // for logs and messages, without secrets
	List     func(ctx context.Context, limit int) ([]Entry, error)
	RedisKey func(digest string) string // nil but for Redis
	Redis    redis.UniversalClient      // nil but for Redis
	// Health returns what the last check of the server found (Redis with
	// a check interval), nil while it is fit; nil for other stores.
	Health func() error
	Close  func() error
}

// Entry is one record listed by idem ls.
type Entry struct {
	Key    string
	Record storekit.Record
}

// lister adapts a store's List, whose entries have their own type.
func lister[E any](list func(context.Context, int) ([]E, error), entry func(E) Entry) func(context.Context, int) ([]Entry, error) {
	return func(ctx context.Context, limit int) ([]Entry, error) {
		es, err := list(ctx, limit)
		out := make([]Entry, len(es))
		for i, e := range es {
			out[i] = entry(e)
		}
		return out, err
	}
}

// RedisOptions are the options of the Redis store.
type RedisOptions struct {
	Prefix        string
	AllowEviction bool          // redisstore.WithAllowEviction
	WaitReplicas  int           // redisstore.WithWait; 0: no WAIT
	WaitTimeout   time.Duration // redisstore.WithWait
	CheckInterval time.Duration // redisstore.WithServerCheck; 0: at start only
	Logger        *slog.Logger  // the store's start warning; nil: slog.Default()
	// Probe are the servers asked, when the ping fails, whether they are
	// Redis servers at all (see ProbeRESP).
	Probe Probe
}

// Probe are the addresses of a client's servers.
type Probe struct {
	Network string // "tcp" when empty
	Addrs   []string
	TLS     *tls.Config
}

// Redis pings c, so that a wrong address is reported at once, and opens
// the Redis store on it. On an error c is closed.
func Redis(ctx context.Context, c redis.UniversalClient, describe string, o RedisOptions) (*Store, error) {
	pctx, cancel := context.WithTimeout(ctx, ConnectTimeout)
	defer cancel()
	if err := c.Ping(pctx).Err(); err != nil {
		c.Close()
		if nr := o.Probe.NotRedis(ctx); nr != nil {
			return nil, fmt.Errorf("%s: %v", describe, nr)
		}
		return nil, fmt.Errorf("%s is not reachable: %v", describe, err)
	}
	opts := []redisstore.Option{redisstore.WithPrefix(o.Prefix)}
	if o.AllowEviction {
		opts = append(opts, redisstore.WithAllowEviction())
	}
	if o.WaitReplicas > 0 {
		opts = append(opts, redisstore.WithWait(o.WaitReplicas, o.WaitTimeout))
	}
	if o.Logger != nil {
		opts = append(opts, redisstore.WithLogger(o.Logger))
	}
	if o.CheckInterval > 0 {
		opts = append(opts, redisstore.WithServerCheck(o.CheckInterval))
	}
	st, err := redisstore.New(c, opts...)
	if err != nil {
		c.Close()
		return nil, Error(err)
	}
	return &Store{
		Store:    st,
		Describe: describe,
		List:     lister(st.List, func(e redisstore.Entry) Entry { return Entry{e.Key, e.Record} }),
		RedisKey: st.Key,
		Redis:    c,
		Health:   st.Health,
		Close: func() error {
			st.Close() // the replay cache's tracking connection, the checks
			return c.Close()
		},
	}, nil
}

// NotRedis looks, after a failure to talk to the servers, for one that is
// not a Redis server at all (--redis given the port of an HTTP server):
// the client then reports only that it could not parse a reply.
func (p Probe) NotRedis(ctx context.Context) error {
	network := p.Network
	if network == "" {
		network = "tcp"
	}
	for _, a := range p.Addrs {
		if err := ProbeRESP(ctx, network, a, p.TLS); err != nil {
			return err
		}
	}
	return nil
}

// ProbeRESP sends PING to the server at addr and reads the first line of
// its answer: nil if it answers in the Redis protocol (RESP), or cannot be
// reached or says nothing (that is not the question here); otherwise an
// error that says it is not a Redis server, with what it answered.
func ProbeRESP(ctx context.Context, network, addr string, tlsConf *tls.Config) error {
	ctx, cancel := context.WithTimeout(ctx, ConnectTimeout)
	defer cancel()
	d := &net.Dialer{}
	var conn net.Conn
	var err error
	if tlsConf != nil {
		conn, err = (&tls.Dialer{NetDialer: d, Config: tlsConf}).DialContext(ctx, network, addr)
	} else {
		conn, err = d.DialContext(ctx, network, addr)
	}
	if err != nil {
		return nil
	}
	defer conn.Close()
	if dl, ok := ctx.Deadline(); ok {
		conn.SetDeadline(dl)
	}
	if _, err := io.WriteString(conn, "*1\r\n$4\r\nPING\r\n"); err != nil {
		return nil
	}
	line, _ := bufio.NewReader(io.LimitReader(conn, 200)).ReadString('\n')
	line = strings.TrimRight(line, "\r\n")
	if line == "" || strings.IndexByte("+-:$*_,#!=(%~>|", line[0]) >= 0 {
		return nil
	}
	what := ""
	if strings.HasPrefix(line, "HTTP/") || strings.HasPrefix(line, "<") {
		what = ", as an HTTP server does"
	}
	return fmt.Errorf("%s is not a Redis server: it answered %q to PING%s; check the host and port", addr, line, what)
}

// Error turns an error of redisstore.New (or of a store's check) into the
// command's one line, naming the flags instead of the library's options.
func Error(err error) error {
	var ee *redisstore.EvictionError
	var ve *redisstore.VersionError
	switch {
	case errors.As(err, &ee):
		return fmt.Errorf("redis %s has maxmemory-policy %s, which can evict idempotency records (a retried request then runs again); set maxmemory-policy noeviction on the server (keep caches on another Redis), or pass --allow-eviction to accept that risk",
			ee.Addr, ee.Policy)
	case errors.As(err, &ve):
		return fmt.Errorf("redis %s runs Redis %s; idem needs Redis %s or later, or Valkey: upgrade the server", ve.Addr, ve.Version, ve.Need)
	case errors.Is(err, idem.ErrInvalid):
		return cli.Usagef("%v", err)
	}
	return err
}

// Bolt opens the embedded store at path. With create, its directory is
// made (the proxy); without, the file must exist (admin commands).
func Bolt(path string, create bool) (*Store, error) {
	if create {
		if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
			return nil, fmt.Errorf("cannot use data directory %s: %v", filepath.Dir(path), cli.Cause(err))
		}
	} else if _, err := os.Stat(path); errors.Is(err, fs.ErrNotExist) {
		return nil, fmt.Errorf("no embedded store at %s (%v); give --data, or --redis for a Redis store", path, cli.Cause(err))
	} else if err != nil {
		return nil, BoltError(path, err)
	}
	st, err := boltstore.Open(path)
	if errors.Is(err, boltstore.ErrLocked) {
		return nil, fmt.Errorf("the embedded store %s is in use by another process (a running proxy?); stop it first", path)
	}
	if err != nil {
		return nil, BoltError(path, err)
	}
	return &Store{
		Store:    st,
		Describe: "embedded store " + path,
		List:     lister(st.List, func(e boltstore.Entry) Entry { return Entry{e.Key, e.Record} }),
		Close:    st.Close,
	}, nil
}

// BoltError is the one line that reports why the embedded store at path
// does not open, other than a lock: damaged, not readable by this user, or
// another error.
func BoltError(path string, err error) error {
	switch {
	case errors.Is(err, boltstore.ErrCorrupt):
		return DamagedError(path, err)
	case errors.Is(err, fs.ErrPermission):
		detail := err
		if pe := (*fs.PathError)(nil); errors.As(err, &pe) {
			detail = pe.Err // permission denied, without the path said already
		}
		return fmt.Errorf("cannot read the embedded store %s (%v); run idem as the user the proxy runs as, who owns %s",
			path, detail, filepath.Dir(path))
	}
	return fmt.Errorf("cannot open the embedded store %s: %v", path, err)
}

// DamagedError is the one line that reports a damaged embedded store
// file: which file, what to do, and bbolt's finding last. Damage in the log
// names the log file, the offset and the recovery command.
func DamagedError(path string, err error) error {
	var ce *boltstore.CorruptLogError
	if errors.As(err, &ce) {
		return fmt.Errorf("the embedded store %s cannot be opened: its %s; run 'idem recover --data %s' to keep every write the log still holds (it copies the damaged log aside and reports what was lost), or restore the store from a backup",
			path, ce.LogDamage, filepath.Dir(path))
	}
	detail := strings.Join(strings.Fields(err.Error()), " ") // one line whatever bbolt said
	return fmt.Errorf("the embedded store %s is damaged and cannot be read (%s); move the file aside to start with an empty store, or restore it from a backup",
		path, detail)
}

// Postgres opens pgstore on pool, which it then owns. With create (the
// proxy) it creates or updates its table and functions; admin commands
// need them to exist.
func Postgres(ctx context.Context, pool *pgxpool.Pool, describe string, create bool) (*Store, error) {
	st, err := pgstore.New(pool)
	if err != nil {
		pool.Close()
		return nil, err
	}
	if create {
		if err := st.Migrate(ctx); err != nil {
			st.Close()
			pool.Close()
			return nil, fmt.Errorf("%s: %v", describe, err)
		}
	}
	return &Store{
		Store:    st,
		Describe: describe,
		List:     lister(st.List, func(e pgstore.Entry) Entry { return Entry{e.Key, e.Record} }),
		Close: func() error {
			st.Close()
			pool.Close()
			return nil
		},
	}, nil
}
