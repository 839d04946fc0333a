package main

import (
	"context"
	"fmt"
	"log/slog"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/idemgo/idem/cmd/idem/internal/cli"
	"github.com/idemgo/idem/cmd/idem/internal/storeopen"
	"github.com/idemgo/idem/redisstore"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/redis/go-redis/v9"
)

// storeFlags choose the store: Redis, a Redis Cluster, or the embedded
// store (the default).
type storeFlags struct {
	target      storeopen.RedisTarget // --redis, --redis-cluster, --redis-sentinel and their user and passwords
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
	connectTimeout = storeopen.ConnectTimeout
	// defaultWaitTimeout is --wait-replicas-timeout's default, the WAIT
	// timeout the failover scenarios ran with (RELIABILITY.md rows 13).
	defaultWaitTimeout = 500 * time.Millisecond
)

// flags returns the flags that choose the store, for every command that
// opens one.
func (s *storeFlags) flags() []cli.Def {
	s.prefix, s.data = redisstore.DefaultPrefix, defaultDataDir
	return []cli.Def{
		{Name: "redis", Placeholder: "URL", Value: cli.String(&s.target.URL), Secret: cli.URLSecret, Usage: "Redis server for the records, e.g. redis://:password@host:6379/0 (rediss:// for TLS); several proxies may share it"},
		{Name: "redis-cluster", Placeholder: "ADDRS", Value: cli.String(&s.target.Cluster), Secret: cli.URLSecret, Usage: "Redis Cluster for the records: host:port,host:port,... or a redis:// URL with addr= parameters"},
		{Name: "redis-sentinel", Placeholder: "NAME@ADDRS", Value: cli.String(&s.target.Sentinel), Usage: "Redis behind Sentinels: the primary's name and the Sentinels, e.g. mymaster@10.0.0.1:26379,10.0.0.2:26379,10.0.0.3:26379"},
		{Name: "redis-username", Placeholder: "USER", Value: cli.String(&s.target.Username), Usage: "ACL user for --redis-sentinel and --redis-cluster (with --redis, put it in the URL)"},
		{Name: "redis-password", Placeholder: "PASSWORD", Value: cli.String(&s.target.Password), Secret: cli.FullSecret, Usage: "password for --redis-sentinel and --redis-cluster (with --redis, put it in the URL); prefer the environment variable"},
		{Name: "redis-sentinel-password", Placeholder: "PASSWORD", Value: cli.String(&s.target.SentinelPassword), Secret: cli.FullSecret, Usage: "password of the Sentinels themselves (requirepass of redis-server --sentinel)"},
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
	err := cli.FirstError(
		cli.Check(s.waitReplicas > 0 && !s.redis(), "--wait-replicas needs a Redis store (--redis, --redis-cluster or --redis-sentinel)"),
		cli.Check(s.waitReplicas > 0 && s.waitTimeout <= 0, "--wait-replicas-timeout %v must be positive", s.waitTimeout),
		s.target.Check(),
		cli.Check(s.postgres != "" && !s.hybrid && s.redis(), "--postgres and --redis exclude each other; give one store"),
		cli.Check(strings.ContainsAny(s.prefix, "{}"), "invalid --redis-prefix %q: it must not contain { or }", s.prefix),
		cli.Check(!s.redis() && s.data == "", "--data is empty; give a directory for the embedded store"),
	)
	if err == nil && s.postgres != "" {
		if _, perr := pgxpool.ParseConfig(s.postgres); perr != nil {
			err = cli.URLError("--postgres", s.postgres, perr, "postgres")
		}
	}
	return err
}

// redis reports whether the flags choose a Redis store.
func (s *storeFlags) redis() bool { return s.target.Named() }

// openedStore is a store opened by a command.
type openedStore = storeopen.Store

// open opens the store the flags choose. create says whether the embedded
// store may be created (the proxy) or must exist (admin commands). Redis
// is pinged, so that a wrong address is reported at once.
func (s *storeFlags) open(ctx context.Context, create bool) (*openedStore, error) {
	switch {
	case s.redis():
		c, describe, err := s.target.Client()
		if err != nil {
			return nil, err
		}
		return s.openRedis(ctx, c, describe)
	case s.postgres != "":
		pool, describe, err := storeopen.Pool(ctx, "--postgres", s.postgres)
		if err != nil {
			return nil, err
		}
		return storeopen.Postgres(ctx, pool, describe, create)
	}
	return storeopen.Bolt(s.dataPath(), create)
}

// openRedis opens the Redis store on c with the flags' options.
func (s *storeFlags) openRedis(ctx context.Context, c redis.UniversalClient, describe string) (*openedStore, error) {
	return storeopen.Redis(ctx, c, describe, storeopen.RedisOptions{
		Prefix: s.prefix, AllowEviction: s.allowEviction, WaitReplicas: s.waitReplicas, WaitTimeout: s.waitTimeout,
		CheckInterval: s.checkInterval, Logger: s.logger, Probe: s.target.Probe(),
	})
}

// dataPath returns the embedded store's file.
func (s *storeFlags) dataPath() string { return filepath.Join(s.data, dataFile) }

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
