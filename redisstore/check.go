package redisstore

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"time"

	"github.com/idemgo/idem/internal/redisinfo"
	"github.com/redis/go-redis/v9"
	"github.com/redis/rueidis"
)

// StartCheckTimeout bounds the checks that New and NewRueidis make.
const StartCheckTimeout = 10 * time.Second

// WithAllowEviction makes New and NewRueidis accept a server whose
// maxmemory-policy is not noeviction. Such a server can evict a record, and
// the retried request then runs again: use it only where duplicates are
// acceptable (tests, caches of idempotent work). The default is to refuse
// such a server with an *EvictionError.
func WithAllowEviction() Option { return func(c *config) { c.allowEviction = true } }

// WithLogger sets the logger of the warning New and NewRueidis log when
// they cannot check the server (INFO and CONFIG GET refused, as ACLs and
// managed services may do). The default is slog.Default().
func WithLogger(l *slog.Logger) Option { return func(c *config) { c.logger = l } }

// node is one server of the deployment, as the start check sees it.
type node interface {
	addr() string
	info(ctx context.Context) (string, error)
	configGet(ctx context.Context, name string) (string, error)
	// setWaitAOF sets key and sends WAITAOF 1 0 timeout on the same
	// connection, and returns the local fsyncs that WAITAOF counted
	// (waitaof.go).
	setWaitAOF(ctx context.Context, key string, timeout time.Duration) (int64, error)
	// exists sends EXISTS key (answered MOVED on a Cluster node that does
	// not serve it).
	exists(ctx context.Context, key string) error
	del(ctx context.Context, key string) error
}

// checkServer is the start check of New and NewRueidis: on every node the
// client knows (a Cluster's primaries and replicas), the version must be
// 7.0 or later (7.2 with WithWaitAOF) and maxmemory-policy noeviction
// (unless WithAllowEviction). Both are read from INFO; where INFO is
// refused, the policy from CONFIG GET. With WithWaitAOF, WAITAOF must wait
// for the fsync (checkWaitAOF: a server that acknowledges early must not
// run appendfsync everysec). What cannot be read is logged once, as a
// warning, and not held against the server. A server that cannot be
// reached is an error.
func checkServer(ctx context.Context, nodes []node, c *config) error {
	var unchecked []string
	for _, n := range nodes {
		f, err := inspect(ctx, n)
		if err != nil {
			return fmt.Errorf("redisstore: cannot check %s at start: %w", n.addr(), err)
		}
		version, policy := f["redis_version"], f["maxmemory_policy"]
		if version == "" {
			unchecked = append(unchecked, n.addr()+" version")
		} else if err := checkVersion(n.addr(), version, c); err != nil {
			return err
		}
		if c.wait != nil && c.wait.aof && version != "" {
			r, err := checkWaitAOF(ctx, n, f, c.prefix)
			switch {
			case err != nil:
				return fmt.Errorf("redisstore: cannot check WAITAOF on %s at start: %w", n.addr(), err)
			case r.Early:
				return &WaitAOFError{Addr: n.addr(), Server: r.Server, Reason: r.Reason()}
			case r.Unknown != "":
				unchecked = append(unchecked, n.addr()+" WAITAOF ("+r.Unknown+"; with appendfsync everysec "+r.Server+" may count writes as fsynced before they are)")
			}
		}
		switch policy {
		case "noeviction":
		case "":
			unchecked = append(unchecked, n.addr()+" maxmemory-policy")
		default:
			if !c.allowEviction {
				return &EvictionError{Addr: n.addr(), Policy: policy}
			}
		}
	}
	if len(unchecked) > 0 {
		l := c.logger
		if l == nil {
			l = slog.Default()
		}
		l.Warn("redisstore: cannot check the server (INFO and CONFIG GET refused); make sure it is Redis 7.0 or later, or Valkey, with maxmemory-policy noeviction",
			"unchecked", strings.Join(unchecked, ", "))
	}
	return nil
}

func checkVersion(addr, version string, c *config) error {
	v, ok := redisinfo.ParseVersion(version)
	switch {
	case !ok:
		return nil // an unusual build; the scripts will tell
	case !v.AtLeast(7, 0):
		return &VersionError{Addr: addr, Version: version, Need: "7.0", Reason: "redisstore"}
	case c.wait != nil && c.wait.aof && !v.AtLeast(7, 2):
		return &VersionError{Addr: addr, Version: version, Need: "7.2", Reason: "WithWaitAOF (WAITAOF)"}
	}
	return nil
}

// inspect returns a node's INFO fields; where the server refuses INFO,
// only maxmemory_policy, from CONFIG GET ("" if refused too). Only a
// failure to talk to the server is an error.
func inspect(ctx context.Context, n node) (map[string]string, error) {
	info, err := n.info(ctx)
	if err == nil {
		return redisinfo.Parse(info), nil
	}
	if !isReplyError(err) {
		return nil, err
	}
	policy, err := n.configGet(ctx, "maxmemory-policy")
	if err != nil && !isReplyError(err) {
		return nil, err
	}
	return map[string]string{"maxmemory_policy": policy}, nil
}

// isReplyError reports whether err is an error reply of the server (such as
// NOPERM or an unknown command), not a failure to reach it.
func isReplyError(err error) bool {
	var re redis.Error
	if errors.As(err, &re) {
		return true
	}
	_, ok := rueidis.IsRedisErr(err)
	return ok
}

// goRedisNode is a node reached through a go-redis client.
type goRedisNode struct{ c *redis.Client }

func (n goRedisNode) addr() string { return n.c.Options().Addr }

func (n goRedisNode) info(ctx context.Context) (string, error) { return n.c.Info(ctx).Result() }

func (n goRedisNode) configGet(ctx context.Context, name string) (string, error) {
	m, err := n.c.ConfigGet(ctx, name).Result()
	return m[name], err
}

// rueidisNode is a node reached through a rueidis client.
type rueidisNode struct {
	a string
	c rueidis.Client
}

func (n rueidisNode) addr() string { return n.a }

func (n rueidisNode) info(ctx context.Context) (string, error) {
	return n.c.Do(ctx, n.c.B().Info().Build()).ToString()
}

func (n rueidisNode) configGet(ctx context.Context, name string) (string, error) {
	m, err := n.c.Do(ctx, n.c.B().ConfigGet().Parameter(name).Build()).AsStrMap()
	return m[name], err
}
