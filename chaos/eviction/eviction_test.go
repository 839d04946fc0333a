package eviction

import (
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/idemgo/idem/chaos/chaostest"
	"github.com/idemgo/idem/testkit/redistest"
)

func TestEvictingRedis(t *testing.T) {
	keys := chaostest.Size(2000, 20000)
	srv := redistest.Start(t, "--maxmemory", "4mb", "--maxmemory-policy", "allkeys-lru")
	bin := chaostest.BuildIdem(t)

	var mu sync.Mutex
	runs := make(map[string]int)
	body := strings.Repeat("x", 2048)
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.Copy(io.Discard, r.Body)
		mu.Lock()
		runs[r.Header.Get("Idempotency-Key")]++
		mu.Unlock()
		w.WriteHeader(http.StatusCreated)
		io.WriteString(w, body)
	}))
	t.Cleanup(up.Close)
	storeArgs := []string{"--upstream", up.URL, "--redis", "redis://" + srv.Addr()}

	// Without --allow-eviction the proxy does not start.
	refused := chaostest.StartCommand(t, bin, append([]string{"proxy", "--listen", "127.0.0.1:0"}, storeArgs...))
	err := refused.Wait(30 * time.Second)
	var exit *exec.ExitError
	stderr := strings.TrimSpace(refused.Stderr())
	if !errors.As(err, &exit) || exit.ExitCode() != 1 || strings.Contains(stderr, "\n") ||
		!strings.Contains(stderr, "maxmemory-policy allkeys-lru") || !strings.Contains(stderr, "--allow-eviction") {
		t.Fatalf("proxy on allkeys-lru without --allow-eviction: got %v, stderr:\n%s\nwant exit 1 and one line naming the policy and --allow-eviction", err, stderr)
	}

	// Negative control: with --allow-eviction, evicted records run again.
	_, addr := chaostest.StartProxy(t, bin, append(storeArgs, "--allow-eviction")...)
	var c chaostest.Counters
	client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 16}}
	t.Cleanup(client.CloseIdleConnections)
	send := func(key string) {
		c.Attempted.Add(1)
		req, _ := http.NewRequestWithContext(t.Context(), http.MethodPost, "http://"+addr+"/orders", strings.NewReader("order "+key))
		req.Header.Set("Idempotency-Key", key)
		res, err := client.Do(req)
		if err != nil {
			t.Errorf("POST %s: %v", key, err)
			return
		}
		io.Copy(io.Discard, res.Body)
		res.Body.Close()
		if res.StatusCode/100 == 2 {
			c.Acknowledged.Add(1)
		}
	}
	start := time.Now()
	for range 2 { // every key, then every key again
		var wg sync.WaitGroup
		for w := range 16 {
			wg.Go(func() {
				for i := w; i < keys; i += 16 {
					send("k" + strconv.Itoa(i))
				}
			})
		}
		wg.Wait()
	}
	elapsed := time.Since(start)
	mu.Lock()
	twice := 0
	for _, n := range runs {
		c.Executed.Add(int64(n))
		c.Effects.Add(int64(n))
		if n > 1 {
			twice++
			c.Duplicated.Add(int64(n - 1))
		}
	}
	c.Lost.Store(int64(keys - len(runs)))
	mu.Unlock()
	evicted := srv.Do(t, "INFO", "stats")
	chaostest.Report(t, "evicting Redis (allkeys-lru, --allow-eviction: negative control)", "make chaos-long RUN=TestEvictingRedis", &c, map[string]string{
		"start without --allow-eviction": "refused, exit 1",
		"keys run twice":                 fmt.Sprintf("%d of %d", twice, keys),
		"evicted_keys":                   infoField(evicted, "evicted_keys"),
		"duration":                       elapsed.Round(time.Millisecond).String(),
	})
	if c.Lost.Load() != 0 {
		t.Errorf("lost: got %d keys never executed, want 0", c.Lost.Load())
	}
	// The control must see the fault: 4 MiB holds well under half of the
	// records, so most keys run twice.
	if twice < keys/2 {
		t.Errorf("keys run twice with eviction allowed: got %d of %d, want most of them (the control must show the duplicates)", twice, keys)
	}
}

func infoField(info, field string) string {
	for line := range strings.Lines(info) {
		if v, ok := strings.CutPrefix(strings.TrimSpace(line), field+":"); ok {
			return v
		}
	}
	return ""
}
