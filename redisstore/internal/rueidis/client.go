package rueidis

import (
	"context"
	"errors"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"

	"github.com/idemgo/idem/redisstore/internal/backend"
	"github.com/redis/rueidis"
)

// Client is the backend for a rueidis.Client. On a standalone server its
// watches share one subscriber connection (the store's hub, on
// Subscriber); on a Cluster each watch has its own, to the node of its
// channel's slot.
type Client struct {
	c rueidis.Client
	// calls coalesces the script calls made without WAIT
	// (backend.Coalescer); nil on a Cluster.
	calls *backend.Coalescer
	// read is how replays are read (readProbe, readDoCache or readDo, see
	// cache.go); noCache counts the probes that showed no client-side
	// cache.
	read    atomic.Int32
	noCache atomic.Int32
	// ends dates the replays cached by the client (cache.go).
	ends cacheEnds
}

// New returns the backend of c.
func New(c rueidis.Client) *Client {
	b := &Client{c: c}
	if c.Mode() != rueidis.ClientModeCluster {
		b.read.Store(readDoCache)
		b.calls = &backend.Coalescer{Senders: backend.CoalesceSenders, One: b.callOne, Many: b.callMany, Lone: b.callLone}
	}
	return b
}

// Queued returns the number of calls the coalescer queued (tests).
func (b *Client) Queued() int {
	if b.calls == nil {
		return 0
	}
	return b.calls.Queued()
}

func init() { backend.RegisterServerError(ServerError) }

// ServerError returns the message of an error reply of the server (without
// the ERR code), and whether err is one.
func ServerError(err error) (string, bool) {
	var re *rueidis.RedisError
	if errors.As(err, &re) && !re.IsNil() {
		return strings.TrimPrefix(re.Error(), "ERR "), true
	}
	return "", false
}

// Run implements backend.Backend.
func (b *Client) Run(ctx context.Context, s *backend.Script, keys, args []string, w *backend.Wait, fcall bool) (any, int64, error) {
	if w == nil {
		if b.calls != nil {
			v, err := b.calls.Run(ctx, s, keys, args, fcall)
			return v, 0, err
		}
		v, err := b.callOne(ctx, s, keys, args, fcall)
		return v, 0, err
	}
	// WAIT must follow the script on the same connection: a dedicated
	// connection to the key's node (the first command has the key).
	var reply any
	var acks int64
	err := b.c.Dedicated(func(dc rueidis.DedicatedClient) error {
		waitCmd := func() rueidis.Completed {
			if w.AOF {
				return dc.B().Waitaof().Numlocal(int64(w.Local)).Numreplicas(int64(w.Replicas)).Timeout(w.Timeout.Milliseconds()).Build()
			}
			return dc.B().Wait().Numreplicas(int64(w.Replicas)).Timeout(w.Timeout.Milliseconds()).Build()
		}
		how := backend.FirstCall(fcall)
		resps := dc.DoMulti(ctx, scriptCmd(dc, s, keys, args, how), waitCmd())
		if how == backend.BySHA && noScript(resps[0].Error()) {
			resps = dc.DoMulti(ctx, scriptCmd(dc, s, keys, args, backend.BySource), waitCmd())
		}
		var err error
		reply, _, err = normalize(resps[0])
		if err != nil {
			return err
		}
		wv, _, err := normalize(resps[1])
		if err != nil {
			return err
		}
		acks, err = backend.ParseAcks(wv, w)
		return err
	})
	return reply, acks, err
}

// callOne runs s once: FCALL (FCALL_RO) in Functions mode, otherwise
// EVALSHA falling back to EVAL, the commands rueidis's Lua.Exec sends
// (without a Lua value per script and client).
func (b *Client) callOne(ctx context.Context, s *backend.Script, keys, args []string, fcall bool) (any, error) {
	return callOn(ctx, b.c, s, keys, args, fcall)
}

// callOn runs s once on c, the client or one of its dedicated
// connections, as callOne describes.
func callOn(ctx context.Context, c interface {
	B() rueidis.Builder
	Do(context.Context, rueidis.Completed) rueidis.RedisResult
}, s *backend.Script, keys, args []string, fcall bool) (any, error) {
	how := backend.FirstCall(fcall)
	r := c.Do(ctx, scriptCmd(c, s, keys, args, how))
	if how == backend.BySHA && noScript(r.Error()) {
		r = c.Do(ctx, scriptCmd(c, s, keys, args, backend.BySource))
	}
	v, _, err := normalize(r)
	return v, err
}

// callLone runs s once, as callOne does, for a call made while none is in
// flight (backend.Coalescer.Lone), on a connection of the client's pool of
// dedicated connections, which the call writes and reads itself.
//
// On the shared connection, rueidis hands each call to a writer goroutine
// and its reply back from a reader goroutine, as soon as any two calls
// overlapped or one came with a context that can be cancelled but has no
// deadline, which is every HTTP request's; and it never goes back. At one
// connection that cost a new key through idemhttp about 100 µs of its p50
// (BENCHMARKS.md, "A lone call on a connection of its own"). A dedicated
// connection does the same as long as calls on it never overlap, which
// the coalescer ensures (one lone call at a time), and as long as each
// call's context cannot be cancelled without a deadline. So a context
// without a deadline is passed on without its cancellation: the call,
// once sent, waits for its reply, bounded by the client's
// ConnWriteTimeout, as every call does with DisableAutoPipelining. A
// deadline still bounds it.
func (b *Client) callLone(ctx context.Context, s *backend.Script, keys, args []string, fcall bool) (any, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	if _, ok := ctx.Deadline(); !ok {
		ctx = context.WithoutCancel(ctx)
	}
	dc, release := b.c.Dedicate()
	defer release()
	return callOn(ctx, dc, s, keys, args, fcall)
}

// callMany sends calls with one DoMulti (pipelineScripts), which rueidis
// writes to one connection at once. A store's calls are all in Functions
// mode or none.
func (b *Client) callMany(ctx context.Context, calls []*backend.QueuedCall) {
	results := pipelineScripts(ctx, b.c, len(calls), func(i int) (*backend.Script, []string, []string) {
		return calls[i].S, calls[i].Keys, calls[i].Args
	}, calls[0].Fcall)
	for i, c := range calls {
		c.Reply, _, c.Err = normalize(results[i])
	}
}

// scriptCmd returns the rueidis command that calls s with keys and args.
func scriptCmd(c interface{ B() rueidis.Builder }, s *backend.Script, keys, args []string, how backend.How) rueidis.Completed {
	switch how {
	case backend.ByFunction:
		return fcallCmd(c, s, keys, args)
	case backend.BySource:
		return c.B().Eval().Script(s.Src).Numkeys(int64(len(keys))).Key(keys...).Arg(args...).Build()
	}
	return c.B().Evalsha().Sha1(s.SHA).Numkeys(int64(len(keys))).Key(keys...).Arg(args...).Build()
}

// noScript reports whether err is the server's NOSCRIPT.
func noScript(err error) bool {
	rerr, ok := rueidis.IsRedisErr(err)
	return ok && rerr.IsNoScript()
}

// fcallCmd builds the FCALL (FCALL_RO for a read) of s.
func fcallCmd(c interface{ B() rueidis.Builder }, s *backend.Script, keys, args []string) rueidis.Completed {
	if s.RO {
		return c.B().FcallRo().Function(s.Fn).Numkeys(int64(len(keys))).Key(keys...).Arg(args...).Build()
	}
	return c.B().Fcall().Function(s.Fn).Numkeys(int64(len(keys))).Key(keys...).Arg(args...).Build()
}

// Del implements backend.Backend.
func (b *Client) Del(ctx context.Context, key, pub, channel string) error {
	del := b.c.B().Del().Key(key).Build()
	var publish rueidis.Completed
	switch pub {
	case "":
		return b.c.Do(ctx, del).Error()
	case "SPUBLISH":
		publish = b.c.B().Spublish().Channel(channel).Message("d").Build()
	default:
		publish = b.c.B().Publish().Channel(channel).Message("d").Build()
	}
	return b.c.DoMulti(ctx, del, publish)[0].Error()
}

// Nodes implements backend.Backend.
func (b *Client) Nodes(context.Context) ([]backend.Node, error) {
	var out []backend.Node
	for addr, c := range b.c.Nodes() {
		out = append(out, node{a: addr, c: c})
	}
	slices.SortFunc(out, func(a, b backend.Node) int { return strings.Compare(a.Addr(), b.Addr()) })
	return out, nil
}

// Cluster implements backend.Backend.
func (b *Client) Cluster() bool { return b.c.Mode() == rueidis.ClientModeCluster }

// Subscriber implements backend.Backend: on a standalone or Sentinel
// client the store's hub shares one dedicated connection; on a Cluster
// each watch has its own (Watch).
func (b *Client) Subscriber() backend.Opener {
	if b.Cluster() {
		return nil
	}
	return openTransport(b.c)
}

// Watch implements backend.Backend: SSUBSCRIBE on a dedicated connection,
// to the node of channel's slot.
func (b *Client) Watch(ctx context.Context, channel string) (<-chan struct{}, func(), error) {
	dc, cancel := b.c.Dedicate()
	subscribed := make(chan struct{})
	changed := make(chan struct{})
	var wakeOnce sync.Once
	wake := func() { wakeOnce.Do(func() { close(changed) }) }
	subOnce := false
	hookErr := dc.SetPubSubHooks(rueidis.PubSubHooks{
		OnSubscription: func(s rueidis.PubSubSubscription) {
			// Hooks run one at a time on one goroutine.
			if !subOnce && s.Channel == channel {
				subOnce = true
				close(subscribed)
			}
		},
		OnMessage: func(m rueidis.PubSubMessage) {
			if m.Channel == channel {
				wake()
			}
		},
	})
	if err := dc.Do(ctx, dc.B().Ssubscribe().Channel(channel).Build()).Error(); err != nil {
		cancel()
		return nil, nil, err
	}
	select {
	case <-subscribed:
	case err := <-hookErr:
		cancel()
		if err == nil {
			err = errors.New("subscription closed")
		}
		return nil, nil, err
	case <-ctx.Done():
		cancel()
		return nil, nil, ctx.Err()
	}
	// A broken connection wakes the watch, as the hub does: its caller
	// reads the record again and watches anew. (The stop below also ends
	// the hooks; a wake then is harmless.)
	go func() {
		<-hookErr
		wake()
	}()
	return changed, cancel, nil
}

// normalize turns a rueidis reply into the shapes go-redis returns: nil,
// int64, string and []any.
func normalize(r rueidis.RedisResult) (any, int64, error) {
	if err := r.Error(); err != nil {
		if rueidis.IsRedisNil(err) {
			return nil, 0, nil
		}
		return nil, 0, err
	}
	msg, err := r.ToMessage()
	if err != nil {
		return nil, 0, err
	}
	v, err := normalizeMessage(msg)
	return v, 0, err
}

func normalizeMessage(m rueidis.RedisMessage) (any, error) {
	if m.IsNil() {
		return nil, nil
	}
	if m.IsInt64() {
		return m.AsInt64()
	}
	if m.IsString() {
		return m.ToString()
	}
	if m.IsArray() {
		items, err := m.ToArray()
		if err != nil {
			return nil, err
		}
		out := make([]any, len(items))
		for i, it := range items {
			if out[i], err = normalizeMessage(it); err != nil {
				return nil, err
			}
		}
		return out, nil
	}
	if s, err := m.ToString(); err == nil {
		return s, nil
	}
	if n, err := m.AsInt64(); err == nil {
		return strconv.FormatInt(n, 10), nil
	}
	return nil, errors.New("unsupported reply type")
}
