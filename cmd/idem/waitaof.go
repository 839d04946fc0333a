package main

import (
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"time"

	"github.com/idemgo/idem/internal/redisinfo"
	"github.com/redis/go-redis/v9"
)

// With appendfsync everysec, Redis 7.4 and later and Valkey 8 and later
// start an fsync of the AOF at most once a second: each one at least
// everysecGap after the one before (flushAppendOnlyFile; Redis 7.2 starts
// one in each new second of its clock instead, so two may be milliseconds
// apart). A WAITAOF that counts a write as fsynced holds its reply until an
// fsync started after the write has finished.
//
// Redis 7.4.1 and Valkey 8.0.1 do not: between two fsyncs, an event loop
// iteration with nothing left to write marks everything written as fsynced
// (fixed upstream by redis/redis#13793; the code came with 7.4, and no 7.2
// release has it). Their WAITAOF acknowledges a write about one event loop
// tick (100 ms at hz 10) after it, fsynced or not, and a store with
// WithWaitAOF then acknowledges records that a crash of the machine can
// lose.
const (
	everysecGap = time.Second
	// probeMargin covers the server's cached clock and the round trips.
	probeMargin = 200 * time.Millisecond
	// probeMinWindow is the shortest second wait worth making: longer
	// than an event loop tick at the default hz 10.
	probeMinWindow = 150 * time.Millisecond
	// probeFirstWait bounds the first wait, for an fsync that must come
	// within a second.
	probeFirstWait = 3 * time.Second
)

// fsyncOncePerSecond reports whether a server of this name and version
// starts its everysec fsyncs at least everysecGap apart (and may have the
// early WAITAOF): Redis 7.4 and later, Valkey 8 and later.
func fsyncOncePerSecond(name string, v redisinfo.Version) bool {
	if name == "valkey" {
		return v.AtLeast(8, 0)
	}
	return v.AtLeast(7, 4)
}

// waitAOFProbe is what probeWaitAOF saw.
type waitAOFProbe struct {
	waits   bool          // WAITAOF held the write until an fsync could have run
	early   time.Duration // with !waits: how soon the write was acknowledged
	window  time.Duration // how long the second write was watched
	unknown string        // why the probe could not tell, if it could not
}

// probeWaitAOF tells whether n's WAITAOF waits for the fsync of a write,
// under appendfsync everysec. It writes a scratch key of the prefix and
// waits for its fsync (WAITAOF 1 0): the fsync that acknowledges it started
// after the write, so the next one cannot start within everysecGap of the
// write. It then writes the key again and waits, with a timeout that ends
// before that next fsync could start. A server whose WAITAOF waits for the
// fsync answers 0 (not fsynced) at the timeout; one that acknowledges
// early answers 1. A first wait too long to leave a window is repeated,
// with a write made shortly before the next fsync is due. Under a steady
// stream of writes a server with the early WAITAOF waits, and the probe
// sees it wait.
func probeWaitAOF(ctx context.Context, n *redis.Client, prefix string) (waitAOFProbe, error) {
	key, err := ownKey(ctx, n, prefix)
	if err != nil {
		return waitAOFProbe{}, err
	}
	defer n.Del(context.WithoutCancel(ctx), key)
	for range 3 {
		start := time.Now()
		local, err := writeAndWaitAOF(ctx, n, key, probeFirstWait)
		if err != nil {
			return waitAOFProbe{}, err
		}
		if local < 1 {
			return waitAOFProbe{unknown: fmt.Sprintf("no fsync acknowledged a write within %v", probeFirstWait)}, nil
		}
		window := everysecGap - time.Since(start) - probeMargin
		if window < probeMinWindow {
			// The fsync came late in its second, too late to leave a
			// window. The next one comes about a second after it:
			// write again shortly before.
			time.Sleep(everysecGap - probeMargin - probeMinWindow)
			continue
		}
		start = time.Now()
		local, err = writeAndWaitAOF(ctx, n, key, window)
		if err != nil {
			return waitAOFProbe{}, err
		}
		if local >= 1 {
			return waitAOFProbe{early: time.Since(start), window: window}, nil
		}
		return waitAOFProbe{waits: true, window: window}, nil
	}
	return waitAOFProbe{unknown: "every fsync came too late in its second to leave a window (3 tries)"}, nil
}

// writeAndWaitAOF sets key and sends WAITAOF 1 0 timeout on the same
// connection, and returns the local fsyncs that WAITAOF counted.
func writeAndWaitAOF(ctx context.Context, n *redis.Client, key string, timeout time.Duration) (int64, error) {
	var wait *redis.Cmd
	_, err := n.Pipelined(ctx, func(p redis.Pipeliner) error {
		p.Set(ctx, key, "doctor", 10*time.Second)
		wait = p.Do(ctx, "WAITAOF", 1, 0, timeout.Milliseconds())
		return nil
	})
	if err != nil {
		return 0, err
	}
	v, _ := wait.Slice()
	if len(v) != 2 {
		return 0, fmt.Errorf("WAITAOF replied %v, want two counts", wait.Val())
	}
	local, ok := v[0].(int64)
	if !ok {
		return 0, fmt.Errorf("WAITAOF replied %v, want two counts", wait.Val())
	}
	return local, nil
}

// ownKey returns a scratch key of the prefix that n serves: on a Cluster
// node, one of its own slots (a key of another slot is MOVED).
func ownKey(ctx context.Context, n *redis.Client, prefix string) (string, error) {
	for range 64 {
		key := prefix + "{idem-doctor-" + rand.Text() + "}"
		err := n.Do(ctx, "EXISTS", key).Err()
		if err == nil {
			return key, nil
		}
		var re redis.Error
		if !errors.As(err, &re) || !redis.HasErrorPrefix(err, "MOVED") {
			return "", err
		}
	}
	return "", errors.New("no key of 64 tried is served by this node")
}
