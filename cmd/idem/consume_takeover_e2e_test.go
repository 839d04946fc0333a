package main

import (
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"strconv"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/idemgo/idem/internal/redistest"
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
