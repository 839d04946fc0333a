package abuse

import (
	"bufio"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/idemgo/idem/chaos/chaostest"
	"github.com/idemgo/idem/testkit/redistest"
)

// store is one store the proxy runs on in these tests.
type store struct {
	name string
	// start returns the proxy's store flags and a function that counts
	// the records in the store (for the embedded store, only once the
	// proxy has stopped: the file is locked while it runs).
	start func(t *testing.T, bin string) (args []string, count func(t *testing.T) int)
}

var stores = []store{
	{"embedded", func(t *testing.T, bin string) ([]string, func(t *testing.T) int) {
		dir := t.TempDir()
		return []string{"--data", dir}, func(t *testing.T) int {
			t.Helper()
			return countEmbedded(t, bin, dir)
		}
	}},
	{"redis", func(t *testing.T, bin string) ([]string, func(t *testing.T) int) {
		srv := redistest.Start(t)
		return []string{"--redis", "redis://" + srv.Addr()}, func(t *testing.T) int {
			t.Helper()
			n, err := strconv.Atoi(srv.Do(t, "DBSIZE"))
			if err != nil {
				t.Fatalf("DBSIZE: %v", err)
			}
			return n
		}
	}},
}

// countEmbedded counts the records of the embedded store in dir with
// `idem ls`.
func countEmbedded(t *testing.T, bin, dir string) int {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
	defer cancel()
	var stderr strings.Builder
	cmd := exec.CommandContext(ctx, bin, "ls", "--data", dir, "--limit", "10000000")
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("idem ls: %v\n%s", err, stderr.String())
	}
	return max(strings.Count(string(out), "\n")-1, 0) // without the header line
}

// proxy is a running `idem proxy`.
type proxy struct {
	p    *chaostest.Proc
	addr string
}

func startProxy(t *testing.T, bin, upstream string, storeArgs []string, extra ...string) *proxy {
	t.Helper()
	args := append([]string{"--upstream", upstream}, storeArgs...)
	p, addr := chaostest.StartProxy(t, bin, append(args, extra...)...)
	return &proxy{p: p, addr: addr}
}

func (p *proxy) url(path string) string { return "http://" + p.addr + path }

// stop sends SIGTERM and waits for a clean exit.
func (p *proxy) stop(t *testing.T) {
	t.Helper()
	p.p.Signal(syscall.SIGTERM)
	if err := p.p.Wait(time.Minute); err != nil {
		t.Fatalf("idem proxy did not exit cleanly after SIGTERM: %v", err)
	}
}

// alive checks that the process runs.
func (p *proxy) alive(t *testing.T) {
	t.Helper()
	if p.p.Exited() {
		t.Fatalf("the proxy exited:\n%s", p.p.Stderr())
	}
}

// memory is what /proc/<pid>/status says of a process, in KiB.
type memory struct{ rss, hwm, anon int64 }

func (m memory) String() string {
	return fmt.Sprintf("rss=%s hwm=%s anon=%s", mib(m.rss), mib(m.hwm), mib(m.anon))
}

func mib(kib int64) string { return fmt.Sprintf("%.1fMiB", float64(kib)/1024) }

func (p *proxy) memory(t *testing.T) memory {
	t.Helper()
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", p.p.Pid()))
	if err != nil {
		t.Fatalf("reading the proxy's memory: %v (this test needs Linux /proc)", err)
	}
	var m memory
	for line := range strings.Lines(string(b)) {
		name, rest, ok := strings.Cut(line, ":")
		if !ok {
			continue
		}
		f := strings.Fields(rest)
		if len(f) == 0 {
			continue
		}
		n, _ := strconv.ParseInt(f[0], 10, 64)
		switch name {
		case "VmRSS":
			m.rss = n
		case "VmHWM":
			m.hwm = n
		case "RssAnon":
			m.anon = n
		}
	}
	return m
}

// upstream is the API behind the proxy. Every call is an execution. It
// gives each principal (the Authorization value) a random nonce and puts it
// in every response it makes for that principal, so that a response that
// reaches another principal is recognized. GET /big?n=N answers N bytes.
type upstream struct {
	srv   *httptest.Server
	calls atomic.Int64

	mu     sync.Mutex
	nonces map[string]string // by principal
	execs  map[string]int    // by principal + "\x00" + key
}

func newUpstream(t *testing.T) *upstream {
	u := &upstream{nonces: make(map[string]string), execs: make(map[string]int)}
	u.srv = httptest.NewServer(u)
	t.Cleanup(u.srv.Close)
	return u
}

// answer is the body of the upstream's responses.
type answer struct {
	Nonce string `json:"nonce"`
	Key   string `json:"key"`
	Exec  int64  `json:"exec"`
	Body  string `json:"body"`
}

func (u *upstream) nonce(principal string) string {
	u.mu.Lock()
	defer u.mu.Unlock()
	n, ok := u.nonces[principal]
	if !ok {
		n = rand.Text()
		u.nonces[principal] = n
	}
	return n
}

func (u *upstream) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	body, _ := io.ReadAll(r.Body)
	exec := u.calls.Add(1)
	principal, key := r.Header.Get("Authorization"), r.Header.Get("Idempotency-Key")
	nonce := u.nonce(principal)
	u.mu.Lock()
	u.execs[principal+"\x00"+key]++
	u.mu.Unlock()
	if r.URL.Path == "/big" {
		n, _ := strconv.Atoi(r.URL.Query().Get("n"))
		w.Header().Set("Content-Type", "application/octet-stream")
		w.WriteHeader(http.StatusOK)
		buf := make([]byte, 32<<10)
		for n > 0 {
			k, err := w.Write(buf[:min(n, len(buf))])
			if err != nil {
				return
			}
			n -= k
		}
		return
	}
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(http.StatusCreated)
	json.NewEncoder(w).Encode(answer{Nonce: nonce, Key: key, Exec: exec, Body: string(body)})
}

// executions returns how often the upstream ran principal's key.
func (u *upstream) executions(principal, key string) int {
	u.mu.Lock()
	defer u.mu.Unlock()
	return u.execs[principal+"\x00"+key]
}

// client is an HTTP client for many concurrent requests to one proxy.
func newClient(t *testing.T) *http.Client {
	tr := &http.Transport{MaxIdleConns: 256, MaxIdleConnsPerHost: 256, IdleConnTimeout: 30 * time.Second}
	t.Cleanup(tr.CloseIdleConnections)
	return &http.Client{Transport: tr, Timeout: 2 * time.Minute}
}

// response is a response read to its end.
type response struct {
	status int
	header http.Header
	body   []byte
}

func (r response) replayed() bool { return r.header.Get("Idempotent-Replayed") == "true" }

func (r response) problem() bool {
	return strings.HasPrefix(r.header.Get("Content-Type"), "application/problem+json")
}

// post sends a POST with an Idempotency-Key and headers given as name,
// value pairs.
func post(c *http.Client, url, key, body string, header ...string) (response, error) {
	req, err := http.NewRequest(http.MethodPost, url, strings.NewReader(body))
	if err != nil {
		return response{}, err
	}
	if key != "" {
		req.Header.Set("Idempotency-Key", key)
	}
	for i := 0; i+1 < len(header); i += 2 {
		req.Header.Set(header[i], header[i+1])
	}
	res, err := c.Do(req)
	if err != nil {
		return response{}, err
	}
	defer res.Body.Close()
	b, err := io.ReadAll(res.Body)
	return response{status: res.StatusCode, header: res.Header, body: b}, err
}

// raw writes head (a request line and header fields, CRLF-separated,
// without the blank line) and then body (nil: none) on a new connection,
// and returns the response, read while the body is still being written.
// written reports how many body bytes the proxy accepted before the
// response came.
func raw(addr, head string, body io.Reader) (res response, written int64, err error) {
	conn, err := net.DialTimeout("tcp", addr, 10*time.Second)
	if err != nil {
		return response{}, 0, err
	}
	defer conn.Close()
	conn.SetDeadline(time.Now().Add(2 * time.Minute))
	var n atomic.Int64
	done := make(chan struct{})
	go func() {
		defer close(done)
		if _, err := io.WriteString(conn, head+"\r\n\r\n"); err != nil {
			return
		}
		if body != nil {
			buf := make([]byte, 64<<10)
			for {
				k, rerr := body.Read(buf)
				if k > 0 {
					if _, werr := conn.Write(buf[:k]); werr != nil {
						return
					}
					n.Add(int64(k))
				}
				if rerr != nil {
					return
				}
			}
		}
	}()
	hr, err := http.ReadResponse(bufio.NewReader(conn), nil)
	written = n.Load()
	if err != nil {
		return response{}, written, err
	}
	b, _ := io.ReadAll(io.LimitReader(hr.Body, 1<<20))
	hr.Body.Close()
	conn.Close() // stops the writer
	<-done
	return response{status: hr.StatusCode, header: hr.Header, body: b}, written, nil
}

// zeros is a generator of size bytes, never held in memory.
type zeros struct{ left int64 }

func (z *zeros) Read(p []byte) (int, error) {
	if z.left <= 0 {
		return 0, io.EOF
	}
	n := int(min(int64(len(p)), z.left))
	clear(p[:n])
	z.left -= int64(n)
	return n, nil
}

// chunked encodes a body from r in the chunked transfer coding.
type chunked struct {
	r    io.Reader
	buf  []byte
	done bool
}

func (c *chunked) Read(p []byte) (int, error) {
	for len(c.buf) == 0 {
		if c.done {
			return 0, io.EOF
		}
		chunk := make([]byte, 32<<10)
		n, err := c.r.Read(chunk)
		if n > 0 {
			c.buf = append(fmt.Appendf(nil, "%x\r\n", n), chunk[:n]...)
			c.buf = append(c.buf, "\r\n"...)
		}
		if err == io.EOF {
			c.buf = append(c.buf, "0\r\n\r\n"...)
			c.done = true
		} else if err != nil {
			return 0, err
		}
	}
	n := copy(p, c.buf)
	c.buf = c.buf[n:]
	return n, nil
}

func randomKey() string {
	var b [12]byte
	rand.Read(b[:])
	return hex.EncodeToString(b[:])
}

// parallel runs fn(i) for i in [0, n) on workers goroutines and returns the
// first error.
func parallel(n, workers int, fn func(i int) error) error {
	var next atomic.Int64
	var first error
	var once sync.Once
	var wg sync.WaitGroup
	for range workers {
		wg.Go(func() {
			for {
				i := int(next.Add(1) - 1)
				if i >= n {
					return
				}
				if err := fn(i); err != nil {
					once.Do(func() { first = err })
					next.Store(int64(n)) // stop the others
					return
				}
			}
		})
	}
	wg.Wait()
	return first
}

// command is the command that reproduces test in the variant that runs.
func command(test string) string {
	if chaostest.Long() {
		return "make chaos-long RUN=" + test
	}
	return "make chaos RUN=" + test
}
