package rueidis

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/idemgo/idem/redisstore/internal/backend"
	"github.com/redis/rueidis"
)

// node is a node reached through a rueidis client.
type node struct {
	a string
	c rueidis.Client
}

func (n node) Addr() string { return n.a }

func (n node) Info(ctx context.Context) (string, error) {
	return n.c.Do(ctx, n.c.B().Info().Build()).ToString()
}

func (n node) ConfigGet(ctx context.Context, name string) (string, error) {
	m, err := n.c.Do(ctx, n.c.B().ConfigGet().Parameter(name).Build()).AsStrMap()
	return m[name], err
}

func (n node) SetWaitAOF(ctx context.Context, key string, timeout time.Duration) (int64, error) {
	var local int64
	// On one connection: WAITAOF counts the writes of its own.
	err := n.c.Dedicated(func(dc rueidis.DedicatedClient) error {
		rs := dc.DoMulti(ctx,
			dc.B().Set().Key(key).Value("idem").Ex(10*time.Second).Build(),
			dc.B().Waitaof().Numlocal(1).Numreplicas(0).Timeout(timeout.Milliseconds()).Build())
		for _, r := range rs {
			if err := r.Error(); err != nil {
				return err
			}
		}
		v, err := rs[1].ToAny()
		if err != nil {
			return err
		}
		local, err = backend.WaitAOFLocal(v)
		return err
	})
	return local, err
}

func (n node) Exists(ctx context.Context, key string) error {
	return n.c.Do(ctx, n.c.B().Exists().Key(key).Build()).Error()
}

func (n node) Del(ctx context.Context, key string) error {
	return n.c.Do(ctx, n.c.B().Del().Key(key).Build()).Error()
}

// functions is a backend.FunctionNode on a rueidis client of one server.
type functions struct{ c rueidis.Client }

func (n functions) FunctionLoad(ctx context.Context, code string, replace bool) error {
	if replace {
		return n.c.Do(ctx, n.c.B().FunctionLoad().Replace().FunctionCode(code).Build()).Error()
	}
	return n.c.Do(ctx, n.c.B().FunctionLoad().FunctionCode(code).Build()).Error()
}

func (n functions) LibraryCode(ctx context.Context, name string) (string, bool, error) {
	arr, err := n.c.Do(ctx, n.c.B().FunctionList().Libraryname(name).Withcode().Build()).ToArray()
	if err != nil {
		return "", false, err
	}
	for _, l := range arr {
		m, err := l.AsMap()
		if err != nil {
			return "", false, err
		}
		if v := m["library_name"]; !v.IsString() {
			continue
		} else if got, _ := v.ToString(); got != name {
			continue
		}
		c := m["library_code"]
		code, err := c.ToString()
		return code, err == nil, err
	}
	return "", false, nil
}

// Load implements backend.Backend.
func (b *Client) Load(ctx context.Context, lib *backend.Library) error {
	if b.c.Mode() != rueidis.ClientModeCluster {
		return backend.LoadOn(ctx, functions{b.c}, lib)
	}
	// Nodes lists replicas too: they refuse the write and get the library
	// from their primary.
	var errs []error
	loaded := false
	for _, n := range b.c.Nodes() {
		err := backend.LoadOn(ctx, functions{n}, lib)
		switch {
		case err == nil:
			loaded = true
		case !backend.ServerErrorHas(err, "READONLY"):
			errs = append(errs, err)
		}
	}
	if !loaded && len(errs) == 0 {
		return errors.New("no primary answered")
	}
	return errors.Join(errs...)
}

// Libraries implements backend.Backend.
func (b *Client) Libraries(ctx context.Context) ([]string, error) {
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

// scanCount is the COUNT hint of each SCAN call.
const scanCount = 1000

// Scan implements backend.Backend.
func (b *Client) Scan(ctx context.Context, match string, fn func(string) bool) error {
	// Nodes is the one node of a standalone client, and every node of a
	// Cluster that the client knows, replicas included: their keys repeat
	// their primary's, which redisstore's List skips.
	nodes := b.c.Nodes()
	addrs := make([]string, 0, len(nodes))
	for addr := range nodes {
		addrs = append(addrs, addr)
	}
	slices.Sort(addrs)
	for _, addr := range addrs {
		c := nodes[addr]
		var cursor uint64
		for {
			e, err := c.Do(ctx, c.B().Scan().Cursor(cursor).Match(match).Count(scanCount).Type("string").Build()).AsScanEntry()
			if err != nil {
				return fmt.Errorf("%s: %w", addr, err)
			}
			for _, k := range e.Elements {
				if !fn(k) {
					return nil
				}
			}
			if e.Cursor == 0 {
				break
			}
			cursor = e.Cursor
		}
	}
	return nil
}

// RunMulti implements backend.Backend: the calls in one pipeline
// (pipelineScripts). (rueidis's Lua.ExecMulti would send SCRIPT LOAD to
// every node first, a round trip more for each batch.)
func (b *Client) RunMulti(ctx context.Context, s *backend.Script, calls []backend.Call, fcall bool) ([]any, []error) {
	results := pipelineScripts(ctx, b.c, len(calls), func(i int) (*backend.Script, []string, []string) {
		return s, calls[i].Keys, calls[i].Args
	}, fcall)
	replies := make([]any, len(calls))
	errs := make([]error, len(calls))
	for i, r := range results {
		replies[i], _, errs[i] = normalize(r)
	}
	return replies, errs
}

// pipelineScripts sends n script calls (call(i) gives each) with one
// DoMulti: EVALSHA, then EVAL, in one more DoMulti, for those answered
// NOSCRIPT; or FCALL in Functions mode.
func pipelineScripts(ctx context.Context, c rueidis.Client, n int, call func(i int) (s *backend.Script, keys, args []string), fcall bool) []rueidis.RedisResult {
	how := backend.FirstCall(fcall)
	cmds := make(rueidis.Commands, n)
	for i := range n {
		s, keys, args := call(i)
		cmds[i] = scriptCmd(c, s, keys, args, how)
	}
	results := c.DoMulti(ctx, cmds...)
	var again []int
	for i, r := range results {
		if how == backend.BySHA && noScript(r.Error()) {
			again = append(again, i)
		}
	}
	if len(again) == 0 {
		return results
	}
	// A new slice: after an error rueidis's writer may still read the old.
	cmds = make(rueidis.Commands, len(again))
	for k, i := range again {
		s, keys, args := call(i)
		cmds[k] = scriptCmd(c, s, keys, args, backend.BySource)
	}
	for k, r := range c.DoMulti(ctx, cmds...) {
		results[again[k]] = r
	}
	return results
}
