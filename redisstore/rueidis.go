package redisstore

import (
	"context"
	"errors"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"

	"github.com/redis/rueidis"
)

// rueidisBackend is the backend for a rueidis.Client. On a standalone
// server its watches share one subscriber connection (hub); on a Cluster
// each watch has its own, to the node of its channel's slot.
type rueidisBackend struct {
	c   rueidis.Client
	hub *hub // nil on a Cluster
	// calls coalesces the script calls made without WAIT (coalesce.go);
	// nil on a Cluster.
	calls *coalescer
	// read is how replays are read (readProbe, readDoCache or readDo, see
	// replaycache.go); noCache counts the probes that showed no client-side
	// cache.
	read    atomic.Int32
	noCache atomic.Int32
	// ends dates the replays cached by the client (replaycache.go).
	ends cacheEnds
}

func newRueidis(c rueidis.Client) *rueidisBackend {
	b := &rueidisBackend{c: c}
	if c.Mode() != rueidis.ClientModeCluster {
		b.hub = &hub{open: openRueidis(c)}
		b.read.Store(readDoCache)
		b.calls = &coalescer{senders: coalesceSenders, one: b.callOne, many: b.callMany}
	}
	return b
}

func (b *rueidisBackend) run(ctx context.Context, s *script, keys, args []string, w *waitConfig, fcall bool) (any, int64, error) {
	if w == nil {
		if b.calls != nil {
			v, err := b.calls.run(ctx, s, keys, args, fcall)
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
			if w.aof {
				return dc.B().Waitaof().Numlocal(int64(w.local)).Numreplicas(int64(w.replicas)).Timeout(w.timeout.Milliseconds()).Build()
			}
			return dc.B().Wait().Numreplicas(int64(w.replicas)).Timeout(w.timeout.Milliseconds()).Build()
		}
		how := firstCall(fcall)
		resps := dc.DoMulti(ctx, scriptCmdRueidis(dc, s, keys, args, how), waitCmd())
		if how == bySHA && noScriptRueidis(resps[0].Error()) {
			resps = dc.DoMulti(ctx, scriptCmdRueidis(dc, s, keys, args, bySource), waitCmd())
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
		acks, err = parseAcks(wv, w)
		return err
	})
	return reply, acks, err
}

// callOne runs s once: FCALL (FCALL_RO) in Functions mode, otherwise
// EVALSHA falling back to EVAL.
func (b *rueidisBackend) callOne(ctx context.Context, s *script, keys, args []string, fcall bool) (any, error) {
	if fcall {
		v, _, err := normalize(b.c.Do(ctx, fcallCmd(b.c, s, keys, args)))
		return v, err
	}
	v, _, err := normalize(s.ru.Exec(ctx, b.c, keys, args))
	return v, err
}

// callMany sends calls with one DoMulti (pipelineRueidis), which rueidis
// writes to one connection at once. A store's calls are all in Functions
// mode or none.
func (b *rueidisBackend) callMany(ctx context.Context, calls []*queuedCall) {
	results := pipelineRueidis(ctx, b.c, len(calls), func(i int) (*script, []string, []string) {
		return calls[i].s, calls[i].keys, calls[i].args
	}, calls[0].fcall)
	for i, c := range calls {
		c.reply, _, c.err = normalize(results[i])
	}
}

// scriptCmdRueidis returns the rueidis command that calls s with keys and
// args, as scriptCmd does for go-redis.
func scriptCmdRueidis(c interface{ B() rueidis.Builder }, s *script, keys, args []string, how scriptCall) rueidis.Completed {
	switch how {
	case byFunction:
		return fcallCmd(c, s, keys, args)
	case bySource:
		return c.B().Eval().Script(s.src).Numkeys(int64(len(keys))).Key(keys...).Arg(args...).Build()
	}
	return c.B().Evalsha().Sha1(s.sha).Numkeys(int64(len(keys))).Key(keys...).Arg(args...).Build()
}

// noScriptRueidis reports whether err is the server's NOSCRIPT.
func noScriptRueidis(err error) bool {
	rerr, ok := rueidis.IsRedisErr(err)
	return ok && rerr.IsNoScript()
}

// fcallCmd builds the FCALL (FCALL_RO for a read) of s.
func fcallCmd(c interface{ B() rueidis.Builder }, s *script, keys, args []string) rueidis.Completed {
	if s.ro {
		return c.B().FcallRo().Function(s.fn).Numkeys(int64(len(keys))).Key(keys...).Arg(args...).Build()
	}
	return c.B().Fcall().Function(s.fn).Numkeys(int64(len(keys))).Key(keys...).Arg(args...).Build()
}

func (b *rueidisBackend) del(ctx context.Context, key, pub, channel string) error {
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

func (b *rueidisBackend) nodes(context.Context) ([]node, error) {
	var out []node
	for addr, c := range b.c.Nodes() {
		out = append(out, rueidisNode{a: addr, c: c})
	}
	slices.SortFunc(out, func(a, b node) int { return strings.Compare(a.addr(), b.addr()) })
	return out, nil
}

func (b *rueidisBackend) publishCommand() string {
	if b.c.Mode() == rueidis.ClientModeCluster {
		return "SPUBLISH"
	}
	return "PUBLISH"
}

func (b *rueidisBackend) watch(ctx context.Context, channel string) (<-chan struct{}, func(), error) {
	if b.hub != nil {
		return b.hub.watch(ctx, channel)
	}
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
