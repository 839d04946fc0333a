package main

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/idemgo/idem/testkit/redistest"
	"github.com/redis/go-redis/v9"
)

// TestProxySentinel runs the proxy, ls and doctor on a Redis behind
// Sentinels (--redis-sentinel), kills the primary and checks that the
// proxy follows the failover (new keys run) and what a request completed
// before it gets when retried, which is what replication guarantees:
//   - without --wait-replicas, replication is asynchronous: the completion
//     may not have reached the promoted replica, so the retry is either
//     replayed or runs again, as a new request (never a mismatch, nor an
//     error once the proxy found the new primary);
//   - the same, with the replicas cut off from the primary before the
//     request (the deterministic case of the first): the retry runs again,
//     once;
//   - with --wait-replicas 2, both replicas acknowledged the completion
//     before the client got its response, so whichever is promoted has it:
//     the retry is replayed, once a replica is back for WAIT 2 (until
//     then, 503).
//
// The passwords (--redis-password) never appear in a message.
func TestProxySentinel(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name string
		wait bool // --wait-replicas 2
		cut  bool // the replicas lose their link to the primary before the request
	}{{"async", false, false}, {"async replicas cut off", false, true}, {"wait-replicas", true, false}} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			s := redistest.StartSentinel(t, 2, "--appendonly", "yes")
			storeArgs := []string{"--redis-sentinel", s.MasterName + "@" + strings.Join(s.SentinelAddrs(), ",")}
			const password = "s3cret-pw"
			if !tc.wait {
				// A restarted server (below) would come back without it.
				s.RequirePass(t, password)
				storeArgs = append(storeArgs, "--redis-password", password)
			}
			code, out, stderr := runIdem(t, append([]string{"doctor", "--wait-replicas", "2"}, storeArgs...)...)
			if code != 0 || !strings.Contains(out, "OK    replicas: 2 connected (WAIT 2)") || !strings.Contains(out, "OK    rights:") {
				t.Errorf("doctor: got %d\n%s%s\nwant 0 with the replicas and rights OK", code, out, stderr)
			}

			up := newUpstream(t)
			var extra []string
			if tc.wait {
				extra = []string{"--wait-replicas", "2", "--wait-replicas-timeout", "2s"}
			}
			p := startProxy(t, up.url(), storeArgs, extra...)
			s.WaitHealthy(t)
			if tc.cut {
				cutReplicas(t, s, password)
			}
			first := post(t, p.url("/payments"), "before", "x")
			if first.status != 201 {
				t.Fatalf("POST: got %d, want 201", first.status)
			}
			code, out, _ = runIdem(t, append([]string{"ls"}, storeArgs...)...)
			if code != 0 || strings.Count(out, "COMPLETED") != 1 {
				t.Errorf("ls: got %d\n%s\nwant the one record", code, out)
			}

			old := s.Primary()
			old.Kill(t)
			s.WaitFailover(t, old)
			if tc.wait {
				// WAIT 2 needs two replicas again: the old primary comes
				// back and the Sentinels make it a replica of the new one.
				old.Restart(t)
				s.WaitHealthy(t)
			}
			// The proxy's client finds the new primary through the
			// Sentinels; until it does, requests get 503. A new key each
			// time: a request that got 503 may hold its key.
			deadline := time.Now().Add(30 * time.Second)
			for i := 0; ; i++ {
				res := post(t, p.url("/payments"), fmt.Sprintf("after-%d", i), "y")
				if res.status == 201 {
					break
				}
				if res.status != 503 || time.Now().After(deadline) {
					t.Fatalf("POST after the failover: got %d %q, want 201 (503 while the client reconnects)", res.status, res.body)
				}
				time.Sleep(100 * time.Millisecond) // retry as a client would
			}
			retry := post(t, p.url("/payments"), "before", "x")
			n := up.executions("before")
			switch {
			case !tc.cut && retry.status == 201 && retry.replayed() && retry.body == first.body && n == 1:
				// The completion survived the failover.
			case tc.cut && retry.status == 201 && !retry.replayed() && n == 2:
				// The promoted replica never had it.
			case !tc.wait && retry.status == 201 && !retry.replayed() && n == 2:
				t.Logf("the completion did not reach the promoted replica before the failover: the retry ran again (asynchronous replication)")
			default:
				want := "a replay"
				switch {
				case tc.cut:
					want = "a second execution, not a replay"
				case !tc.wait:
					want = "a replay, or a second execution"
				}
				t.Errorf("retry of the key completed before the failover: got %d replayed=%v %q after %d executions, want %s of %q",
					retry.status, retry.replayed(), retry.body, n, want, first.body)
			}

			if !tc.wait {
				// A wrong password is reported without either password.
				bad := []string{"--redis-sentinel", storeArgs[1], "--redis-password", "wrong-pw", "--redis-sentinel-password", "other-pw"}
				code, _, stderr = runIdem(t, append([]string{"ls"}, bad...)...)
				if code == 0 || strings.Contains(stderr, "wrong-pw") || strings.Contains(stderr, "other-pw") || strings.Contains(stderr, password) {
					t.Errorf("ls with a wrong password: got %d %q, want an error without the passwords", code, stderr)
				}
			}
			p.terminate()
			p.wait()
			if logs := p.stderr.String(); strings.Contains(logs, password) {
				t.Errorf("the proxy's log shows the password:\n%s", logs)
			}
		})
	}
}

// cutReplicas cuts the replicas of s off from the primary, which keeps
// serving: each replica gets a wrong masterauth and the primary drops
// their links, so that they cannot sync again. It returns once the primary
// has no replica left.
func cutReplicas(t *testing.T, s *redistest.Sentinel, password string) {
	t.Helper()
	primary := s.Primary()
	client := func(addr string) *redis.Client {
		c := redis.NewClient(&redis.Options{Addr: addr, Password: password})
		t.Cleanup(func() { c.Close() })
		return c
	}
	for _, d := range s.Data() {
		if d != primary {
			if err := client(d.Addr()).ConfigSet(t.Context(), "masterauth", "not-"+password).Err(); err != nil {
				t.Fatal(err)
			}
		}
	}
	pc := client(primary.Addr())
	if err := pc.Do(t.Context(), "CLIENT", "KILL", "TYPE", "replica").Err(); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(readyTimeout)
	for {
		info, err := pc.Info(t.Context(), "replication").Result()
		if err != nil {
			t.Fatal(err)
		}
		if strings.Contains(info, "connected_slaves:0") {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("the primary still has replicas after %v:\n%s", readyTimeout, info)
		}
		time.Sleep(20 * time.Millisecond) // poll until the primary dropped the links
	}
}

// TestSentinelFlags checks the validation of --redis-sentinel and its
// password flags, which never echo a password.
func TestSentinelFlags(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"--redis-sentinel", "127.0.0.1:26379"}, "want NAME@HOST:PORT"},
		{[]string{"--redis-sentinel", "m@"}, "--redis-sentinel has no address"},
		{[]string{"--redis-sentinel", "m@host"}, `invalid --redis-sentinel address "host"`},
		{[]string{"--redis-sentinel", "m@127.0.0.1:1", "--redis", "redis://127.0.0.1:1"}, "exclude each other"},
		{[]string{"--redis", "redis://127.0.0.1:1", "--redis-password", "pw-secret"}, "put them in the URL"},
		{[]string{"--redis-sentinel-password", "pw-secret"}, "needs --redis-sentinel"},
	} {
		code, _, stderr := runIdem(t, append([]string{"ls"}, tc.args...)...)
		if code != 2 || !strings.Contains(stderr, tc.want) || strings.Contains(stderr, "pw-secret") {
			t.Errorf("ls %v: got %d %q, want 2 and %q without the password", tc.args, code, stderr, tc.want)
		}
	}
}
