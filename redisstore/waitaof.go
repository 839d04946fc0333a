package redisstore

import (
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"time"

	"github.com/idemgo/idem/redisstore/internal/backend"
	"github.com/idemgo/idem/redisstore/internal/goredis"
	"github.com/idemgo/idem/redisstore/redisinfo"
	"github.com/redis/go-redis/v9"
)

// The check of WAITAOF under appendfsync everysec (WithWaitAOF), made by
// New and NewRueidis on every primary and by idem doctor --wait-aof
// (CheckWaitAOF): one check, here.
//
// With appendfsync everysec, Redis 7.4 and later and Valkey 8 and later
// start an fsync of the AOF at most once a second: each one at least
// everysecGap after the one before (flushAppendOnlyFile; Redis 7.2 starts
// one in each new second of its clock instead, so two may be milliseconds
// apart). A WAITAOF that counts a write as fsynced holds its reply until an
// fsync started after the write has finished.
//
// Redis 7.4.0 and 7.4.1, the 8.0 milestones and unstable builds of their
// time, and Valkey 8.0.0 and 8.0.1 do not: between two fsyncs, an event
// loop iteration with nothing left to write marks everything written as
// fsynced (fixed upstream by redis/redis#13793; the code came with 7.4, and
// no 7.2 release has it). Their WAITAOF acknowledges a write about one
// event loop tick (100 ms at hz 10) after it, fsynced or not, and a store
// with WithWaitAOF then acknowledges records that a crash of the machine
// can lose. The releases known to do it are refused from their version
// (redisinfo.EarlyWAITAOF); on other servers that may (Redis 7.4 and
// later, prereleases and unstable builds included, Valkey 8 and later),
// probeWaitAOF watches a write.
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

// WaitAOFCheck is what the check of WAITAOF found on one server
// (CheckWaitAOF, and New and NewRueidis with WithWaitAOF).
type WaitAOFCheck struct {
	// Server is the server's name and version, "redis 7.4.1" or
	// "valkey 8.0.1".
	Server string
	// Fsync is its appendfsync ("" when CONFIG GET was refused).
	Fsync string
	// Early reports that WAITAOF counts writes as fsynced before they
	// are, under appendfsync everysec: New and NewRueidis refuse such a
	// server with WithWaitAOF (*WaitAOFError). Known reports that the
	// release is known to (no write was watched); otherwise After is how
	// soon a watched write was acknowledged, before an fsync could run,
	// twice.
	Early bool
	Known bool
	After time.Duration
	// Window is how long a watched write went unacknowledged, when the
	// server waited for its fsync (Early false after a probe).
	Window time.Duration
	// Unknown says why the check could not tell, if it could not.
	Unknown string
	// CronTick reports a release whose WAITAOF answers at the server's
	// next cron tick rather than right after the fsync (Redis and Valkey
	// 7.2): about 100 ms per acquire and complete at the default hz 10,
	// even with appendfsync always.
	CronTick bool
}

// CheckWaitAOF checks, on the server c (one server: on a Cluster, call it
// for each primary), what WithWaitAOF relies on: that WAITAOF waits for the
// fsync of a write. Under appendfsync everysec a release known to
// acknowledge early is reported from its version; on one that may (Redis
// 7.4 and later, Valkey 8 and later) a scratch key of prefix is written and
// watched, which takes one to two seconds. It is the check New and
// NewRueidis make with WithWaitAOF; idem doctor --wait-aof reports it.
func CheckWaitAOF(ctx context.Context, c *redis.Client, prefix string) (WaitAOFCheck, error) {
	n := goredis.Node{C: c}
	info, err := n.Info(ctx)
	if err != nil {
		return WaitAOFCheck{}, err
	}
	return checkWaitAOF(ctx, n, redisinfo.Parse(info), prefix)
}

// checkWaitAOF is the check of n, whose INFO fields are f.
func checkWaitAOF(ctx context.Context, n node, f map[string]string, prefix string) (WaitAOFCheck, error) {
	name, version := redisinfo.Server(f)
	r := WaitAOFCheck{Server: name + " " + version}
	v, parsed := redisinfo.ParseVersion(version)
	r.CronTick = parsed && !fsyncOncePerSecond(name, v)
	fsync, err := n.ConfigGet(ctx, "appendfsync")
	switch {
	case err != nil && !isReplyError(err):
		return r, err
	case err != nil || fsync == "":
		r.Unknown = "CONFIG GET appendfsync was refused"
		return r, nil
	}
	r.Fsync = fsync
	switch {
	case fsync != "everysec":
		return r, nil
	case redisinfo.EarlyWAITAOF(name, version):
		r.Early, r.Known = true, true
		return r, nil
	case r.CronTick:
		return r, nil // an fsync in each new second, and WAITAOF waits for it
	case f["role"] == "slave":
		return r, nil // a replica: WAITAOF is watched on its primary
	}
	// Two early acknowledgements make a verdict.
	for range 2 {
		p, err := probeWaitAOF(ctx, n, prefix)
		if err != nil {
			return r, err
		}
		r.Early, r.After, r.Window, r.Unknown = !p.waits && p.unknown == "", p.early, p.window, p.unknown
		if !r.Early {
			break
		}
	}
	return r, nil
}

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
func probeWaitAOF(ctx context.Context, n node, prefix string) (waitAOFProbe, error) {
	key, err := ownKey(ctx, n, prefix)
	if err != nil {
		return waitAOFProbe{}, err
	}
	defer n.Del(context.WithoutCancel(ctx), key)
	for range 3 {
		start := time.Now()
		local, err := n.SetWaitAOF(ctx, key, probeFirstWait)
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
			t := time.NewTimer(everysecGap - probeMargin - probeMinWindow)
			select {
			case <-t.C:
			case <-ctx.Done():
				t.Stop()
				return waitAOFProbe{}, ctx.Err()
			}
			continue
		}
		start = time.Now()
		local, err = n.SetWaitAOF(ctx, key, window)
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

// ownKey returns a scratch key of the prefix that n serves: on a Cluster
// node, one of its own slots (a key of another slot is MOVED).
func ownKey(ctx context.Context, n node, prefix string) (string, error) {
	for range 64 {
		key := prefix + "{idem-waitaof-" + rand.Text() + "}"
		err := n.Exists(ctx, key)
		if err == nil {
			return key, nil
		}
		if !isMoved(err) {
			return "", err
		}
	}
	return "", errors.New("no key of 64 tried is served by this node")
}

// isMoved reports whether err is a MOVED reply.
func isMoved(err error) bool { return backend.ServerErrorHas(err, "MOVED") }

// Reason says how WAITAOF acknowledged early (with Early), as
// WaitAOFError and idem doctor say it.
func (r WaitAOFCheck) Reason() string {
	if r.Known {
		return "counts a write as fsynced one event loop tick after it, when nothing is left to write (redis/redis#13793)"
	}
	return fmt.Sprintf("acknowledged a write as fsynced after %v, twice, before the next fsync could start: one starts at most once a second", r.After.Round(time.Millisecond))
}
