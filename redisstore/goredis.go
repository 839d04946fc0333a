package redisstore

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"slices"
	"strings"
	"sync"
	"unsafe"

	"github.com/redis/go-redis/v9"
)

// goRedis is the backend for a go-redis *redis.Client. Its watches share
// one subscriber connection (hub).
type goRedis struct {
	c     *redis.Client
	hub   *hub
	calls *coalescer
}

func newGoRedis(c *redis.Client) *goRedis {
	b := &goRedis{c: c, hub: &hub{open: openGoRedis(c)}}
	b.calls = &coalescer{senders: coalesceSenders, one: b.callOne, many: b.callMany}
	return b
}

func (b *goRedis) callOne(ctx context.Context, s *script, keys, args []string, fcall bool) (any, error) {
	return callGoRedis(ctx, b.c, s, keys, args, fcall)
}

// callMany sends calls as one pipeline (pipelineScripts). A store's calls
// are all in Functions mode or none.
func (b *goRedis) callMany(ctx context.Context, calls []*queuedCall) {
	cmds := pipelineScripts(ctx, b.c, len(calls), func(i int) (*script, []string, []string) {
		return calls[i].s, calls[i].keys, calls[i].args
	}, calls[0].fcall)
	for i, c := range calls {
		c.reply, c.err = cmds[i].Result()
	}
}

func (b *goRedis) run(ctx context.Context, s *script, keys, args []string, w *waitConfig, fcall bool) (any, int64, error) {
	if w == nil {
		v, err := b.calls.run(ctx, s, keys, args, fcall)
		return v, 0, err
	}
	return runWait(ctx, b.c, s, keys, args, w, fcall)
}

// callGoRedis runs s once: FCALL (FCALL_RO) in Functions mode, otherwise
// EVALSHA falling back to EVAL.
func callGoRedis(ctx context.Context, c redis.UniversalClient, s *script, keys, args []string, fcall bool) (any, error) {
	how := firstCall(fcall)
	cmd := scriptCmd(ctx, s, keys, args, how)
	_ = c.Process(ctx, cmd)
	if how == bySHA && noScript(cmd.Err()) {
		cmd = scriptCmd(ctx, s, keys, args, bySource)
		_ = c.Process(ctx, cmd)
	}
	return cmd.Result()
}

// scriptCall is how a script is named in its call.
type scriptCall int

const (
	bySHA      scriptCall = iota // EVALSHA
	bySource                     // EVAL, after NOSCRIPT
	byFunction                   // FCALL, or FCALL_RO for a script that writes nothing
)

// firstCall is how a store calls a script first: by its function in
// Functions mode, otherwise by its SHA (bySource follows a NOSCRIPT).
func firstCall(fcall bool) scriptCall {
	if fcall {
		return byFunction
	}
	return bySHA
}

// scriptCmd returns the go-redis command that calls s with keys and args,
// unsent. go-redis's own script calls take ...any: each string was boxed
// (an allocation each), then copied into the command's arguments with the
// keys boxed again, 22 allocations per lifecycle. scriptCmd allocates the
// arguments' slice and the command; each argument is a string that refers
// to the caller's (stringRef), so the caller must not change keys or args
// until the command has been sent.
func scriptCmd(ctx context.Context, s *script, keys, args []string, how scriptCall) *redis.Cmd {
	a := make([]any, 3+len(keys)+len(args))
	switch {
	case how == byFunction && s.ro:
		a[0], a[1] = "fcall_ro", stringRef(&s.fn)
	case how == byFunction:
		a[0], a[1] = "fcall", stringRef(&s.fn)
	case how == bySource:
		a[0], a[1] = "eval", stringRef(&s.src)
	default:
		a[0], a[1] = "evalsha", stringRef(&s.sha)
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

func (b *goRedis) del(ctx context.Context, key, pub, channel string) error {
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

func (b *goRedis) publishCommand() string { return "PUBLISH" }

func (b *goRedis) watch(ctx context.Context, channel string) (<-chan struct{}, func(), error) {
	return b.hub.watch(ctx, channel)
}

func (b *goRedis) nodes(context.Context) ([]node, error) { return []node{goRedisNode{b.c}}, nil }

// goRedisCluster is the backend for a go-redis *redis.ClusterClient.
type goRedisCluster struct{ c *redis.ClusterClient }

func (b *goRedisCluster) run(ctx context.Context, s *script, keys, args []string, w *waitConfig, fcall bool) (any, int64, error) {
	v, acks, err := b.runOnce(ctx, s, keys, args, w, fcall)
	if unreachable(err) {
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

// unreachable reports whether err says a node could not be reached or
// dropped the connection, rather than answered.
func unreachable(err error) bool {
	var op *net.OpError
	return err != nil && (errors.As(err, &op) || errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF))
}

func (b *goRedisCluster) runOnce(ctx context.Context, s *script, keys, args []string, w *waitConfig, fcall bool) (any, int64, error) {
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

func (b *goRedisCluster) del(ctx context.Context, key, pub, channel string) error {
	return delGoRedis(ctx, b.c, key, pub, channel)
}

func (b *goRedisCluster) publishCommand() string { return "SPUBLISH" }

func (b *goRedisCluster) watch(ctx context.Context, channel string) (<-chan struct{}, func(), error) {
	return watchPubSub(ctx, b.c.SSubscribe(ctx, channel))
}

func (b *goRedisCluster) nodes(ctx context.Context) ([]node, error) {
	var mu sync.Mutex
	var out []node
	err := b.c.ForEachShard(ctx, func(_ context.Context, c *redis.Client) error {
		mu.Lock()
		out = append(out, goRedisNode{c})
		mu.Unlock()
		return nil
	})
	slices.SortFunc(out, func(a, b node) int { return strings.Compare(a.addr(), b.addr()) })
	return out, err
}

// runWait sends EVALSHA (EVAL after NOSCRIPT), or FCALL in Functions mode,
// and WAIT or WAITAOF in one pipeline, which go-redis sends on one
// connection.
func runWait(ctx context.Context, c *redis.Client, s *script, keys, args []string, w *waitConfig, fcall bool) (any, int64, error) {
	for how := firstCall(fcall); ; how = bySource {
		eval := scriptCmd(ctx, s, keys, args, how)
		var wait redis.Cmder
		_, err := c.Pipelined(ctx, func(p redis.Pipeliner) error {
			_ = p.Process(ctx, eval)
			if w.aof {
				wait = p.Do(ctx, "WAITAOF", w.local, w.replicas, w.timeoutArg)
			} else {
				wait = p.Do(ctx, "WAIT", w.replicas, w.timeoutArg)
			}
			return nil
		})
		if how == bySHA && noScript(eval.Err()) {
			continue
		}
		if err := eval.Err(); err != nil {
			return nil, 0, err
		}
		if err != nil {
			return eval.Val(), 0, fmt.Errorf("%s: %w", waitName(w), err)
		}
		acks, err := parseAcks(wait.(*redis.Cmd).Val(), w)
		return eval.Val(), acks, err
	}
}

func waitName(w *waitConfig) string {
	if w.aof {
		return "WAITAOF"
	}
	return "WAIT"
}

// parseAcks returns the replicas that acknowledged: WAIT replies with a
// number, WAITAOF with {local fsyncs, replica fsyncs}. A missing local fsync
// counts as no acknowledgement at all.
func parseAcks(v any, w *waitConfig) (int64, error) {
	if !w.aof {
		n, ok := asInt(v)
		if !ok {
			return 0, replyError("WAIT", v)
		}
		return n, nil
	}
	arr, ok := v.([]any)
	if !ok || len(arr) != 2 {
		return 0, replyError("WAITAOF", v)
	}
	local, ok1 := asInt(arr[0])
	replicas, ok2 := asInt(arr[1])
	if !ok1 || !ok2 {
		return 0, replyError("WAITAOF", v)
	}
	if local < int64(w.local) {
		return -1, nil
	}
	return replicas, nil
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
