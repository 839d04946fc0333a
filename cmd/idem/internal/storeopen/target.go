package storeopen

import (
	"context"
	"fmt"
	"strings"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/redis/go-redis/v9"

	"github.com/idemgo/idem/cmd/idem/internal/cli"
	"github.com/idemgo/idem/cmd/idem/internal/redact"
)

// RedisTarget is the Redis that a command's flags name, at most one of:
// one server (URL, --redis), a Cluster (Cluster, --redis-cluster:
// host:port,... or a redis:// URL with addr= parameters), or the primary
// that Sentinels follow (Sentinel, --redis-sentinel: NAME@host:port,...).
type RedisTarget struct {
	URL, Cluster, Sentinel string
	// Username and Password are the ACL user of a Cluster or Sentinel
	// (--redis-username, --redis-password); a URL holds its own.
	Username, Password string
	SentinelPassword   string // the Sentinels' own (--redis-sentinel-password)
}

// Named reports whether the target names a Redis.
func (t *RedisTarget) Named() bool { return t.URL != "" || t.Cluster != "" || t.Sentinel != "" }

// Check checks the target without I/O: one Redis at most, the user and
// password where they apply, and what the flags hold parses.
func (t *RedisTarget) Check() error {
	n := 0
	for _, v := range []string{t.URL, t.Cluster, t.Sentinel} {
		if v != "" {
			n++
		}
	}
	err := cli.FirstError(
		cli.Check(n > 1, "--redis, --redis-cluster and --redis-sentinel exclude each other; give one"),
		cli.Check(t.URL != "" && (t.Username != "" || t.Password != ""), "--redis-username and --redis-password go with --redis-sentinel or --redis-cluster; with --redis, put them in the URL (redis://user:password@host:port)"),
		cli.Check(t.SentinelPassword != "" && t.Sentinel == "", "--redis-sentinel-password needs --redis-sentinel"),
	)
	if err == nil && t.Named() {
		_, _, err = t.parse()
	}
	return err
}

// Client returns a client of the target (*redis.Client for one server or
// Sentinels, *redis.ClusterClient for a Cluster) and its description,
// without secrets. It does no I/O.
func (t *RedisTarget) Client() (redis.UniversalClient, string, error) {
	newClient, describe, err := t.parse()
	if err != nil {
		return nil, "", err
	}
	return newClient(), describe, nil
}

// parse parses the target into the constructor of its client and its
// description.
func (t *RedisTarget) parse() (func() redis.UniversalClient, string, error) {
	switch {
	case t.URL != "":
		opt, err := redis.ParseURL(t.URL)
		if err != nil {
			return nil, "", cli.URLError("--redis", t.URL, err, "redis")
		}
		return func() redis.UniversalClient { return redis.NewClient(opt) }, fmt.Sprintf("redis %s db %d", opt.Addr, opt.DB), nil
	case t.Cluster != "":
		opt, err := t.clusterOptions()
		if err != nil {
			return nil, "", err
		}
		return func() redis.UniversalClient { return redis.NewClusterClient(opt) }, "redis cluster " + strings.Join(opt.Addrs, ","), nil
	case t.Sentinel != "":
		opt, err := t.sentinelOptions()
		if err != nil {
			return nil, "", err
		}
		return func() redis.UniversalClient { return redis.NewFailoverClient(opt) },
			"redis sentinel " + opt.MasterName + "@" + strings.Join(opt.SentinelAddrs, ","), nil
	}
	return nil, "", cli.Usagef("no Redis given: --redis, --redis-cluster or --redis-sentinel")
}

// Probe returns the servers the target names, to ask whether they are
// Redis servers at all when a ping fails; none if it does not parse.
func (t *RedisTarget) Probe() Probe {
	switch {
	case t.URL != "":
		if opt, err := redis.ParseURL(t.URL); err == nil {
			return Probe{Network: opt.Network, Addrs: []string{opt.Addr}, TLS: opt.TLSConfig}
		}
	case t.Cluster != "":
		if opt, err := t.clusterOptions(); err == nil {
			return Probe{Addrs: opt.Addrs, TLS: opt.TLSConfig}
		}
	case t.Sentinel != "":
		if opt, err := t.sentinelOptions(); err == nil {
			return Probe{Addrs: opt.SentinelAddrs}
		}
	}
	return Probe{}
}

func (t *RedisTarget) clusterOptions() (*redis.ClusterOptions, error) {
	if strings.Contains(t.Cluster, "://") {
		o, err := redis.ParseClusterURL(t.Cluster)
		if err != nil {
			return nil, cli.URLError("--redis-cluster", t.Cluster, err, "redis")
		}
		return o, nil
	}
	addrs, err := parseAddrs("--redis-cluster", t.Cluster)
	if err != nil {
		return nil, err
	}
	return &redis.ClusterOptions{Addrs: addrs, Username: t.Username, Password: t.Password}, nil
}

// sentinelOptions parses NAME@HOST:PORT,... into the options of go-redis's
// failover client.
func (t *RedisTarget) sentinelOptions() (*redis.FailoverOptions, error) {
	name, list, ok := strings.Cut(t.Sentinel, "@")
	if !ok || strings.TrimSpace(name) == "" {
		return nil, cli.Usagef("invalid --redis-sentinel %q: want NAME@HOST:PORT,... (the primary's name as the Sentinels know it, then the Sentinels)", t.Sentinel)
	}
	addrs, err := parseAddrs("--redis-sentinel", list)
	if err != nil {
		return nil, err
	}
	return &redis.FailoverOptions{
		MasterName: strings.TrimSpace(name), SentinelAddrs: addrs, SentinelPassword: t.SentinelPassword,
		Username: t.Username, Password: t.Password,
	}, nil
}

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

// Pool opens and pings the PostgreSQL database at raw, the value of flag,
// and returns it with its description (without secrets).
func Pool(ctx context.Context, flag, raw string) (*pgxpool.Pool, string, error) {
	cfg, err := pgxpool.ParseConfig(raw)
	if err != nil {
		return nil, "", cli.URLError(flag, raw, err, "postgres")
	}
	describe := fmt.Sprintf("postgres %s:%d/%s", cfg.ConnConfig.Host, cfg.ConnConfig.Port, cfg.ConnConfig.Database)
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return nil, "", fmt.Errorf("%s: %s", describe, redact.Scrub(err.Error(), raw))
	}
	pctx, cancel := context.WithTimeout(ctx, ConnectTimeout)
	defer cancel()
	if err := pool.Ping(pctx); err != nil {
		pool.Close()
		return nil, "", fmt.Errorf("%s is not reachable: %s", describe, redact.Scrub(err.Error(), raw))
	}
	return pool, describe, nil
}
