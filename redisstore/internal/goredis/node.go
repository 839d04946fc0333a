package goredis

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/idemgo/idem/redisstore/internal/backend"
	"github.com/redis/go-redis/v9"
)

// Node is a node reached through a go-redis client of one server.
type Node struct{ C *redis.Client }

var _ backend.Node = Node{}

// Addr implements backend.Node.
func (n Node) Addr() string { return n.C.Options().Addr }

// Info implements backend.Node.
func (n Node) Info(ctx context.Context) (string, error) { return n.C.Info(ctx).Result() }

// ConfigGet implements backend.Node.
func (n Node) ConfigGet(ctx context.Context, name string) (string, error) {
	m, err := n.C.ConfigGet(ctx, name).Result()
	return m[name], err
}

// SetWaitAOF implements backend.Node.
func (n Node) SetWaitAOF(ctx context.Context, key string, timeout time.Duration) (int64, error) {
	var wait *redis.Cmd
	_, err := n.C.Pipelined(ctx, func(p redis.Pipeliner) error {
		p.Set(ctx, key, "idem", 10*time.Second)
		wait = p.Do(ctx, "WAITAOF", 1, 0, timeout.Milliseconds())
		return nil
	})
	if err != nil {
		return 0, err
	}
	return backend.WaitAOFLocal(wait.Val())
}

// Exists implements backend.Node.
func (n Node) Exists(ctx context.Context, key string) error { return n.C.Exists(ctx, key).Err() }

// Del implements backend.Node.
func (n Node) Del(ctx context.Context, key string) error { return n.C.Del(ctx, key).Err() }

// Functions is a backend.FunctionNode on a go-redis client of one server.
type Functions struct{ C *redis.Client }

// FunctionLoad implements backend.FunctionNode.
func (n Functions) FunctionLoad(ctx context.Context, code string, replace bool) error {
	if replace {
		return n.C.FunctionLoadReplace(ctx, code).Err()
	}
	return n.C.FunctionLoad(ctx, code).Err()
}

// LibraryCode implements backend.FunctionNode.
func (n Functions) LibraryCode(ctx context.Context, name string) (string, bool, error) {
	libs, err := n.C.FunctionList(ctx, redis.FunctionListQuery{LibraryNamePattern: name, WithCode: true}).Result()
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

// Load implements backend.Backend.
func (b *Client) Load(ctx context.Context, lib *backend.Library) error {
	return backend.LoadOn(ctx, Functions{b.c}, lib)
}

// Load implements backend.Backend.
func (b *ClusterClient) Load(ctx context.Context, lib *backend.Library) error {
	return b.c.ForEachMaster(ctx, func(ctx context.Context, c *redis.Client) error {
		return backend.LoadOn(ctx, Functions{c}, lib)
	})
}

func libraries(ctx context.Context, c *redis.Client) ([]string, error) {
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

// Libraries implements backend.Backend.
func (b *Client) Libraries(ctx context.Context) ([]string, error) {
	return libraries(ctx, b.c)
}

// Libraries implements backend.Backend.
func (b *ClusterClient) Libraries(ctx context.Context) ([]string, error) {
	var mu sync.Mutex
	var out []string
	err := b.c.ForEachMaster(ctx, func(ctx context.Context, c *redis.Client) error {
		names, err := libraries(ctx, c)
		mu.Lock()
		out = append(out, names...)
		mu.Unlock()
		return err
	})
	return out, err
}

// scanCount is the COUNT hint of each SCAN call.
const scanCount = 1000

// scanNode runs SCAN MATCH match TYPE string over one node's key space,
// calling fn for each key until fn returns false. It reports whether fn
// asked to stop.
func scanNode(ctx context.Context, c *redis.Client, match string, fn func(string) bool) (stopped bool, err error) {
	var cursor uint64
	for {
		keys, next, err := c.ScanType(ctx, cursor, match, scanCount, "string").Result()
		if err != nil {
			return false, err
		}
		for _, k := range keys {
			if !fn(k) {
				return true, nil
			}
		}
		if next == 0 {
			return false, nil
		}
		cursor = next
	}
}

// Scan implements backend.Backend.
func (b *Client) Scan(ctx context.Context, match string, fn func(string) bool) error {
	_, err := scanNode(ctx, b.c, match, fn)
	return err
}

// Scan implements backend.Backend.
func (b *ClusterClient) Scan(ctx context.Context, match string, fn func(string) bool) error {
	// ForEachMaster calls its function concurrently; collect the primaries
	// and scan them one at a time, in a stable order.
	var mu sync.Mutex
	var masters []*redis.Client
	err := b.c.ForEachMaster(ctx, func(_ context.Context, c *redis.Client) error {
		mu.Lock()
		masters = append(masters, c)
		mu.Unlock()
		return nil
	})
	if err != nil {
		return err
	}
	slices.SortFunc(masters, func(a, b *redis.Client) int { return strings.Compare(a.Options().Addr, b.Options().Addr) })
	for _, c := range masters {
		stopped, err := scanNode(ctx, c, match, fn)
		if err != nil {
			return fmt.Errorf("%s: %w", c.Options().Addr, err)
		}
		if stopped {
			return nil
		}
	}
	return nil
}

// RunMulti implements backend.Backend.
func (b *Client) RunMulti(ctx context.Context, s *backend.Script, calls []backend.Call, fcall bool) ([]any, []error) {
	return pipelineCalls(ctx, b.c, s, calls, fcall)
}

// RunMulti implements backend.Backend.
func (b *ClusterClient) RunMulti(ctx context.Context, s *backend.Script, calls []backend.Call, fcall bool) ([]any, []error) {
	// The cluster client splits the pipeline by node.
	return pipelineCalls(ctx, b.c, s, calls, fcall)
}

// pipelineCalls sends EVALSHA for every call in one pipeline, then EVAL,
// in a second pipeline, for those that got NOSCRIPT; or FCALL for every
// call in Functions mode.
func pipelineCalls(ctx context.Context, c redis.UniversalClient, s *backend.Script, calls []backend.Call, fcall bool) ([]any, []error) {
	cmds := pipelineScripts(ctx, c, len(calls), func(i int) (*backend.Script, []string, []string) {
		return s, calls[i].Keys, calls[i].Args
	}, fcall)
	replies := make([]any, len(calls))
	errs := make([]error, len(calls))
	for i, cmd := range cmds {
		v, err := cmd.Result()
		if errors.Is(err, redis.Nil) {
			v, err = nil, nil
		}
		replies[i], errs[i] = v, err
	}
	return replies, errs
}

// pipelineScripts sends n script calls in one pipeline, call(i) giving the
// script, keys and arguments of the i-th: EVALSHA, then EVAL, in a second
// pipeline, for those that got NOSCRIPT; or FCALL (FCALL_RO for a
// read-only script) in Functions mode. It returns each call's command,
// whose Result is the reply as go-redis gives it.
func pipelineScripts(ctx context.Context, c redis.UniversalClient, n int, call func(i int) (s *backend.Script, keys, args []string), fcall bool) []*redis.Cmd {
	cmds := make([]*redis.Cmd, n)
	how := backend.FirstCall(fcall)
	_, _ = c.Pipelined(ctx, func(p redis.Pipeliner) error {
		for i := range n {
			s, keys, args := call(i)
			cmds[i] = scriptCmd(ctx, s, keys, args, how)
			_ = p.Process(ctx, cmds[i])
		}
		return nil
	})
	var again []int
	for i, cmd := range cmds {
		if how == backend.BySHA && noScript(cmd.Err()) {
			again = append(again, i)
		}
	}
	if len(again) > 0 {
		_, _ = c.Pipelined(ctx, func(p redis.Pipeliner) error {
			for _, i := range again {
				s, keys, args := call(i)
				cmds[i] = scriptCmd(ctx, s, keys, args, backend.BySource)
				_ = p.Process(ctx, cmds[i])
			}
			return nil
		})
	}
	return cmds
}
