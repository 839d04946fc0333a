package main

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/idemgo/idem/testkit/redistest"
)

// effectHandler applies each call's effect (a count per key) after the
// fence check, or without it (the control); the first call of key hold
// waits until release is closed, whatever became of its client.
type effectHandler struct {
	fenceCheck bool
	hold       string
	release    chan struct{}
	held       chan struct{} // closed when the held call arrived

	mu       sync.Mutex
	calls    map[string]int
	effects  map[string]int
	answered map[string]int
	fences   map[string]int64
	lostKeys []string // the --on-lease-lost calls' keys
	heldOnce sync.Once
}

func (h *effectHandler) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if r.URL.Path == "/lease-lost" {
		var l struct{ Key string }
		json.NewDecoder(r.Body).Decode(&l)
		h.mu.Lock()
		h.lostKeys = append(h.lostKeys, l.Key)
		h.mu.Unlock()
		return
	}
	io.Copy(io.Discard, r.Body)
	key := r.Header.Get("Idempotency-Key")
	fence, _ := strconv.ParseInt(r.Header.Get("Idempotency-Fence"), 10, 64)
	h.mu.Lock()
	h.calls[key]++
	first := h.calls[key] == 1
	h.mu.Unlock()
	if key == h.hold && first {
		h.heldOnce.Do(func() { close(h.held) })
		<-h.release // a handler that does not watch its client
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	h.answered[key]++
	if h.fenceCheck && fence <= h.fences[key] {
		w.WriteHeader(http.StatusConflict) // stale: a newer owner wrote
		return
	}
	h.fences[key] = max(h.fences[key], fence)
	h.effects[key]++
}

func (h *effectHandler) count(m map[string]int, key string) int {
	h.mu.Lock()
	defer h.mu.Unlock()
	return m[key]
}

// TestConsumeTakeover: the sidecar killed (SIGKILL) or paused past its
// lease (SIGSTOP) while the handler runs a message; a second sidecar
// takes the message over with a higher fence. Nothing is lost; with the
// handler's fence check each key's effect happens once; without it (the
// control) the stale call's effect happens too. A paused sidecar that
// comes back finds its lease lost and POSTs --on-lease-lost.
func TestConsumeTakeover(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		fault      string
		fenceCheck bool
		wantK      int // effects of the held key
	}{
		{"kill", true, 1}, {"kill", false, 2},
		{"pause", true, 1}, {"pause", false, 2},
	} {
		name := tc.fault + "/fence-check"
		if !tc.fenceCheck {
			name = tc.fault + "/control"
		}
		t.Run(name, func(t *testing.T) {
			srv := redistest.Start(t)
			rdb := srv.GoRedis(t)
			h := &effectHandler{fenceCheck: tc.fenceCheck, hold: "k0", release: make(chan struct{}), held: make(chan struct{}),
				calls: map[string]int{}, effects: map[string]int{}, answered: map[string]int{}, fences: map[string]int64{}}
			hs := httptest.NewServer(h)
			t.Cleanup(hs.Close)
			t.Cleanup(func() {
				select {
				case <-h.release:
				default:
					close(h.release)
				}
			})
			keys := []string{"k0", "k1", "k2", "k3", "k4"}
			for _, k := range keys {
				xadd(t, rdb, "jobs", "key", k, "payload", "{}")
			}
			args := func(name string) []string {
				return []string{"consume", "--from", "redis-stream://" + srv.Addr() + "/jobs?group=g", "--to", hs.URL + "/",
					"--on-lease-lost", hs.URL + "/lease-lost", "--lease", "600ms", "--batch", "1", "--name", name, "--shutdown-timeout", "1s"}
			}
			a := startIdem(t, args("a")...)
			select {
			case <-h.held:
			case <-time.After(20 * time.Second):
				t.Fatal("the handler did not get k0")
			}
			switch tc.fault {
			case "kill":
				a.kill()
			case "pause":
				if err := a.cmd.Process.Signal(syscall.SIGSTOP); err != nil {
					t.Fatal(err)
				}
			}
			b := startIdem(t, args("b")...)
			waitFor(t, "k0 taken over and every key handled", func() bool {
				for _, k := range keys {
					if h.count(h.effects, k) < 1 {
						return false
					}
				}
				return h.count(h.calls, "k0") == 2 && pendingCount(t, rdb, "jobs", "g") == 0 && lastDelivered(t, rdb, "jobs", "g")
			})
			if tc.fault == "pause" {
				a.cmd.Process.Signal(syscall.SIGCONT)
				waitFor(t, "the lease-lost call", func() bool {
					h.mu.Lock()
					defer h.mu.Unlock()
					return len(h.lostKeys) == 1 && h.lostKeys[0] == "k0"
				})
			}
			close(h.release) // the stale call goes on
			waitFor(t, "the stale call answered", func() bool { return h.count(h.answered, "k0") == 2 })
			b.terminate()
			b.wait()
			if tc.fault == "pause" {
				a.terminate()
				a.wait()
			}
			for _, k := range keys[1:] {
				if n := h.count(h.effects, k); n != 1 {
					t.Errorf("%s: %d effects, want 1", k, n)
				}
			}
			if n := h.count(h.effects, "k0"); n != tc.wantK {
				t.Errorf("k0 (taken over): %d effects, want %d", n, tc.wantK)
			}
			if n := pendingCount(t, rdb, "jobs", "g"); n != 0 {
				t.Errorf("pending: %d, want 0 (nothing lost)", n)
			}
		})
	}
}

// runEffectHandler serves as a handler process on addr: it appends each
// call's key to the file IDEM_TEST_EFFECTS after the fence check (kept in
// the file's lines: KEY FENCE), and with IDEM_TEST_HANG=KEY never answers
// KEY's calls (it is killed mid-call).
func runEffectHandler(addr string) {
	path, hang := os.Getenv("IDEM_TEST_EFFECTS"), os.Getenv("IDEM_TEST_HANG")
	var mu sync.Mutex
	err := http.ListenAndServe(addr, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.Copy(io.Discard, r.Body)
		key, fence := r.Header.Get("Idempotency-Key"), r.Header.Get("Idempotency-Fence")
		if key == hang {
			fmt.Println("hanging", key)
			select {} // killed mid-call
		}
		mu.Lock()
		defer mu.Unlock()
		f, err := os.OpenFile(path, os.O_APPEND|os.O_CREATE|os.O_WRONLY, 0o600)
		if err != nil {
			w.WriteHeader(500)
			return
		}
		defer f.Close()
		fmt.Fprintf(f, "%s %s\n", key, fence)
	}))
	fmt.Fprintln(os.Stderr, err)
	os.Exit(1)
}

// TestConsumeHandlerKilled: the handler process is killed (SIGKILL) while
// it runs a message, then started again on the same address: the call is
// sent again with the same fence (a reset connection, refused ones, then
// the new process's answer) and handled once; nothing is lost.
func TestConsumeHandlerKilled(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t)
	rdb := srv.GoRedis(t)
	addr := freeAddr(t)
	effects := filepath.Join(t.TempDir(), "effects")
	startHandler := func(hang string) (*exec.Cmd, *syncBuffer) {
		cmd := exec.Command(os.Args[0])
		out := &syncBuffer{}
		cmd.Env = append(testEnv(), "IDEM_TEST_EFFECT_HANDLER="+addr, "IDEM_TEST_EFFECTS="+effects, "IDEM_TEST_HANG="+hang)
		cmd.Stdout = out
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
		return cmd, out
	}
	h1, out := startHandler("k0")
	keys := []string{"k0", "k1", "k2"}
	for _, k := range keys {
		xadd(t, rdb, "jobs", "key", k, "payload", "{}")
	}
	c := startIdem(t, "consume", "--from", "redis-stream://"+srv.Addr()+"/jobs?group=g", "--to", "http://"+addr+"/",
		"--lease", "500ms", "--batch", "1", "--max-deliveries", "0")
	waitFor(t, "the handler hanging on k0", func() bool { return strings.Contains(out.String(), "hanging k0") })
	h1.Process.Kill()
	h1.Wait()
	startHandler("")
	waitFor(t, "every key handled", func() bool {
		return pendingCount(t, rdb, "jobs", "g") == 0 && lastDelivered(t, rdb, "jobs", "g") && len(effectLines(effects)) == len(keys)
	})
	c.terminate()
	if code := c.wait(); code != 0 {
		t.Errorf("exit code: %d, want 0", code)
	}
	got := map[string]int{}
	for _, l := range effectLines(effects) {
		got[strings.Fields(l)[0]]++
	}
	for _, k := range keys {
		if got[k] != 1 {
			t.Errorf("%s: %d effects, want 1 (lines %q)", k, got[k], effectLines(effects))
		}
	}
}

func effectLines(path string) []string {
	data, _ := os.ReadFile(path)
	s := strings.TrimSpace(string(data))
	if s == "" {
		return nil
	}
	return strings.Split(s, "\n")
}

// TestConsumeRedeliveryStorm: every message sent five times, read by four
// consumers of the group (--concurrency 4), some copies in one batch,
// others in batches handled at the same time: each key's handler runs
// once, nothing is lost. The control, --pass-duplicates, shows the copies
// did reach the sidecar: the handler gets each one, marked
// Idempotent-Replayed, beside the one call that is not.
func TestConsumeRedeliveryStorm(t *testing.T) {
	t.Parallel()
	const keys, copies = 100, 5
	for _, pass := range []bool{false, true} {
		t.Run(map[bool]string{false: "dedup", true: "pass-duplicates"}[pass], func(t *testing.T) {
			srv := redistest.Start(t)
			rdb := srv.GoRedis(t)
			var mu sync.Mutex
			first, replayed := map[string]int{}, map[string]int{}
			hs := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				io.Copy(io.Discard, r.Body)
				k := r.Header.Get("Idempotency-Key")
				mu.Lock()
				defer mu.Unlock()
				if r.Header.Get("Idempotent-Replayed") == "true" {
					replayed[k]++
				} else {
					first[k]++
				}
			}))
			t.Cleanup(hs.Close)
			for c := range copies {
				pipe := rdb.Pipeline()
				for i := range keys {
					pipe.XAdd(t.Context(), &redis.XAddArgs{Stream: "storm", Values: []any{"key", "k" + strconv.Itoa((i+c*7)%keys), "payload", "{}"}})
				}
				if _, err := pipe.Exec(t.Context()); err != nil {
					t.Fatal(err)
				}
			}
			args := []string{"consume", "--from", "redis-stream://" + srv.Addr() + "/storm?group=g", "--to", hs.URL, "--concurrency", "4", "--batch", "10", "--lease", "1s"}
			if pass {
				args = append(args, "--pass-duplicates")
			}
			p := startIdem(t, args...)
			waitFor(t, "every copy settled", func() bool {
				return pendingCount(t, rdb, "storm", "g") == 0 && lastDelivered(t, rdb, "storm", "g")
			})
			p.terminate()
			p.wait()
			mu.Lock()
			defer mu.Unlock()
			lost, dup, passed := 0, 0, 0
			for i := range keys {
				k := "k" + strconv.Itoa(i)
				switch n := first[k]; {
				case n == 0:
					lost++
				case n > 1:
					dup += n - 1
				}
				passed += replayed[k]
			}
			t.Logf("keys %d × %d copies: lost %d, duplicate calls %d, replayed copies passed on %d", keys, copies, lost, dup, passed)
			if lost != 0 || dup != 0 {
				t.Errorf("lost %d, duplicate calls %d; want 0 and 0", lost, dup)
			}
			// A copy in the same batch as its key's first follows it
			// without a call; the others are passed on.
			if pass && passed == 0 || !pass && passed != 0 {
				t.Errorf("replayed copies passed on: %d, want some with --pass-duplicates only", passed)
			}
		})
	}
}
