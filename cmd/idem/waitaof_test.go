package main

import (
	"strings"
	"testing"

	"github.com/idemgo/idem/internal/redisinfo"
	"github.com/idemgo/idem/internal/redistest"
)

// TestProbeWaitAOF runs the probe against the redis-server on PATH, with
// appendfsync everysec: before Redis 7.2 it returns the server's error
// (there is no WAITAOF); on the releases whose WAITAOF acknowledges writes
// before their fsync (redisinfo.EarlyWAITAOF), on an idle server, it sees it. On a
// server whose WAITAOF waits for the fsync (Redis 7.4.1 built with the
// upstream fix, redis/redis#13793), this test fails: the probe then says
// it waits, as it must.
func TestProbeWaitAOF(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t, "--appendonly", "yes", "--appendfsync", "everysec")
	fields := redisinfo.Parse(srv.Do(t, "INFO", "server"))
	name, version := redisinfo.Server(fields)
	compat, _ := redisinfo.Compatible(fields)
	p, err := probeWaitAOF(t.Context(), srv.GoRedis(t), "idem:")
	switch {
	case !compat.AtLeast(7, 2):
		if err == nil || !strings.Contains(strings.ToLower(err.Error()), "waitaof") {
			t.Fatalf("%s %s has no WAITAOF: got %+v, %v, want the server's error", name, version, p, err)
		}
	case err != nil:
		t.Fatalf("%s %s: %v", name, version, err)
	case redisinfo.EarlyWAITAOF(name, version):
		if p.waits || p.unknown != "" {
			t.Fatalf("%s %s: got %+v, want an early acknowledgement", name, version, p)
		}
		t.Logf("%s %s: a write acknowledged after %v (window %v)", name, version, p.early, p.window)
	default:
		t.Logf("%s %s: %+v", name, version, p)
	}
}
