// Package storescripts finds the Lua scripts that redisstore sends for an
// acquire and a complete, so that benchmarks run exactly the store's
// scripts without reading its files: internal/benchcmd's redis-benchmark
// ceilings and internal/httpbench's script floor.
package storescripts

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"time"

	"github.com/idemgo/idem"
	"github.com/idemgo/idem/redisstore"
	"github.com/idemgo/idem/storekit"
	"github.com/redis/go-redis/v9"
)

// Capture runs one acquire and one complete through a go-redis store on the
// server at addr, on an empty script cache (SCRIPT FLUSH), and returns the
// SHA1 digests the store sends with EVALSHA. Both scripts are loaded on the
// server when it returns, each checked to have the digest the store sends;
// the record it made is deleted.
func Capture(ctx context.Context, addr string) (acquire, complete string, err error) {
	hook := &capture{}
	c := redis.NewClient(&redis.Options{Addr: addr, PoolSize: 1})
	defer c.Close()
	c.AddHook(hook)
	s, err := redisstore.New(c, redisstore.WithReplayCache(false))
	if err != nil {
		return "", "", err
	}
	defer s.Close()
	if err := c.ScriptFlush(ctx).Err(); err != nil {
		return "", "", err
	}
	load := func(what string) (string, error) {
		sha, src := hook.take()
		if sha == "" {
			return "", fmt.Errorf("storescripts: no EVALSHA seen for %s", what)
		}
		if src != "" {
			loaded, err := c.ScriptLoad(ctx, src).Result()
			if err != nil {
				return "", err
			}
			if loaded != sha {
				return "", fmt.Errorf("storescripts: SCRIPT LOAD of %s returned %s, the store sends %s", what, loaded, sha)
			}
		}
		return sha, nil
	}
	key := idem.Key{Scope: "storescripts", ID: "probe"}.Digest()
	a, err := s.Acquire(ctx, key, storekit.AcquireRequest{Fingerprint: "fp", Owner: "probe", Lease: time.Minute, Retention: time.Minute})
	if err != nil {
		return "", "", err
	}
	if acquire, err = load("acquire"); err != nil {
		return "", "", err
	}
	if err := s.Complete(ctx, key, a.Lease, []byte{0}, time.Minute); err != nil {
		return "", "", err
	}
	if complete, err = load("complete"); err != nil {
		return "", "", err
	}
	return acquire, complete, s.Delete(ctx, key)
}

// capture is a go-redis hook that records the EVALSHA digest and the EVAL
// source of the last script call.
type capture struct {
	mu  sync.Mutex
	sha string // of the last EVALSHA
	src string // of the last EVAL
}

func (h *capture) DialHook(next redis.DialHook) redis.DialHook { return next }

func (h *capture) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		for _, cmd := range cmds {
			h.record(cmd)
		}
		return next(ctx, cmds)
	}
}

func (h *capture) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		h.record(cmd)
		return next(ctx, cmd)
	}
}

func (h *capture) record(cmd redis.Cmder) {
	args := cmd.Args()
	if len(args) < 2 {
		return
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	switch strings.ToLower(cmd.Name()) {
	case "evalsha":
		h.sha, _ = args[1].(string)
	case "eval":
		h.src, _ = args[1].(string)
	}
}

// take returns what was captured since the last take and forgets it.
func (h *capture) take() (sha, src string) {
	h.mu.Lock()
	defer h.mu.Unlock()
	sha, src = h.sha, h.src
	h.sha, h.src = "", ""
	return sha, src
}
