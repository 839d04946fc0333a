// Package goredis is redisstore's backend on go-redis: a *redis.Client
// (standalone, Sentinel failover client) or a *redis.ClusterClient. It
// holds everything the store does with go-redis: script calls with their
// NOSCRIPT fallback, pipelines, the coalescer's calls, WAIT, SCAN,
// Functions loading, the subscriber connections, and the replay cache
// (tracking.go).
package goredis

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"unsafe"

	"github.com/idemgo/idem/redisstore/internal/backend"
	"github.com/redis/go-redis/v9"
)

// Client is the backend for a go-redis *redis.Client. Its watches share
// one subscriber connection (the store's hub, on Subscriber).
type Client struct {
	c     *redis.Client
	calls *backend.Coalescer
}

// New returns the backend of c.
func New(c *redis.Client) *Client {
	b := &Client{c: c}
	b.calls = &backend.Coalescer{Senders: backend.CoalesceSenders, One: b.callOne, Many: b.callMany}
	return b
}

// Queued returns the number of calls the coalescer queued (tests).
func (b *Client) Queued() int { return b.calls.Queued() }

func init() { backend.RegisterServerError(ServerError) }

// ServerError returns the message of an error reply of the server (without
// the ERR code), and whether err is one.
func ServerError(err error) (string, bool) {
	var ge redis.Error
	if errors.As(err, &ge) {
		return strings.TrimPrefix(ge.Error(), "ERR "), true
	}
	return "", false
}

func (b *Client) callOne(ctx context.Context, s *backend.Script, keys, args []string, fcall bool) (any, error) {
	return callGoRedis(ctx, b.c, s, keys, args, fcall)
}

// callMany sends calls as one pipeline (pipelineScripts). A store's calls
// are all in Functions mode or none.
func (b *Client) callMany(ctx context.Context, calls []*backend.QueuedCall) {
	cmds := pipelineScripts(ctx, b.c, len(calls), func(i int) (*backend.Script, []string, []string) {
		return calls[i].S, calls[i].Keys, calls[i].Args
	}, calls[0].Fcall)
	for i, c := range calls {
		c.Reply, c.Err = cmds[i].Result()
	}
}

// Run implements backend.Backend.
func (b *Client) Run(ctx context.Context, s *backend.Script, keys, args []string, w *backend.Wait, fcall bool) (any, int64, error) {
	if w == nil {
		v, err := b.calls.Run(ctx, s, keys, args, fcall)
		return v, 0, err
	}
	return runWait(ctx, b.c, s, keys, args, w, fcall)
}

// callGoRedis runs s once: FCALL (FCALL_RO) in Functions mode, otherwise
// EVALSHA falling back to EVAL. Not redis.Script.Run: it takes its
// arguments as ...any, boxing each one (the allocations scriptCmd avoids),
// and has no FCALL nor a form for the pipelines below.
func callGoRedis(ctx context.Context, c redis.UniversalClient, s *backend.Script, keys, args []string, fcall bool) (any, error) {
	how := backend.FirstCall(fcall)
	cmd := scriptCmd(ctx, s, keys, args, how)
	_ = c.Process(ctx, cmd)
	if how == backend.BySHA && noScript(cmd.Err()) {
		cmd = scriptCmd(ctx, s, keys, args, backend.BySource)
		_ = c.Process(ctx, cmd)
	}
	return cmd.Result()
}

// scriptCmd returns the go-redis command that calls s with keys and args,
// unsent. go-redis's own script calls take ...any: each string was boxed
// (an allocation each), then copied into the command's arguments with the
// keys boxed again, 22 allocations per lifecycle. scriptCmd allocates the
// arguments' slice and the command; each argument is a string that refers
// to the caller's (stringRef), so the caller must not change keys or args
// until the command has been sent.
func scriptCmd(ctx context.Context, s *backend.Script, keys, args []string, how backend.How) *redis.Cmd {
	a := make([]any, 3+len(keys)+len(args))
	switch {
	case how == backend.ByFunction && s.RO:
		a[0], a[1] = "fcall_ro", stringRef(&s.Fn)
	case how == backend.ByFunction:
		a[0], a[1] = "fcall", stringRef(&s.Fn)
	case how == backend.BySource:
		a[0], a[1] = "eval", stringRef(&s.Src)
	default:
		a[0], a[1] = "evalsha", stringRef(&s.SHA)
	}
	a[2] = len(keys)
	for i := range keys {
		a[3+i] = stringRef(&keys[i])
	}
	for i := range args {
		a[3+len(keys)+i] = stringRef(&args[i])
	}
	cmd := redis.NewCmd(ctx, a...)
	if len(keys) > 0 {
		cmd.SetFirstKeyPos(3)
	}
	return cmd
}

// stringRef returns the string *p as an interface value that points at *p
// itself. Converting a string to an interface allocates a copy of its
// header for the value to point at; this is the same value without the
// copy. Hooks, tracing and go-redis see a string: a *string would be
// written to Redis the same, but printed as an address by cmd.String()
// and by tracing, and refused by hooks that expect strings.
func stringRef(p *string) any {
	v := any("") // the type word of a string; a constant does not allocate
	(*eface)(unsafe.Pointer(&v)).data = unsafe.Pointer(p)
	return v
}

// eface is the layout of an interface value with no methods: its dynamic
// type, and a pointer to its value (the runtime's eface, which reflect
// relies on too). TestScriptCmd checks that what stringRef returns is the
// string.
type eface struct{ typ, data unsafe.Pointer }

// noScript reports whether err is Redis's NOSCRIPT: the script is not in
// the server's cache (a restart, SCRIPT FLUSH, a new node).
func noScript(err error) bool {
	// HasErrorPrefix allocates (errors.As): ask it only on an error.
	return err != nil && redis.HasErrorPrefix(err, "NOSCRIPT")
}

// Del implements backend.Backend.
func (b *Client) Del(ctx context.Context, key, pub, channel string) error {
	return delGoRedis(ctx, b.c, key, pub, channel)
}

// delGoRedis sends DEL key, and pub on channel unless pub is "", in one
// pipeline.
func delGoRedis(ctx context.Context, c redis.UniversalClient, key, pub, channel string) error {
	if pub == "" {
		return c.Del(ctx, key).Err()
	}
	var del *redis.IntCmd
	_, _ = c.Pipelined(ctx, func(p redis.Pipeliner) error {
		del = p.Del(ctx, key)
		if pub == "SPUBLISH" {
			p.SPublish(ctx, channel, "d")
		} else {
			p.Publish(ctx, channel, "d")
		}
		return nil
	})
	return del.Err()
}

// Cluster implements backend.Backend.
func (b *Client) Cluster() bool { return false }

// Subscriber implements backend.Backend: the store's hub shares one
// connection.
func (b *Client) Subscriber() backend.Opener { return openTransport(b.c) }

// Watch implements backend.Backend: a connection of its own, as a Cluster
// client's watches have (the store uses its hub instead).
func (b *Client) Watch(ctx context.Context, channel string) (<-chan struct{}, func(), error) {
	return watchPubSub(ctx, b.c.Subscribe(ctx, channel))
}

// Nodes implements backend.Backend.
func (b *Client) Nodes(context.Context) ([]backend.Node, error) {
	return []backend.Node{Node{b.c}}, nil
}

// ClusterClient is the backend for a go-redis *redis.ClusterClient.
type ClusterClient struct{ c *redis.ClusterClient }

// NewCluster returns the backend of c.
func NewCluster(c *redis.ClusterClient) *ClusterClient { return &ClusterClient{c: c} }

// Run implements backend.Backend.
func (b *ClusterClient) Run(ctx context.Context, s *backend.Script, keys, args []string, w *backend.Wait, fcall bool) (any, int64, error) {
	v, acks, err := b.runOnce(ctx, s, keys, args, w, fcall)
	if backend.Unreachable(err) {
		// go-redis reloads its slot map on MOVED and every
		// ClusterStateReloadInterval (60s by default), not when a node
		// stops answering: after a master is killed, the keys of its
		// slots would fail until then although a replica took them over
		// within seconds (RELIABILITY.md, Cluster failover). Ask for a
		// reload; go-redis runs one at a time, in the background.
		b.c.ReloadState(ctx)
	}
	return v, acks, err
}

func (b *ClusterClient) runOnce(ctx context.Context, s *backend.Script, keys, args []string, w *backend.Wait, fcall bool) (any, int64, error) {
	if w == nil {
		v, err := callGoRedis(ctx, b.c, s, keys, args, fcall)
		return v, 0, err
	}
	// WAIT has no key: send it on a connection to the key's primary.
	node, err := b.c.MasterForKey(ctx, keys[0])
	if err != nil {
		return nil, 0, err
	}
	return runWait(ctx, node, s, keys, args, w, fcall)
}

// Del implements backend.Backend.
func (b *ClusterClient) Del(ctx context.Context, key, pub, channel string) error {
	return delGoRedis(ctx, b.c, key, pub, channel)
}

// Cluster implements backend.Backend.
func (b *ClusterClient) Cluster() bool { return true }

// Subscriber implements backend.Backend: each watch has its own
// connection, to the node of its channel's slot.
func (b *ClusterClient) Subscriber() backend.Opener { return nil }

// Watch implements backend.Backend.
func (b *ClusterClient) Watch(ctx context.Context, channel string) (<-chan struct{}, func(), error) {
	return watchPubSub(ctx, b.c.SSubscribe(ctx, channel))
}

// Nodes implements backend.Backend.
func (b *ClusterClient) Nodes(ctx context.Context) ([]backend.Node, error) {
	var mu sync.Mutex
	var out []backend.Node
	err := b.c.ForEachShard(ctx, func(_ context.Context, c *redis.Client) error {
		mu.Lock()
		out = append(out, Node{c})
		mu.Unlock()
		return nil
	})
	slices.SortFunc(out, func(a, b backend.Node) int { return strings.Compare(a.Addr(), b.Addr()) })
	return out, err
}

// runWait sends EVALSHA (EVAL after NOSCRIPT), or FCALL in Functions mode,
// and WAIT or WAITAOF in one pipeline, which go-redis sends on one
// connection.
func runWait(ctx context.Context, c *redis.Client, s *backend.Script, keys, args []string, w *backend.Wait, fcall bool) (any, int64, error) {
	for how := backend.FirstCall(fcall); ; how = backend.BySource {
		eval := scriptCmd(ctx, s, keys, args, how)
		var wait redis.Cmder
		_, err := c.Pipelined(ctx, func(p redis.Pipeliner) error {
			_ = p.Process(ctx, eval)
			if w.AOF {
				wait = p.Do(ctx, "WAITAOF", w.Local, w.Replicas, w.TimeoutArg)
			} else {
				wait = p.Do(ctx, "WAIT", w.Replicas, w.TimeoutArg)
			}
			return nil
		})
		if how == backend.BySHA && noScript(eval.Err()) {
			continue
		}
		if err := eval.Err(); err != nil {
			return nil, 0, err
		}
		if err != nil {
			return eval.Val(), 0, fmt.Errorf("%s: %w", w.Name(), err)
		}
		acks, err := backend.ParseAcks(wait.(*redis.Cmd).Val(), w)
		return eval.Val(), acks, err
	}
}

// watchPubSub waits for the subscription's confirmation, then closes the
// returned channel on the first message.
func watchPubSub(ctx context.Context, ps *redis.PubSub) (<-chan struct{}, func(), error) {
	if _, err := ps.Receive(ctx); err != nil {
		ps.Close()
		return nil, nil, err
	}
	changed := make(chan struct{})
	done := make(chan struct{})
	go func() {
		defer close(done)
		for {
			msg, err := ps.Receive(context.Background())
			if err != nil {
				if errors.Is(err, redis.ErrClosed) {
					return
				}
				// The connection broke: wake the waiter so it re-reads the
				// record and watches again.
				close(changed)
				return
			}
			if _, ok := msg.(*redis.Message); ok {
				close(changed)
				return
			}
		}
	}()
	stop := func() {
		ps.Close()
		<-done
	}
	return changed, stop, nil
}
