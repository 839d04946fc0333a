package shutdown

import (
	"bufio"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/idemgo/idem/chaos/chaostest"
)

const (
	maxResponse = 1 << 20   // --max-response
	small       = 256 << 10 // stored before it is sent
	big         = 16 << 20  // streamed: over --max-response
	lease       = 2 * time.Second
)

// upstream answers ?n=N bytes, each byte the execution's number mod 256,
// and counts executions per key.
type upstream struct {
	mu    sync.Mutex
	execs map[string]int
}

func (u *upstream) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	io.Copy(io.Discard, r.Body)
	key := r.Header.Get("Idempotency-Key")
	u.mu.Lock()
	u.execs[key]++
	n := u.execs[key]
	u.mu.Unlock()
	size, _ := strconv.Atoi(r.URL.Query().Get("n"))
	w.Header().Set("Content-Type", "application/octet-stream")
	w.Header().Set("X-Exec", strconv.Itoa(n))
	w.Header().Set("Content-Length", strconv.Itoa(size))
	buf := []byte(strings.Repeat(string(rune('a'+n%26)), 32<<10))
	for left := size; left > 0; left -= len(buf) {
		if _, err := w.Write(buf[:min(left, len(buf))]); err != nil {
			return
		}
	}
}

func (u *upstream) count(key string) int {
	u.mu.Lock()
	defer u.mu.Unlock()
	return u.execs[key]
}

// slowReader sends a request for size bytes with key, reads the status
// line, and stops reading.
func slowReader(t *testing.T, addr, key string, size int) net.Conn {
	t.Helper()
	conn, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	fmt.Fprintf(conn, "POST /pay?n=%d HTTP/1.1\r\nHost: proxy\r\nIdempotency-Key: %s\r\nContent-Length: 0\r\n\r\n", size, key)
	conn.SetReadDeadline(time.Now().Add(time.Minute))
	line, err := bufio.NewReaderSize(conn, 16).ReadString('\n')
	if err != nil || !strings.Contains(line, " 200 ") {
		t.Fatalf("slow reader %s: got %q, %v, want a 200 status line", key, line, err)
	}
	return conn
}

// TestSlowReaderAtShutdown is scenario 12 (see the package documentation).
func TestSlowReaderAtShutdown(t *testing.T) {
	bin := chaostest.BuildIdem(t)
	readers := chaostest.Size(6, 40)
	for _, control := range []bool{false, true} {
		name := "sigterm"
		if control {
			name = "sigkill control"
		}
		t.Run(name, func(t *testing.T) {
			up := &upstream{execs: make(map[string]int)}
			us := httptest.NewServer(up)
			t.Cleanup(us.Close)
			dir := t.TempDir()
			args := []string{"--upstream", us.URL, "--data", dir, "--lease", lease.String(),
				"--max-response", strconv.Itoa(maxResponse), "--shutdown-timeout", "3s", "--write-timeout", "0"}
			p, addr := chaostest.StartProxy(t, bin, args...)
			var c chaostest.Counters
			sizes := map[string]int{}
			for i := range readers {
				key, size := fmt.Sprintf("slow-%d", i), small
				if i%2 == 1 {
					size = big
				}
				sizes[key] = size
				c.Attempted.Add(1)
				slowReader(t, addr, key, size)
			}
			start := time.Now()
			if control {
				p.Kill()
			} else {
				p.Signal(syscall.SIGTERM)
				if err := p.Wait(time.Minute); err != nil {
					t.Fatalf("the proxy did not exit cleanly: %v\n%s", err, p.Stderr())
				}
			}
			stopped := time.Since(start)
			_, addr = chaostest.StartProxy(t, bin, args...)

			// Every key's retry: its stored response, or 422 for one too
			// large to replay; a 409 while a key is still in progress
			// (the control's) is retried until its lease ends.
			client := &http.Client{Timeout: time.Minute}
			var stored, failed, other int64
			for key, size := range sizes {
				deadline := time.Now().Add(time.Minute)
				for {
					c.Attempted.Add(1)
					req, _ := http.NewRequest(http.MethodPost, fmt.Sprintf("http://%s/pay?n=%d", addr, size), nil)
					req.Header.Set("Idempotency-Key", key)
					res, err := client.Do(req)
					if err != nil {
						t.Fatal(err)
					}
					n, _ := io.Copy(io.Discard, res.Body)
					res.Body.Close()
					if res.StatusCode == http.StatusConflict && time.Now().Before(deadline) {
						time.Sleep(100 * time.Millisecond) // until the lease ends
						continue
					}
					switch {
					case res.StatusCode == 200 && res.Header.Get("Idempotent-Replayed") == "true" && n == int64(size) && res.Header.Get("X-Exec") == "1":
						stored++
						c.Acknowledged.Add(1)
					case res.StatusCode == 422 && size > maxResponse:
						failed++
						c.Acknowledged.Add(1)
					default:
						other++
					}
					break
				}
			}
			var execs, reexec int64
			for key := range sizes {
				n := int64(up.count(key))
				execs += n
				reexec += max(n-1, 0)
			}
			c.Executed.Store(execs)
			c.Effects.Store(int64(len(sizes)))
			c.Duplicated.Store(reexec)
			scenario := "slow reader at shutdown"
			if control {
				scenario += " (SIGKILL control)"
			}
			chaostest.Report(t, scenario, "TestSlowReaderAtShutdown", &c, map[string]string{
				"slow_readers":         strconv.Itoa(readers),
				"stopped_after":        stopped.Round(time.Millisecond).String(),
				"replayed_stored":      strconv.FormatInt(stored, 10),
				"failed_422_too_large": strconv.FormatInt(failed, 10),
				"other_answers":        strconv.FormatInt(other, 10),
				"reexecutions":         strconv.FormatInt(reexec, 10),
			})
			if control {
				if reexec == 0 {
					t.Errorf("control: no key ran again after the kill; the scenario cannot see the fault")
				}
				return
			}
			if reexec != 0 || other != 0 || stored+failed != int64(readers) {
				t.Errorf("after the restart: %d stored, %d failed (too large), %d other answers, %d re-executions; want %d outcomes and no re-execution", stored, failed, other, reexec, readers)
			}
		})
	}
}
