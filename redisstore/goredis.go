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
	"time"
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
	return &goRedis{c: c, hub: &hub{open: openGoRedis(c)}, calls: &coalescer{c: c, senders: coalesceSenders}}
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

// coalescer sends the script calls of a store on a go-redis *redis.Client
// the way rueidis does, in pipelines, but only when callers are already
// waiting: a call made while fewer than its senders are busy goes out at
// once, alone, as a plain call (a lone caller waits for nothing); a call
// made while every sender is busy is queued, and the first sender to
// finish sends every queued call as one pipeline, then the calls queued
// meanwhile, until none is left. A pipeline costs a write and a read on
// each side instead of one per call: at 64 callers, go-redis spent most of
// a lifecycle in those system calls.
//
// A queued call waits at most maxQueueWait: if no call in flight returned
// by then, the queue is sent at once by one more sender. One timer per
// queue, armed when the queue's first call comes and stopped when a sender
// takes the queue, bounds that wait for all of its calls: a timer per call
// cost the client as much CPU as a system call per call.
//
// go-redis v9.23's own AutoPipeline (experimental) does the same with one
// batch in flight; in place of the coalescer it measured slower, in
// BenchmarkLifecycle/go-redis (3 interleaved rounds, 100,000 lifecycles
// each): 47–53 µs/op at 64 callers against 56–66 (half duplex) and 53–60
// (full duplex), and 334–380 µs/op at 1 caller against 460–489.
//
// A queued call whose context ends returns the context's error; if it was
// sent already, its outcome is unknown, as for any call whose reply did not
// come back in time. A queued call whose context ended before its pipeline
// was sent is not sent.
type coalescer struct {
	c       *redis.Client
	senders int

	mu       sync.Mutex
	active   int
	queue    []*queuedCall
	queuedAt time.Time   // when the queue's first call came
	late     *time.Timer // sendLate, maxQueueWait after queuedAt
}

type queuedCall struct {
	ctx        context.Context
	s          *script
	keys, args []string
	fcall      bool
	reply      any
	err        error
	done       chan struct{}
}

// coalesceSenders is the number of calls a store sends at once before it
// queues the next ones.
const coalesceSenders = 2

// maxQueueWait bounds how long a queued call waits for a call in flight to
// return: past it, the queue is sent at once by one more sender, so that a
// slow network or server does not delay every queued call by a whole round
// trip of the calls before it.
var maxQueueWait = 250 * time.Microsecond // a variable for tests

func (q *coalescer) run(ctx context.Context, s *script, keys, args []string, fcall bool) (any, error) {
	q.mu.Lock()
	if q.active < q.senders {
		q.active++
		q.mu.Unlock()
		v, err := callGoRedis(ctx, q.c, s, keys, args, fcall)
		q.drain()
		return v, err
	}
	call := &queuedCall{ctx: ctx, s: s, keys: keys, args: args, fcall: fcall, done: make(chan struct{})}
	if len(q.queue) == 0 {
		q.queuedAt = time.Now()
		q.armLate(maxQueueWait)
	}
	q.queue = append(q.queue, call)
	q.mu.Unlock()
	select {
	case <-call.done:
		return call.reply, call.err
	case <-ctx.Done():
		return nil, ctx.Err()
	}
}

// armLate starts the queue's timer, to run sendLate after d; q.mu is held.
func (q *coalescer) armLate(d time.Duration) {
	if q.late == nil {
		q.late = time.AfterFunc(d, q.sendLate)
		return
	}
	q.late.Reset(d)
}

// sendLate runs when the queue's timer fires: if the queue's first call
// has waited maxQueueWait, the calls in flight are slow (a slow network, a
// busy server); the queue is sent now, as one more sender, instead of
// after them. A timer that fires for a queue taken meanwhile finds the
// queue empty, or younger than maxQueueWait and is armed again for it.
func (q *coalescer) sendLate() {
	q.mu.Lock()
	if len(q.queue) == 0 {
		q.mu.Unlock()
		return
	}
	if wait := maxQueueWait - time.Since(q.queuedAt); wait > 0 {
		q.armLate(wait)
		q.mu.Unlock()
		return
	}
	batch := q.take()
	q.active++
	q.mu.Unlock()
	q.send(batch)
	q.drain()
}

// take empties the queue and returns its calls; q.mu is held.
func (q *coalescer) take() []*queuedCall {
	batch := q.queue
	if len(batch) == 0 {
		return nil
	}
	q.queue = nil
	q.late.Stop()
	return batch
}

// drain sends the queued calls until none is left, then frees the
// caller's sender slot.
func (q *coalescer) drain() {
	for {
		q.mu.Lock()
		batch := q.take()
		if len(batch) == 0 {
			q.active--
			q.mu.Unlock()
			return
		}
		q.mu.Unlock()
		q.send(batch)
	}
}

// send sends batch as one pipeline (pipelineScripts) and wakes each call.
// A store's calls are all in Functions mode or none.
func (q *coalescer) send(batch []*queuedCall) {
	ctx := context.Background() // the client's read and write timeouts apply
	live := batch[:0:0]
	for _, c := range batch {
		if err := c.ctx.Err(); err != nil {
			c.err = err
			close(c.done)
			continue
		}
		live = append(live, c)
	}
	if len(live) == 0 {
		return
	}
	cmds := pipelineScripts(ctx, q.c, len(live), func(i int) (*script, []string, []string) {
		return live[i].s, live[i].keys, live[i].args
	}, live[0].fcall)
	for i, c := range live {
		c.reply, c.err = cmds[i].Result()
		close(c.done)
	}
}
