package main

import (
	"strings"
	"testing"
	"time"

	"github.com/idemgo/idem/testkit/redistest"
)

// TestProxyWaitReplicas checks --wait-replicas: on a primary without a
// replica no request is reported done (503, the upstream not called: the
// acquire was not confirmed), which is what a primary cut off from its
// replicas answers instead of acknowledging writes a failover would lose
// (RELIABILITY.md, Sentinel partition); once a replica is connected,
// requests succeed and replay. Bad values are refused at start.
func TestProxyWaitReplicas(t *testing.T) {
	t.Parallel()
	primary := redistest.Start(t, "--repl-diskless-sync-delay", "0") // the replica syncs at once
	up := newUpstream(t)
	storeArgs := []string{"--redis", "redis://" + primary.Addr()}
	p := startProxy(t, up.url(), storeArgs, "--wait-replicas", "1", "--wait-replicas-timeout", "100ms")
	if res := post(t, p.url("/payments"), "alone", "x"); res.status != 503 {
		t.Errorf("--wait-replicas 1 without a replica: got %d %s, want 503", res.status, res.body)
	}
	if n := up.executions("alone"); n != 0 {
		t.Errorf("--wait-replicas 1 without a replica: the upstream ran %d times, want 0", n)
	}

	host, port, _ := strings.Cut(primary.Addr(), ":")
	replica := redistest.Start(t, "--replicaof", host, port)
	deadline := time.Now().Add(30 * time.Second)
	// The replica's link is up before the primary streams to it: after a
	// diskless full sync the primary waits for the replica's first
	// REPLCONF ACK (sent once a second) before it sends anything, the
	// GETACK of a WAIT included. Until then the primary shows the replica
	// with offset=0; a WAIT from a connection that never wrote would not
	// see it (it waits for offset 0), so poll the offset itself.
	for !replicaAcked(primary.Do(t, "INFO", "replication")) {
		if time.Now().After(deadline) {
			t.Fatal("the replica did not acknowledge the primary within 30s")
		}
		time.Sleep(20 * time.Millisecond) // poll the primary's view of the replica
	}
	first := post(t, p.url("/payments"), "replicated", "x")
	again := post(t, p.url("/payments"), "replicated", "x")
	if first.status != 201 || again.status != 201 || !again.replayed() {
		t.Errorf("--wait-replicas 1 with a replica: got %d then %d (replayed %v), want 201 then a replayed 201", first.status, again.status, again.replayed())
	}
	if n := up.executions("replicated"); n != 1 {
		t.Errorf("the upstream ran %d times, want 1", n)
	}
	if v := replica.Do(t, "DBSIZE"); v == "0" {
		t.Error("the replica holds no record")
	}

	for _, bad := range [][]string{
		{"--wait-replicas", "-1"},
		{"--wait-replicas", "1", "--wait-replicas-timeout", "0s"},
	} {
		args := append([]string{"proxy", "--listen", freeAddr(t), "--upstream", up.url()}, storeArgs...)
		if code, _, stderr := runIdem(t, append(args, bad...)...); code != 2 || !strings.Contains(stderr, "--wait-replicas") {
			t.Errorf("proxy %v: got exit %d, stderr %q, want 2 naming the flag", bad, code, stderr)
		}
	}
	args := []string{"proxy", "--listen", freeAddr(t), "--upstream", up.url(), "--data", t.TempDir(), "--wait-replicas", "1"}
	if code, _, stderr := runIdem(t, args...); code != 2 || !strings.Contains(stderr, "needs a Redis store") {
		t.Errorf("--wait-replicas with the embedded store: got exit %d, stderr %q, want 2", code, stderr)
	}
}

// replicaAcked reports whether INFO replication of a primary shows a replica
// that has acknowledged an offset (slave0:...,offset=N with N > 0).
func replicaAcked(info string) bool {
	for _, line := range strings.Split(info, "\n") {
		if !strings.HasPrefix(line, "slave0:") {
			continue
		}
		for _, field := range strings.Split(strings.TrimSpace(line), ",") {
			if v, ok := strings.CutPrefix(field, "offset="); ok {
				return v != "0"
			}
		}
	}
	return false
}
