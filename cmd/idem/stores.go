package main

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
	"sync"
	"sync/atomic"
	"time"

	"github.com/idemgo/idem"
	"github.com/idemgo/idem/boltstore"
	"github.com/idemgo/idem/cmd/idem/internal/cli"
	"github.com/idemgo/idem/redisstore"
	"github.com/idemgo/idem/storekit"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/redis/go-redis/v9"
)

// storeFlags choose the store: Redis, a Redis Cluster, or the embedded
// store (the default).
type storeFlags struct {
	redisURL    string
	cluster     string
	sentinel    string // --redis-sentinel NAME@HOST:PORT,...
	username    string // --redis-username, for --redis-sentinel and --redis-cluster
	password    string // --redis-password, likewise
	sentinelPW  string // --redis-sentinel-password: the Sentinels' own
	prefix      string
	data        string
	dataDefault string
	// allowEviction accepts a Redis whose maxmemory-policy may evict
	// records: the proxy's --allow-eviction, and always for the admin
	// commands, which only read and delete records.
	allowEviction bool
	// waitReplicas and waitTimeout are the proxy's --wait-replicas and
	// --wait-replicas-timeout (redisstore.WithWait); 0: no WAIT.
	waitReplicas int
	waitTimeout  time.Duration
	// checkInterval is the proxy's --redis-check-interval
	// (redisstore.WithServerCheck); 0: the server is checked at start only.
	checkInterval time.Duration
	logger        *slog.Logger // for the store's start warning; nil: slog.Default()
	postgres      string       // pgstore, or with Redis the commit gate's database (doctor, relay)
	hybrid        bool         // --postgres may come with Redis (doctor, relay)
}

const (
	defaultDataDir = "./idem-data"
	dataFile       = "idem.db"
	// connectTimeout bounds the checks made at start (dialling the
	// upstream, pinging Redis).
	connectTimeout = 3 * time.Second
	// defaultWaitTimeout is --wait-replicas-timeout's default, the WAIT
	// timeout the failover scenarios ran with (RELIABILITY.md rows 13).
	defaultWaitTimeout = 500 * time.Millisecond
)

// flags returns the flags that choose the store, for every command that
// opens one.
func (s *storeFlags) flags() []cli.Def {
	s.prefix, s.data = redisstore.DefaultPrefix, defaultDataDir
	return []cli.Def{
		{Name: "redis", Placeholder: "URL", Value: cli.String(&s.redisURL), Secret: cli.URLSecret, Usage: "Redis server for the records, e.g. redis://:password@host:6379/0 (rediss:// for TLS); several proxies may share it"},
		{Name: "redis-cluster", Placeholder: "ADDRS", Value: cli.String(&s.cluster), Secret: cli.URLSecret, Usage: "Redis Cluster for the records: host:port,host:port,... or a redis:// URL with addr= parameters"},
		{Name: "redis-sentinel", Placeholder: "NAME@ADDRS", Value: cli.String(&s.sentinel), Usage: "Redis behind Sentinels: the primary's name and the Sentinels, e.g. mymaster@10.0.0.1:26379,10.0.0.2:26379,10.0.0.3:26379"},
		{Name: "redis-username", Placeholder: "USER", Value: cli.String(&s.username), Usage: "ACL user for --redis-sentinel and --redis-cluster (with --redis, put it in the URL)"},
		{Name: "redis-password", Placeholder: "PASSWORD", Value: cli.String(&s.password), Secret: cli.FullSecret, Usage: "password for --redis-sentinel and --redis-cluster (with --redis, put it in the URL); prefer the environment variable"},
		{Name: "redis-sentinel-password", Placeholder: "PASSWORD", Value: cli.String(&s.sentinelPW), Secret: cli.FullSecret, Usage: "password of the Sentinels themselves (requirepass of redis-server --sentinel)"},
		{Name: "redis-prefix", Placeholder: "PREFIX", Value: cli.String(&s.prefix), Usage: "prefix of the record keys in Redis"},
		{Name: "data", Placeholder: "DIR", Value: cli.String(&s.data), Usage: "directory of the embedded store (files DIR/" + dataFile + " and DIR/" + dataFile + ".log), used when no Redis is given"},
		{Name: "postgres", Placeholder: "URL", Value: cli.String(&s.postgres), Secret: cli.URLSecret, Usage: "PostgreSQL for the records (pgstore), e.g. postgres://user:password@host:5432/db; its tables go in the first schema of the search_path"},
	}
}

// waitFlags are --wait-replicas and --wait-replicas-timeout (the proxy's;
// doctor has a --wait-replicas of its own, which checks).
func (s *storeFlags) waitFlags() []cli.Def {
	s.waitTimeout = defaultWaitTimeout
	return []cli.Def{
		{Name: "wait-replicas", Placeholder: "N", Value: cli.Int(&s.waitReplicas), Usage: "after each acquire and complete, wait until N Redis replicas have the write (WAIT); when fewer confirm within --wait-replicas-timeout, the request gets 503 and is not reported done (0: do not wait)"},
		{Name: "wait-replicas-timeout", Placeholder: "DURATION", Value: cli.Duration(&s.waitTimeout), Usage: "how long --wait-replicas waits for the replicas"},
	}
}

// defaultCheckInterval is --redis-check-interval's default.
const defaultCheckInterval = 10 * time.Second

// proxyFlags are the proxy's other store flags.
func (s *storeFlags) proxyFlags() []cli.Def {
	s.checkInterval = defaultCheckInterval
	return []cli.Def{
		{Name: "allow-eviction", Value: cli.Bool(&s.allowEviction), Usage: "start on a Redis whose maxmemory-policy is not noeviction (it may evict records: retried requests then run again)"},
		{Name: "redis-check-interval", Placeholder: "DURATION", Value: cli.Duration(&s.checkInterval), Usage: "how often the proxy checks its Redis servers again while it runs, as at start (maxmemory-policy noeviction unless --allow-eviction, the version); while one fails, /readyz answers 503 and each check logs an error that names the fix (0: at start only)"},
	}
}

// validate checks the flags without I/O.
func (s *storeFlags) validate() error {
	return cli.FirstError(
		cli.Check(s.waitReplicas > 0 && !s.redis(), "--wait-replicas needs a Redis store (--redis, --redis-cluster or --redis-sentinel)"),
		cli.Check(s.waitReplicas > 0 && s.waitTimeout <= 0, "--wait-replicas-timeout %v must be positive", s.waitTimeout),
		cli.Check(countSet(s.redisURL, s.cluster, s.sentinel) > 1, "--redis, --redis-cluster and --redis-sentinel exclude each other; give one"),
		cli.Check(s.redisURL != "" && (s.username != "" || s.password != ""), "--redis-username and --redis-password go with --redis-sentinel or --redis-cluster; with --redis, put them in the URL (redis://user:password@host:port)"),
		cli.Check(s.sentinelPW != "" && s.sentinel == "", "--redis-sentinel-password needs --redis-sentinel"),
		cli.Check(s.postgres != "" && !s.hybrid && s.redis(), "--postgres and --redis exclude each other; give one store"),
		cli.Check(strings.ContainsAny(s.prefix, "{}"), "invalid --redis-prefix %q: it must not contain { or }", s.prefix),
		cli.Check(!s.redis() && s.data == "", "--data is empty; give a directory for the embedded store"),
		s.validateURLs(),
	)
}

// validateURLs parses the flags that hold URLs or addresses.
func (s *storeFlags) validateURLs() error {
	if s.sentinel != "" {
		if _, err := s.sentinelOptions(); err != nil {
			return err
		}
	}
	if s.postgres != "" {
		if _, err := pgxpool.ParseConfig(s.postgres); err != nil {
			return urlFlagError("--postgres", s.postgres, err, "postgres")
		}
	}
	if s.redisURL != "" {
		if _, err := redis.ParseURL(s.redisURL); err != nil {
			return urlFlagError("--redis", s.redisURL, err, "redis")
		}
	}
	if s.cluster != "" {
		if _, err := s.clusterOptions(); err != nil {
			return err
		}
	}
	return nil
}

// countSet returns how many of vs are not empty.
func countSet(vs ...string) int {
	n := 0
	for _, v := range vs {
		if v != "" {
			n++
		}
	}
	return n
}

func (s *storeFlags) clusterOptions() (*redis.ClusterOptions, error) {
	if strings.Contains(s.cluster, "://") {
		o, err := redis.ParseClusterURL(s.cluster)
		if err != nil {
			return nil, urlFlagError("--redis-cluster", s.cluster, err, "redis")
		}
		return o, nil
	}
	addrs, err := parseAddrs("--redis-cluster", s.cluster)
	if err != nil {
		return nil, err
	}
	return &redis.ClusterOptions{Addrs: addrs, Username: s.username, Password: s.password}, nil
}

// sentinelOptions parses --redis-sentinel NAME@HOST:PORT,... into the
// options of go-redis's failover client.
func (s *storeFlags) sentinelOptions() (*redis.FailoverOptions, error) {
	name, list, ok := strings.Cut(s.sentinel, "@")
	if !ok || strings.TrimSpace(name) == "" {
		return nil, cli.Usagef("invalid --redis-sentinel %q: want NAME@HOST:PORT,... (the primary's name as the Sentinels know it, then the Sentinels)", s.sentinel)
	}
	addrs, err := parseAddrs("--redis-sentinel", list)
	if err != nil {
		return nil, err
	}
	return &redis.FailoverOptions{
		MasterName: strings.TrimSpace(name), SentinelAddrs: addrs, SentinelPassword: s.sentinelPW,
		Username: s.username, Password: s.password,
	}, nil
}

// redis reports whether the flags choose a Redis store.
func (s *storeFlags) redis() bool { return s.redisURL != "" || s.cluster != "" || s.sentinel != "" }

// parseAddrs parses the host:port,host:port,... list of flag.
func parseAddrs(flag, list string) ([]string, error) {
	var addrs []string
	for a := range strings.SplitSeq(list, ",") {
		a = strings.TrimSpace(a)
		if a == "" {
			continue
		}
		if _, port, ok := strings.Cut(a, ":"); !ok || port == "" {
			return nil, cli.Usagef("invalid %s address %q: want host:port", flag, a)
		}
		addrs = append(addrs, a)
	}
	if len(addrs) == 0 {
		return nil, cli.Usagef("%s has no address", flag)
	}
	return addrs, nil
}

// openedStore is a store opened by a command, with what admin commands
// need beyond idem.Store.
type openedStore struct {
	store    idem.Store
	describe string // for logs and messages, without secrets
	list     func(ctx context.Context, limit int) ([]listEntry, error)
	redisKey func(digest string) string // nil for the embedded store
	redis    redis.UniversalClient      // nil for the embedded store
	// health returns what the last check of the server found (Redis with
	// --redis-check-interval), nil while it is fit; nil for other stores.
	health func() error
	close  func() error
}

// listEntry is one record listed by ls.
type listEntry struct {
	key    string
	record storekit.Record
}

// openStore opens the store the flags choose. create says whether the
// embedded store may be created (the proxy) or must exist (admin commands).
// Redis is pinged, so that a wrong address is reported at once.
func (s *storeFlags) open(ctx context.Context, create bool) (*openedStore, error) {
	switch {
	case s.redisURL != "":
		opt, err := redis.ParseURL(s.redisURL)
		if err != nil {
			return nil, urlFlagError("--redis", s.redisURL, err, "redis")
		}
		c := redis.NewClient(opt)
		return s.openRedis(ctx, c, fmt.Sprintf("redis %s db %d", opt.Addr, opt.DB))
	case s.cluster != "":
		opt, err := s.clusterOptions()
		if err != nil {
			return nil, err
		}
		c := redis.NewClusterClient(opt)
		return s.openRedis(ctx, c, "redis cluster "+strings.Join(opt.Addrs, ","))
	case s.sentinel != "":
		opt, err := s.sentinelOptions()
		if err != nil {
			return nil, err
		}
		c := redis.NewFailoverClient(opt)
		return s.openRedis(ctx, c, "redis sentinel "+opt.MasterName+"@"+strings.Join(opt.SentinelAddrs, ","))
	case s.postgres != "":
		return s.openPostgres(ctx, create)
	}
	return s.openBolt(create)
}

func (s *storeFlags) openRedis(ctx context.Context, c redis.UniversalClient, describe string) (*openedStore, error) {
	pctx, cancel := context.WithTimeout(ctx, connectTimeout)
	defer cancel()
	if err := c.Ping(pctx).Err(); err != nil {
		c.Close()
		if nr := s.notRedis(ctx); nr != nil {
			return nil, fmt.Errorf("%s: %v", describe, nr)
		}
		return nil, fmt.Errorf("%s is not reachable: %v", describe, err)
	}
	opts := []redisstore.Option{redisstore.WithPrefix(s.prefix)}
	if s.allowEviction {
		opts = append(opts, redisstore.WithAllowEviction())
	}
	if s.waitReplicas > 0 {
		opts = append(opts, redisstore.WithWait(s.waitReplicas, s.waitTimeout))
	}
	if s.logger != nil {
		opts = append(opts, redisstore.WithLogger(s.logger))
	}
	if s.checkInterval > 0 {
		opts = append(opts, redisstore.WithServerCheck(s.checkInterval))
	}
	st, err := redisstore.New(c, opts...)
	if err != nil {
		c.Close()
		return nil, storeError(err)
	}
	return &openedStore{
		store:    st,
		describe: describe,
		list: func(ctx context.Context, limit int) ([]listEntry, error) {
			es, err := st.List(ctx, limit)
			out := make([]listEntry, len(es))
			for i, e := range es {
				out[i] = listEntry{key: e.Key, record: e.Record}
			}
			return out, err
		},
		redisKey: st.Key,
		redis:    c,
		health:   st.Health,
		close: func() error {
			st.Close() // the replay cache's tracking connection, the checks
			return c.Close()
		},
	}, nil
}

// notRedis looks, after a failure to talk to the Redis flags' servers, for
// one that is not a Redis server at all (--redis given the port of an HTTP
// server): the client then reports only that it could not parse a reply.
// It returns an error that names the server and what it answered, or nil.
func (s *storeFlags) notRedis(ctx context.Context) error {
	network, addrs := "tcp", []string(nil)
	var tlsConf *tls.Config
	switch {
	case s.redisURL != "":
		opt, err := redis.ParseURL(s.redisURL)
		if err != nil {
			return nil
		}
		network, addrs, tlsConf = opt.Network, []string{opt.Addr}, opt.TLSConfig
	case s.cluster != "":
		opt, err := s.clusterOptions()
		if err != nil {
			return nil
		}
		addrs, tlsConf = opt.Addrs, opt.TLSConfig
	case s.sentinel != "":
		opt, err := s.sentinelOptions()
		if err != nil {
			return nil
		}
		addrs = opt.SentinelAddrs
	}
	for _, a := range addrs {
		if err := probeRESP(ctx, network, a, tlsConf); err != nil {
			return err
		}
	}
	return nil
}

// probeRESP sends PING to the server at addr and reads the first line of
// its answer: nil if it answers in the Redis protocol (RESP), or cannot be
// reached or says nothing (that is not the question here); otherwise an
// error that says it is not a Redis server, with what it answered.
func probeRESP(ctx context.Context, network, addr string, tlsConf *tls.Config) error {
	ctx, cancel := context.WithTimeout(ctx, connectTimeout)
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

// storeError turns an error of redisstore.New into the command's one line,
// naming the flags instead of the library's options.
func storeError(err error) error {
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

// dataPath returns the embedded store's file.
func (s *storeFlags) dataPath() string { return filepath.Join(s.data, dataFile) }

func (s *storeFlags) openBolt(create bool) (*openedStore, error) {
	path := s.dataPath()
	if create {
		if err := os.MkdirAll(s.data, 0o700); err != nil {
			return nil, fmt.Errorf("cannot use data directory %s: %v", s.data, cli.Cause(err))
		}
	} else if _, err := os.Stat(path); errors.Is(err, fs.ErrNotExist) {
		return nil, fmt.Errorf("no embedded store at %s (%v); give --data, or --redis for a Redis store", path, cli.Cause(err))
	} else if err != nil {
		return nil, openBoltError(path, err)
	}
	st, err := boltstore.Open(path)
	if errors.Is(err, boltstore.ErrLocked) {
		return nil, fmt.Errorf("the embedded store %s is in use by another process (a running proxy?); stop it first", path)
	}
	if err != nil {
		return nil, openBoltError(path, err)
	}
	return &openedStore{
		store:    st,
		describe: "embedded store " + path,
		list: func(ctx context.Context, limit int) ([]listEntry, error) {
			es, err := st.List(ctx, limit)
			out := make([]listEntry, len(es))
			for i, e := range es {
				out[i] = listEntry{key: e.Key, record: e.Record}
			}
			return out, err
		},
		close: st.Close,
	}, nil
}

// openBoltError is the one line that reports why the embedded store at
// path does not open, other than a lock: damaged, not readable by this
// user, or another error.
func openBoltError(path string, err error) error {
	switch {
	case errors.Is(err, boltstore.ErrCorrupt):
		return damagedStoreError(path, err)
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

// damagedStoreError is the one line that reports a damaged embedded store
// file: which file, what to do, and bbolt's finding last. Damage in the log
// names the log file, the offset and the recovery command.
func damagedStoreError(path string, err error) error {
	var ce *boltstore.CorruptLogError
	if errors.As(err, &ce) {
		return fmt.Errorf("the embedded store %s cannot be opened: its %s; run 'idem recover --data %s' to keep every write the log still holds (it copies the damaged log aside and reports what was lost), or restore the store from a backup",
			path, ce.LogDamage, filepath.Dir(path))
	}
	detail := strings.Join(strings.Fields(err.Error()), " ") // one line whatever bbolt said
	return fmt.Errorf("the embedded store %s is damaged and cannot be read (%s); move the file aside to start with an empty store, or restore it from a backup",
		path, detail)
}

// redisLogger receives go-redis's own log lines (dial failures, pool
// errors). The proxy passes them to its logger at debug level; other
// commands drop them: printed as they are, they would break the one-line
// error contract, and the errors reach the commands anyway.
type redisLogger struct{ l atomic.Pointer[slog.Logger] }

func (r *redisLogger) Printf(ctx context.Context, format string, v ...any) {
	if l := r.l.Load(); l != nil {
		l.Debug("redis client: " + fmt.Sprintf(format, v...))
	}
}

var (
	redisLog     = &redisLogger{}
	redisLogOnce sync.Once
)
