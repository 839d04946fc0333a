package redisstore

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"time"

	"github.com/idemgo/idem/redisstore/internal/backend"
	"github.com/idemgo/idem/redisstore/redisinfo"
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

// WithServerCheck makes the store repeat New's check of the server (the
// version, WithWaitAOF's appendfsync, and maxmemory-policy noeviction
// unless WithAllowEviction) every interval while it runs, in the
// background, on every node the client knows then (a Cluster's primaries
// and replicas; the current primary behind Sentinels). A call of the store
// that fails to reach the server makes it check again as soon as the
// server answers: a restart or a failover may bring another configuration.
// While a check finds the server unfit (CONFIG SET maxmemory-policy
// allkeys-lru on a running server), Health returns what it found and every
// check logs an error that names the fix (WithLogger); the store keeps
// serving. The default is 0: the server is checked once, by New. Close
// ends the checks.
func WithServerCheck(interval time.Duration) Option {
	return func(c *config) { c.serverCheck = interval }
}

// Health returns the finding of the last check of the server that
// WithServerCheck runs: nil while the server is fit, else an
// *EvictionError (its maxmemory-policy can evict records), a *VersionError
// or a *WaitAOFError. A check that could not reach the server leaves the
// previous finding. Without WithServerCheck it returns nil. It is safe
// for concurrent use.
func (s *Store) Health() error {
	if s.monitor == nil {
		return nil
	}
	return s.monitor.health()
}

// monitor runs the checks of WithServerCheck. It does not refer to the
// Store, so that a store dropped without Close can be collected (and the
// monitor stopped then).
type monitor struct {
	b        backend.Backend
	c        config
	interval time.Duration
	kicks    chan struct{} // a call could not reach the server
	done     chan struct{}
	stopped  chan struct{}
	stopOnce sync.Once

	mu     sync.Mutex
	err    error // the last finding
	checks int64 // checks that reached the server, for tests
}

// retryCheck is how soon a check that could not reach the server runs
// again, and the least time between two checks that calls ask for.
const retryCheck = 200 * time.Millisecond

func startMonitor(b backend.Backend, c config) *monitor {
	m := &monitor{b: b, c: c, interval: c.serverCheck, kicks: make(chan struct{}, 1), done: make(chan struct{}), stopped: make(chan struct{})}
	go m.run()
	return m
}

func (m *monitor) run() {
	defer close(m.stopped)
	t := time.NewTimer(m.interval)
	defer t.Stop()
	for {
		select {
		case <-m.done:
			return
		case <-t.C:
		case <-m.kicks:
		}
		next := m.interval
		if !m.check() {
			next = min(m.interval, retryCheck)
		}
		// The least gap between two checks, whatever the calls ask.
		select {
		case <-m.done:
			return
		case <-time.After(min(next, retryCheck)):
		}
		t.Reset(next - min(next, retryCheck))
	}
}

// check runs one check and records its finding. It reports whether it
// reached every node.
func (m *monitor) check() bool {
	ctx, cancel := context.WithTimeout(context.Background(), StartCheckTimeout)
	defer cancel()
	nodes, err := m.b.Nodes(ctx)
	if err != nil {
		return false
	}
	_, err = findings(ctx, nodes, &m.c)
	if ue := (*unreachableError)(nil); errors.As(err, &ue) {
		return false
	}
	m.mu.Lock()
	prev := m.err
	m.err = err
	m.checks++
	m.mu.Unlock()
	log := m.c.log()
	var ee *EvictionError
	switch {
	case errors.As(err, &ee):
		log.Error("redisstore: the server can evict idempotency records, and a retried request whose record was evicted runs again; set the policy back with CONFIG SET maxmemory-policy noeviction, and in the server's configuration file",
			"addr", ee.Addr, "maxmemory_policy", ee.Policy)
	case err != nil:
		log.Error("redisstore: the server is no longer fit for idempotency records", "error", err)
	case prev != nil:
		log.Info("redisstore: the server is fit for idempotency records again")
	}
	return true
}

func (m *monitor) health() error {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.err
}

// kick asks for a check as soon as the server answers, after a call that
// could not reach it.
func (m *monitor) kick() {
	select {
	case m.kicks <- struct{}{}:
	default:
	}
}

// stop ends the checks and waits for the one running.
func (m *monitor) stop() {
	m.stopOnce.Do(func() { close(m.done) })
	<-m.stopped
}

// node is one server of the deployment, as the start check sees it.
type node = backend.Node

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
	unchecked, err := findings(ctx, nodes, c)
	if ue := (*unreachableError)(nil); errors.As(err, &ue) {
		return ue.err
	}
	if err != nil {
		return err
	}
	if len(unchecked) > 0 {
		c.log().Warn("redisstore: cannot check the server (INFO and CONFIG GET refused); make sure it is Redis 7.0 or later, or Valkey, with maxmemory-policy noeviction",
			"unchecked", strings.Join(unchecked, ", "))
	}
	return nil
}

// log returns the logger of WithLogger, or slog.Default().
func (c *config) log() *slog.Logger {
	if c.logger != nil {
		return c.logger
	}
	return slog.Default()
}

// unreachableError is the error of findings when it cannot talk to a
// node: not a finding about the server's configuration.
type unreachableError struct{ err error }

func (e *unreachableError) Error() string { return e.err.Error() }
func (e *unreachableError) Unwrap() error { return e.err }

// findings runs the checks of checkServer on nodes and returns what could
// not be read, or the first node that fails them (*VersionError,
// *WaitAOFError, *EvictionError), or an *unreachableError.
func findings(ctx context.Context, nodes []node, c *config) (unchecked []string, err error) {
	for _, n := range nodes {
		f, err := inspect(ctx, n)
		if err != nil {
			return nil, &unreachableError{fmt.Errorf("redisstore: cannot check %s at start: %w", n.Addr(), err)}
		}
		version, policy := f["redis_version"], f["maxmemory_policy"]
		if version == "" {
			unchecked = append(unchecked, n.Addr()+" version")
		} else if err := checkVersion(n.Addr(), version, c); err != nil {
			return nil, err
		}
		if c.wait != nil && c.wait.AOF && version != "" {
			r, err := checkWaitAOF(ctx, n, f, c.prefix)
			switch {
			case err != nil:
				return nil, &unreachableError{fmt.Errorf("redisstore: cannot check WAITAOF on %s at start: %w", n.Addr(), err)}
			case r.Early:
				return nil, &WaitAOFError{Addr: n.Addr(), Server: r.Server, Reason: r.Reason()}
			case r.Unknown != "":
				unchecked = append(unchecked, n.Addr()+" WAITAOF ("+r.Unknown+"; with appendfsync everysec "+r.Server+" may count writes as fsynced before they are)")
			}
		}
		switch policy {
		case "noeviction":
		case "":
			unchecked = append(unchecked, n.Addr()+" maxmemory-policy")
		default:
			if !c.allowEviction {
				return nil, &EvictionError{Addr: n.Addr(), Policy: policy}
			}
		}
	}
	return unchecked, nil
}

func checkVersion(addr, version string, c *config) error {
	v, ok := redisinfo.ParseVersion(version)
	switch {
	case !ok:
		return nil // an unusual build; the scripts will tell
	case !v.AtLeast(7, 0):
		return &VersionError{Addr: addr, Version: version, Need: "7.0", Reason: "redisstore"}
	case c.wait != nil && c.wait.AOF && !v.AtLeast(7, 2):
		return &VersionError{Addr: addr, Version: version, Need: "7.2", Reason: "WithWaitAOF (WAITAOF)"}
	}
	return nil
}

// inspect returns a node's INFO fields; where the server refuses INFO,
// only maxmemory_policy, from CONFIG GET ("" if refused too). Only a
// failure to talk to the server is an error.
func inspect(ctx context.Context, n node) (map[string]string, error) {
	info, err := n.Info(ctx)
	if err == nil {
		return redisinfo.Parse(info), nil
	}
	if !isReplyError(err) {
		return nil, err
	}
	policy, err := n.ConfigGet(ctx, "maxmemory-policy")
	if err != nil && !isReplyError(err) {
		return nil, err
	}
	return map[string]string{"maxmemory_policy": policy}, nil
}

// isReplyError reports whether err is an error reply of the server (such as
// NOPERM or an unknown command), not a failure to reach it.
func isReplyError(err error) bool {
	_, ok := backend.ServerError(err)
	return ok
}
