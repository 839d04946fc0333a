package main

import (
	"bytes"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/idemgo/idem/testkit/redistest"
)

// idemBin is the binary built once by TestMain.
var idemBin string

func TestMain(m *testing.M) {
	if addr := os.Getenv("IDEM_TEST_EFFECT_HANDLER"); addr != "" {
		runEffectHandler(addr) // this binary as a handler process (consume_takeover_e2e_test.go)
		return
	}
	dir, err := os.MkdirTemp("", "idem-e2e-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	// Others may run the binary (runAsOther runs it as nobody when the
	// tests run as root); MkdirTemp made the directory private.
	if err := os.Chmod(dir, 0o755); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	idemBin = filepath.Join(dir, "idem")
	args := []string{"build", "-o", idemBin}
	if raceEnabled {
		args = append(args, "-race")
	}
	build := exec.Command("go", append(args, ".")...)
	build.Dir = sourceDir()
	out, err := build.CombinedOutput()
	if err != nil {
		fmt.Fprintf(os.Stderr, "building the idem binary: %v\n%s", err, out)
		os.RemoveAll(dir)
		os.Exit(1)
	}
	code := m.Run()
	os.RemoveAll(dir)
	os.Exit(code)
}

// sourceDir is the directory this test binary was compiled from, so that
// a binary copied elsewhere and run from another tree (a benchmark's
// before and after, alternated) builds and runs its own tree's idem, not
// the working directory's; "" (the working directory, as go test sets
// it) when the binary was built with -trimpath.
func sourceDir() string {
	_, file, _, ok := runtime.Caller(0)
	if !ok || !filepath.IsAbs(file) {
		return ""
	}
	return filepath.Dir(file)
}

// Bounds of the waits in the tests.
const (
	readyTimeout = 10 * time.Second
	exitTimeout  = 15 * time.Second
)

var handedOut struct {
	sync.Mutex
	ports map[int]bool
}

// freeAddr returns a loopback address whose port is free now and was not
// handed out before in this process (a restarted proxy reuses its own).
func freeAddr(t *testing.T) string {
	t.Helper()
	handedOut.Lock()
	defer handedOut.Unlock()
	for range 100 {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		port := l.Addr().(*net.TCPAddr).Port
		l.Close()
		if handedOut.ports == nil {
			handedOut.ports = make(map[int]bool)
		}
		if !handedOut.ports[port] {
			handedOut.ports[port] = true
			return l.Addr().String()
		}
	}
	t.Fatal("no free port")
	return ""
}

// syncBuffer is a bytes.Buffer safe for concurrent use.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// proc is a running idem process.
type proc struct {
	t      *testing.T
	args   []string
	cmd    *exec.Cmd
	stdout *syncBuffer
	stderr *syncBuffer
	done   chan struct{}
	code   int // exit code, once done is closed; -1 for a signal

	addr  string // --listen, for a proxy
	admin string // --admin-listen, for a proxy
}

// testEnv is the environment of the processes the tests start: the test's
// own, without IDEM_* variables. A binary built with the race detector
// would sleep a second at exit; it is told not to.
func testEnv() []string {
	var out []string
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "IDEM_") && !strings.HasPrefix(kv, "GORACE=") {
			out = append(out, kv)
		}
	}
	return append(out, "GORACE=atexit_sleep_ms=0")
}

// startIdem starts the binary with args. It is killed, by its PID, when
// the test ends; its stderr is logged if the test failed.
func startIdem(t *testing.T, args ...string) *proc {
	t.Helper()
	return startIdemEnv(t, nil, args...)
}

// startIdemEnv is startIdem with extra environment variables.
func startIdemEnv(t *testing.T, env []string, args ...string) *proc {
	t.Helper()
	p := &proc{t: t, args: args, stdout: &syncBuffer{}, stderr: &syncBuffer{}, done: make(chan struct{})}
	p.cmd = exec.Command(idemBin, args...)
	p.cmd.Env = append(testEnv(), env...)
	p.cmd.Stdout, p.cmd.Stderr = p.stdout, p.stderr
	p.cmd.SysProcAttr = sysProcAttr()
	if err := p.cmd.Start(); err != nil {
		t.Fatalf("start idem %q: %v", args, err)
	}
	go func() {
		err := p.cmd.Wait()
		p.code = p.cmd.ProcessState.ExitCode()
		_ = err
		close(p.done)
	}()
	t.Cleanup(func() {
		select {
		case <-p.done:
		default:
			_ = p.cmd.Process.Kill()
			<-p.done
		}
		if strings.Contains(p.stderr.String(), "DATA RACE") {
			t.Errorf("the race detector found a data race in idem %s", strings.Join(args, " "))
		}
		if t.Failed() {
			t.Logf("idem %s stderr:\n%s", strings.Join(args, " "), p.stderr.String())
		}
	})
	return p
}

// startProxy starts `idem proxy` in front of upstream with the store
// arguments and extra flags, on fresh ports, and waits until its /healthz
// answers.
func startProxy(t *testing.T, upstream string, storeArgs []string, extra ...string) *proc {
	t.Helper()
	addr, admin := freeAddr(t), freeAddr(t)
	args := append([]string{"proxy", "--listen", addr, "--admin-listen", admin, "--upstream", upstream}, storeArgs...)
	args = append(args, extra...)
	return launchProxy(t, args, addr, admin)
}

func launchProxy(t *testing.T, args []string, addr, admin string) *proc {
	t.Helper()
	return launchProxyEnv(t, nil, args, addr, admin)
}

// launchProxyEnv is launchProxy with extra environment variables.
func launchProxyEnv(t *testing.T, env, args []string, addr, admin string) *proc {
	t.Helper()
	p := startIdemEnv(t, env, args...)
	p.addr, p.admin = addr, admin
	deadline := time.Now().Add(readyTimeout)
	for {
		res, err := http.Get("http://" + admin + "/healthz")
		if err == nil {
			res.Body.Close()
			if res.StatusCode == 200 {
				return p
			}
		}
		select {
		case <-p.done:
			t.Fatalf("idem proxy exited with code %d before it was ready:\n%s", p.code, p.stderr.String())
		default:
		}
		if time.Now().After(deadline) {
			t.Fatalf("idem proxy not ready after %v:\n%s", readyTimeout, p.stderr.String())
		}
		time.Sleep(20 * time.Millisecond) // poll /healthz until the proxy serves
	}
}

// restart starts the proxy again with the same arguments and ports; the
// previous process must have exited.
func (p *proc) restart() *proc {
	p.t.Helper()
	return launchProxy(p.t, p.args, p.addr, p.admin)
}

func (p *proc) url(path string) string { return "http://" + p.addr + path }

// kill sends SIGKILL and waits for the exit.
func (p *proc) kill() {
	p.t.Helper()
	_ = p.cmd.Process.Kill()
	p.wait()
}

// terminate sends SIGTERM; wait for the exit with wait.
func (p *proc) terminate() {
	p.t.Helper()
	if err := p.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		p.t.Fatal(err)
	}
}

// wait waits for the process to exit and returns its exit code.
func (p *proc) wait() int {
	p.t.Helper()
	select {
	case <-p.done:
		return p.code
	case <-time.After(exitTimeout):
		p.t.Fatalf("idem did not exit within %v", exitTimeout)
		return 0
	}
}

// runIdem runs the binary to its end and returns its exit code and output.
func runIdem(t *testing.T, args ...string) (code int, stdout, stderr string) {
	t.Helper()
	p := startIdem(t, args...)
	code = p.wait()
	return code, p.stdout.String(), p.stderr.String()
}

// upstream is the API behind the proxy in the tests: it counts executions
// per Idempotency-Key and answers 201 "execution N of KEY: BODY". A request
// with X-Test-Sleep: DURATION takes that long (the header is not part of
// the fingerprint, so a retry without it is the same request).
type upstream struct {
	mu      sync.Mutex
	counts  map[string]int
	started chan string // the key of every request, when it starts
	srv     *httptest.Server
}

func newUpstream(t *testing.T) *upstream {
	u := &upstream{counts: make(map[string]int), started: make(chan string, 1000)}
	u.srv = httptest.NewServer(u)
	t.Cleanup(u.srv.Close)
	return u
}

// restartAt serves the upstream again on addr, after its server was
// closed.
func (u *upstream) restartAt(t *testing.T, addr string) {
	t.Helper()
	var l net.Listener
	var err error
	for range 50 {
		if l, err = net.Listen("tcp", addr); err == nil {
			break
		}
		time.Sleep(20 * time.Millisecond) // the port may linger for a moment
	}
	if err != nil {
		t.Fatal(err)
	}
	u.srv = &httptest.Server{Listener: l, Config: &http.Server{Handler: u}}
	u.srv.Start()
	t.Cleanup(u.srv.Close)
}

func (u *upstream) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	key := r.Header.Get("Idempotency-Key")
	body, _ := io.ReadAll(r.Body)
	u.mu.Lock()
	u.counts[key]++
	n := u.counts[key]
	u.mu.Unlock()
	u.started <- key
	if d, err := time.ParseDuration(r.Header.Get("X-Test-Sleep")); err == nil {
		select {
		case <-time.After(d):
		case <-r.Context().Done():
			return
		}
	}
	w.Header().Set("Content-Type", "text/plain")
	w.Header().Set("X-Upstream", "yes")
	if r.Header.Get("X-Test-Hangup") != "" {
		// Read the request, then drop the connection without an answer.
		if conn, _, err := http.NewResponseController(w).Hijack(); err == nil {
			conn.Close()
		}
		return
	}
	if r.Header.Get("X-Test-Break") != "" {
		// Promise 100 bytes, send 10, and drop the connection.
		w.Header().Set("Content-Length", "100")
		w.WriteHeader(http.StatusCreated)
		io.WriteString(w, "0123456789")
		http.NewResponseController(w).Flush()
		if conn, _, err := http.NewResponseController(w).Hijack(); err == nil {
			conn.Close()
		}
		return
	}
	status := http.StatusCreated
	if s, err := strconv.Atoi(r.Header.Get("X-Test-Status")); err == nil {
		status = s
	}
	w.WriteHeader(status)
	fmt.Fprintf(w, "execution %d of %s: %s", n, key, body)
}

func readAll(res *http.Response) ([]byte, error) {
	defer res.Body.Close()
	return io.ReadAll(res.Body)
}

func (u *upstream) executions(key string) int {
	u.mu.Lock()
	defer u.mu.Unlock()
	return u.counts[key]
}

func (u *upstream) url() string { return u.srv.URL }

// response is what send got back.
type response struct {
	status int
	header http.Header
	body   string
}

func (r response) replayed() bool { return r.header.Get("Idempotent-Replayed") == "true" }

// client sends the tests' requests, on a new connection each time, so that
// a restarted proxy is reached afresh.
var client = &http.Client{
	Timeout:   30 * time.Second,
	Transport: &http.Transport{DisableKeepAlives: true},
}

// send sends a request with an Idempotency-Key (none if key is "") and the
// extra header fields given as name, value pairs.
func send(t *testing.T, method, url, key, body string, header ...string) response {
	t.Helper()
	req, err := http.NewRequest(method, url, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	if key != "" {
		req.Header.Set("Idempotency-Key", key)
	}
	for i := 0; i+1 < len(header); i += 2 {
		req.Header.Set(header[i], header[i+1])
	}
	res, err := client.Do(req)
	if err != nil {
		t.Errorf("%s %s: %v", method, url, err)
		return response{}
	}
	defer res.Body.Close()
	b, err := io.ReadAll(res.Body)
	if err != nil {
		t.Errorf("%s %s: reading the body: %v", method, url, err)
	}
	return response{status: res.StatusCode, header: res.Header, body: string(b)}
}

func post(t *testing.T, url, key, body string, header ...string) response {
	t.Helper()
	return send(t, http.MethodPost, url, key, body, header...)
}

// metric returns the value of one sample of the proxy's /metrics, -1 if it
// is not there.
func (p *proc) metric(name string) float64 {
	p.t.Helper()
	res, err := http.Get("http://" + p.admin + "/metrics")
	if err != nil {
		p.t.Fatal(err)
	}
	defer res.Body.Close()
	b, _ := io.ReadAll(res.Body)
	for line := range strings.Lines(string(b)) {
		if v, ok := strings.CutPrefix(strings.TrimSpace(line), name+" "); ok {
			f, err := strconv.ParseFloat(v, 64)
			if err != nil {
				p.t.Fatalf("metric %s: %v", name, err)
			}
			return f
		}
	}
	return -1
}

// storeKind is a store the proxy runs on in the tests.
type storeKind struct {
	name string
	// args returns the store flags of a fresh store.
	args func(t *testing.T) []string
}

var storeKinds = []storeKind{
	{"embedded", func(t *testing.T) []string { return []string{"--data", t.TempDir()} }},
	{"redis", func(t *testing.T) []string {
		srv := redistest.Start(t, "--appendonly", "yes")
		return []string{"--redis", "redis://" + srv.Addr()}
	}},
}

// forEachStore runs fn as a parallel subtest on each store kind.
func forEachStore(t *testing.T, fn func(t *testing.T, sk storeKind)) {
	t.Parallel()
	for _, sk := range storeKinds {
		t.Run(sk.name, func(t *testing.T) {
			t.Parallel()
			fn(t, sk)
		})
	}
}
