// Package backend is the seam between redisstore's client-agnostic code
// (transitions, scripts, Functions libraries, effects, streams, batches,
// the subscriber hub, start checks) and the packages that drive one client
// library each (internal/goredis, internal/rueidis, internal/valkey). A
// client package implements Backend; redisstore calls nothing else of it
// but its constructors.
package backend

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"strconv"
	"sync/atomic"
	"time"
)

// Script is one Lua script as a client sends it: EVALSHA with SHA, EVAL
// with Src after NOSCRIPT, or, in Functions mode, FCALL of Fn (FCALL_RO
// when RO).
type Script struct {
	Name string
	Src  string
	SHA  string // SHA1 of Src, for EVALSHA
	RO   bool   // reads only: a no-writes function, called with FCALL_RO
	Fn   string // Functions mode: the function's name
}

// Call is one script call of a pipeline.
type Call struct {
	Keys []string
	Args []string
}

// Wait is a durability requirement checked after a script: WAIT
// Replicas Timeout, or WAITAOF Local Replicas Timeout with AOF.
type Wait struct {
	AOF        bool
	Local      int // WAITAOF numlocal
	Replicas   int
	Timeout    time.Duration
	TimeoutArg string // Timeout in milliseconds, formatted once
}

// Name is the command of w.
func (w *Wait) Name() string {
	if w.AOF {
		return "WAITAOF"
	}
	return "WAIT"
}

// Backend is the part of a client library the store uses.
type Backend interface {
	// Run runs s with keys and args on the node of keys[0]: with EVALSHA,
	// falling back to EVAL, or with FCALL (FCALL_RO for a read) when fcall
	// is set. It returns the reply normalized to nil, int64, string and
	// []any. With a wait config it sends WAIT/WAITAOF on the same
	// connection after the script and returns the number of
	// acknowledgements too (ParseAcks).
	Run(ctx context.Context, s *Script, keys, args []string, w *Wait, fcall bool) (reply any, acks int64, err error)
	// RunMulti runs many calls of s in one pipeline, as Run does, and
	// returns one normalized reply or error per call.
	RunMulti(ctx context.Context, s *Script, calls []Call, fcall bool) ([]any, []error)
	// Load loads lib on every primary that does not have it with its
	// code yet (LoadOn).
	Load(ctx context.Context, lib *Library) error
	// Libraries returns the names of idem's Functions libraries loaded on
	// each primary.
	Libraries(ctx context.Context) ([]string, error)
	// Del deletes key; if pub is not "", it then sends pub (PUBLISH or
	// SPUBLISH) on channel, in the same round trip, to wake the key's
	// waiters. Only the DEL's error is returned: a lost notification
	// leaves the waiters to their lease timers.
	Del(ctx context.Context, key, pub, channel string) error
	// Scan calls fn with the name of every string key whose name matches
	// the SCAN pattern match, on every node that holds keys, until fn
	// returns false.
	Scan(ctx context.Context, match string, fn func(name string) bool) error
	// Subscriber returns how to open the one subscriber connection that
	// the store's hub shares among its watches, or nil when each watch
	// has a connection of its own (Watch).
	Subscriber() Opener
	// Watch subscribes to channel on a connection of its own (SSUBSCRIBE
	// on a Cluster) and returns once the server confirmed it; the channel
	// returned is closed on the first message or when the connection
	// breaks.
	Watch(ctx context.Context, channel string) (<-chan struct{}, func(), error)
	// Cluster reports whether the client is a Cluster client: keys of
	// different slots are on different nodes, and notifications go with
	// SPUBLISH.
	Cluster() bool
	// Nodes returns the servers the client knows: the one server, or a
	// Cluster's primaries and replicas.
	Nodes(ctx context.Context) ([]Node, error)
	// ReplayCache returns the client's local cache of records for
	// replays, or nil when the client cannot keep one.
	ReplayCache(c CacheConfig) CachedGetter
}

// Node is one server of the deployment, as the start check sees it.
type Node interface {
	Addr() string
	Info(ctx context.Context) (string, error)
	ConfigGet(ctx context.Context, name string) (string, error)
	// SetWaitAOF sets key and sends WAITAOF 1 0 timeout on the same
	// connection, and returns the local fsyncs that WAITAOF counted.
	SetWaitAOF(ctx context.Context, key string, timeout time.Duration) (int64, error)
	// Exists sends EXISTS key (answered MOVED on a Cluster node that does
	// not serve it).
	Exists(ctx context.Context, key string) error
	Del(ctx context.Context, key string) error
}

// Opener opens a hub's subscriber connection, which reports to ev.
type Opener func(ev Events) (Transport, error)

// Events is what a subscriber connection reports to its hub.
type Events interface {
	// Confirmed reports the server's confirmation of a SUBSCRIBE (sub) or
	// of an UNSUBSCRIBE of channel.
	Confirmed(channel string, sub bool)
	// Message reports a message on channel.
	Message(channel string)
	// Broken reports that the connection is gone.
	Broken()
}

// Transport is the subscriber connection of a hub. Its methods send a
// command and return without waiting for the reply; the connection's
// reader reports to the hub through Events.
type Transport interface {
	Subscribe(ctx context.Context, channel string) error
	Unsubscribe(ctx context.Context, channel string) error
	Close()
}

// CacheConfig configures a replay cache.
type CacheConfig struct {
	Prefix   string // the store's key prefix
	MaxBytes int64  // the bound of a cache the store keeps itself
	Log      *slog.Logger
	// Keep reports whether a record read from the server may be kept (a
	// COMPLETED or FAILED record): a cache the store keeps itself keeps
	// nothing else.
	Keep func(value string) bool
}

// CachedGetter reads a key through a client-side cache that the server
// keeps consistent (client tracking).
type CachedGetter interface {
	CachedGet(ctx context.Context, key string) (value string, found bool, err error)
	// Forget drops key's entry at once, before the server's invalidation
	// arrives (the store deleted the record).
	Forget(key string)
	// Close ends what the cache runs in the background.
	Close()
}

// The replay caches' shared settings (see redisstore's package
// documentation, "Local replay cache").
const (
	// CacheTTL bounds how long a cached record is kept, whatever its
	// retention.
	CacheTTL = time.Minute
	// ExpiryMargin: a cached record with less time to live left is not
	// used (the store runs the acquire script instead). Its end is dated
	// from before the read that cached it was sent, so it ends before the
	// record does; the margin covers the rounding of times to
	// milliseconds.
	ExpiryMargin = 10 * time.Millisecond
	// IndexSize is the number of keys of the store's replay index, and
	// the most entries a client's cache dates.
	IndexSize = 1 << 16
)

// ErrNearExpiry: the cached record is near its end, or of unknown date.
var ErrNearExpiry = errors.New("redisstore: cached record near its end, or of unknown date")

// CacheHits counts the acquires served from a local cache, in every store
// of the process (tests).
var CacheHits atomic.Int64

// ReplyError is the error of a reply of an unexpected shape.
func ReplyError(name string, v any) error {
	return fmt.Errorf("redisstore: unexpected %s reply %#v", name, v)
}

// AsInt reads an integer reply, or its decimal string.
func AsInt(v any) (int64, bool) {
	switch x := v.(type) {
	case int64:
		return x, true
	case string:
		n, err := strconv.ParseInt(x, 10, 64)
		return n, err == nil
	}
	return 0, false
}

// ParseAcks returns the replicas that acknowledged: WAIT replies with a
// number, WAITAOF with {local fsyncs, replica fsyncs}. A missing local
// fsync counts as no acknowledgement at all.
func ParseAcks(v any, w *Wait) (int64, error) {
	if !w.AOF {
		n, ok := AsInt(v)
		if !ok {
			return 0, ReplyError("WAIT", v)
		}
		return n, nil
	}
	arr, ok := v.([]any)
	if !ok || len(arr) != 2 {
		return 0, ReplyError("WAITAOF", v)
	}
	local, ok1 := AsInt(arr[0])
	replicas, ok2 := AsInt(arr[1])
	if !ok1 || !ok2 {
		return 0, ReplyError("WAITAOF", v)
	}
	if local < int64(w.Local) {
		return -1, nil
	}
	return replicas, nil
}

// WaitAOFLocal returns the local count of a WAITAOF reply.
func WaitAOFLocal(v any) (int64, error) {
	if a, ok := v.([]any); ok && len(a) == 2 {
		if local, ok := a[0].(int64); ok {
			return local, nil
		}
	}
	return 0, fmt.Errorf("WAITAOF replied %v, want two counts", v)
}

// Unreachable reports whether err says a node could not be reached or
// dropped the connection, rather than answered.
func Unreachable(err error) bool {
	var op *net.OpError
	return err != nil && (errors.As(err, &op) || errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF))
}

// How is how a script is named in its call.
type How int

const (
	BySHA      How = iota // EVALSHA
	BySource              // EVAL, after NOSCRIPT
	ByFunction            // FCALL, or FCALL_RO for a script that writes nothing
)

// FirstCall is how a store calls a script first: by its function in
// Functions mode, otherwise by its SHA (BySource follows a NOSCRIPT).
func FirstCall(fcall bool) How {
	if fcall {
		return ByFunction
	}
	return BySHA
}
