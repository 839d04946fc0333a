package main

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/idemgo/idem/adapterkit"
	"github.com/idemgo/idem/cmd/idem/internal/buildinfo"
	"github.com/idemgo/idem/cmd/idem/internal/cli"
	"github.com/idemgo/idem/idemhttp"
	"github.com/idemgo/idem/idemproxy"
	"github.com/idemgo/idem/keysource"
)

// TestBadInput starts the binary with bad flags, environment and
// surroundings: each must end with one line on stderr, prefixed "idem: ",
// and the exit code of its kind, never a stack trace.
func TestBadInput(t *testing.T) {
	t.Parallel()
	file := filepath.Join(t.TempDir(), "file")
	if err := os.WriteFile(file, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	up := newUpstream(t)
	closed := "http://" + freeAddr(t)
	tests := []struct {
		name string
		env  []string
		args []string
		code int
		want string
	}{
		{"no command", nil, nil, exitUsage, ""},
		{"unknown command", nil, []string{"serve"}, exitUsage, `unknown command "serve"`},
		{"unknown flag", nil, []string{"proxy", "--upstream", up.url(), "--bogus"}, exitUsage, "unknown flag -bogus"},
		{"flag without value", nil, []string{"proxy", "--upstream"}, exitUsage, "flag -upstream needs a value"},
		{"missing upstream", nil, []string{"proxy"}, exitUsage, "--upstream is required"},
		{"bad upstream URL", nil, []string{"proxy", "--upstream", "localhost:9000"}, exitUsage, "invalid --upstream"},
		{"unreachable upstream", nil, []string{"proxy", "--upstream", closed}, exitRuntime, "is not reachable"},
		{"bad redis URL", nil, []string{"proxy", "--upstream", up.url(), "--redis", "localhost:6379"}, exitUsage, "invalid --redis URL"},
		{"redis without scheme", nil, []string{"proxy", "--upstream", up.url(), "--redis", "localhost:6379"}, exitUsage, "add the scheme: --redis redis://localhost:6379"},
		{"upstream without scheme", nil, []string{"proxy", "--upstream", "localhost:9000"}, exitUsage, "add the scheme: --upstream http://localhost:9000"},
		{"unreachable redis", nil, []string{"proxy", "--upstream", up.url(), "--redis", "redis://" + freeAddr(t)}, exitRuntime, "is not reachable"},
		{"redis and cluster", nil, []string{"proxy", "--upstream", up.url(), "--redis", "redis://x:1", "--redis-cluster", "x:1"}, exitUsage, "exclude each other"},
		{"bad cluster address", nil, []string{"proxy", "--upstream", up.url(), "--redis-cluster", "x"}, exitUsage, "want host:port"},
		{"unwritable data dir", nil, []string{"proxy", "--upstream", up.url(), "--data", filepath.Join(file, "sub")}, exitRuntime, "cannot use data directory"},
		{"bad size", nil, []string{"proxy", "--upstream", up.url(), "--max-body", "12XB"}, exitUsage, "not a positive size"},
		{"bad duration", nil, []string{"proxy", "--upstream", up.url(), "--lease", "soon"}, exitUsage, "not a duration"},
		{"retention under lease", nil, []string{"proxy", "--upstream", up.url(), "--lease", "1h", "--retention", "1m"}, exitUsage, "shorter than --lease"},
		{"bad log format", nil, []string{"proxy", "--upstream", up.url(), "--log-format", "xml"}, exitUsage, "invalid --log-format"},
		{"bad method", nil, []string{"proxy", "--upstream", up.url(), "--methods", "PO ST"}, exitUsage, "invalid method"},
		{"bad otel endpoint", nil, []string{"proxy", "--upstream", up.url(), "--otel-endpoint", "collector:4318"}, exitUsage, "invalid --otel-endpoint"},
		{"bad otel endpoint in env", []string{"IDEM_OTEL_ENDPOINT=ftp://collector"}, []string{"proxy", "--upstream", up.url()}, exitUsage, "invalid --otel-endpoint"},
		{"empty otel service name", nil, []string{"proxy", "--upstream", up.url(), "--otel-endpoint", "http://127.0.0.1:4318", "--otel-service-name", ""}, exitUsage, "--otel-service-name is empty"},
		{"stray argument", nil, []string{"proxy", "--upstream", up.url(), "--fail-open", "true"}, exitUsage, `unexpected argument "true"`},
		{"bad env value", []string{"IDEM_LEASE=abc"}, []string{"proxy", "--upstream", up.url()}, exitUsage, "in IDEM_LEASE"},
		{"listen in use", nil, []string{"proxy", "--upstream", up.url(), "--listen", up.srv.Listener.Addr().String(), "--data", t.TempDir()}, exitRuntime, "cannot listen"},
		{"get without key", nil, []string{"get", "--data", t.TempDir()}, exitUsage, "missing KEY"},
		{"get without store", nil, []string{"get", "k", "--data", t.TempDir()}, exitRuntime, "no embedded store"},
		{"get bad key", nil, []string{"get", "k\x01"}, exitUsage, "invalid idempotency key"},
		{"ls bad limit", nil, []string{"ls", "--limit", "0"}, exitUsage, "--limit must be positive"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			p := startIdemEnv(t, tt.env, tt.args...)
			code, stderr := p.wait(), p.stderr.String()
			if code != tt.code {
				t.Errorf("exit code: got %d, want %d (stderr %q)", code, tt.code, stderr)
			}
			if strings.Contains(stderr, "goroutine") || strings.Contains(stderr, "panic") {
				t.Errorf("stderr has a stack trace:\n%s", stderr)
			}
			if tt.want == "" {
				return
			}
			if lines := strings.Count(stderr, "\n"); lines != 1 || !strings.HasPrefix(stderr, "idem: ") || !strings.Contains(stderr, tt.want) {
				t.Errorf("stderr: got %q (%d lines), want one line starting \"idem: \" with %q", stderr, lines, tt.want)
			}
		})
	}
}

func TestHelp(t *testing.T) {
	t.Parallel()
	var out, errOut strings.Builder
	if code := run(t.Context(), []string{"proxy", "--help"}, &out, &errOut, noEnv); code != 0 {
		t.Fatalf("proxy --help: exit %d, stderr %q", code, errOut.String())
	}
	help := out.String()
	if !strings.HasPrefix(help, "Usage: idem proxy --upstream URL [flags]\n") {
		t.Errorf("help starts with %q, want the usage line", strings.SplitN(help, "\n", 2)[0])
	}
	flagLines := 0
	for line := range strings.Lines(help) {
		if strings.HasPrefix(line, "  --") {
			flagLines++
			if !strings.Contains(line, "(") || !strings.Contains(line, "IDEM_") {
				t.Errorf("flag line %q: want its environment variable", line)
			}
		}
	}
	if flagLines < 20 {
		t.Errorf("got %d flag lines, want every flag", flagLines)
	}
	for _, want := range []string{"--listen ADDR", "(default 127.0.0.1:8080, IDEM_LISTEN)", "--max-body SIZE", "(default 1MiB, IDEM_MAX_BODY)", "(default 24h, IDEM_RETENTION)", "--fail-open  "} {
		if !strings.Contains(help, want) {
			t.Errorf("help: want %q in\n%s", want, help)
		}
	}
	var again strings.Builder
	run(t.Context(), []string{"help", "proxy"}, &again, &errOut, noEnv)
	if again.String() != help {
		t.Errorf("help proxy differs from proxy --help")
	}
	out.Reset()
	if code := run(t.Context(), []string{"help"}, &out, &errOut, noEnv); code != 0 || !strings.Contains(out.String(), "  doctor ") {
		t.Errorf("help: got %d %q, want the command list", code, out.String())
	}
	out.Reset()
	if code := run(t.Context(), []string{"version"}, &out, &errOut, noEnv); code != 0 || !strings.HasPrefix(out.String(), "idem ") {
		t.Errorf("version: got %d %q", code, out.String())
	}
}

func noEnv(string) string { return "" }

// TestFlagsFromEnv: every flag has an IDEM_* variable, and the command line
// wins over it.
func TestFlagsFromEnv(t *testing.T) {
	t.Parallel()
	vars := map[string]string{
		"IDEM_LISTEN":        "0.0.0.0:1",
		"IDEM_UPSTREAM":      "http://up:9000",
		"IDEM_MAX_BODY":      "512KiB",
		"IDEM_METHODS":       "post, put",
		"IDEM_FAIL_OPEN":     "true",
		"IDEM_LEASE":         "5s",
		"IDEM_REQUIRE_KEY":   "true",
		"IDEM_SCOPE_HEADER":  "Authorization",
		"IDEM_OTEL_ENDPOINT": "http://collector:4318",
	}
	fs := newFlagSet(proxyCommand())
	c := registerProxyFlags(fs)
	pos, err := fs.Parse([]string{"--listen", "127.0.0.1:2", "--require-key=false"}, func(k string) string { return vars[k] })
	if err != nil || len(pos) != 0 {
		t.Fatalf("parse: %v %q", err, pos)
	}
	p := &c.proxy
	if c.listen != "127.0.0.1:2" || !p.KeyOptional {
		t.Errorf("flags: got listen %q require-key %v, want the command line's 127.0.0.1:2 and false", c.listen, !p.KeyOptional)
	}
	if c.upstream != "http://up:9000" || p.MaxBodySize != 512<<10 || !slices.Equal(p.Methods, []string{"POST", "PUT"}) || !p.FailOpen || c.lease != 5*time.Second || p.ScopeHeader != "Authorization" {
		t.Errorf("env: got upstream %q max-body %d methods %q fail-open %v lease %v scope %q", c.upstream, p.MaxBodySize, p.Methods, p.FailOpen, c.lease, p.ScopeHeader)
	}
	if c.tracing.endpoint != "http://collector:4318" || c.tracing.serviceName != "idem" {
		t.Errorf("tracing: got otel-endpoint %q otel-service-name %q, want http://collector:4318 and idem", c.tracing.endpoint, c.tracing.serviceName)
	}
	if u, err := c.tracing.exportURL(); err != nil || u != "http://collector:4318/v1/traces" {
		t.Errorf("export URL: got %q, %v, want http://collector:4318/v1/traces", u, err)
	}
	if c.retention != 24*time.Hour || c.shutdownTimeout != 30*time.Second {
		t.Errorf("defaults: got retention %v shutdown-timeout %v", c.retention, c.shutdownTimeout)
	}
	for _, name := range fs.Names() {
		if want := "IDEM_" + strings.ToUpper(strings.ReplaceAll(name, "-", "_")); cli.EnvName(name) != want {
			t.Errorf("cli.EnvName(%q): got %q, want %q", name, cli.EnvName(name), want)
		}
	}
}

// TestProxyFlagDefaults: the defaults of the flags that set fields of
// idemproxy.Proxy are the defaults of the library (a zero Proxy's), so
// that the binary and a program that embeds the proxy behave alike.
func TestProxyFlagDefaults(t *testing.T) {
	t.Parallel()
	c := registerProxyFlags(newFlagSet(proxyCommand()))
	p := &c.proxy
	for _, tc := range []struct {
		field    string
		got, lib any
	}{
		{"Methods", p.Methods, []string{http.MethodPost, http.MethodPatch}},
		{"KeyOptional", p.KeyOptional, false},
		{"MaxBodySize", p.MaxBodySize, int64(idemhttp.DefaultMaxBodySize)},
		{"MaxResponseSize", p.MaxResponseSize, adapterkit.DefaultMaxResultSize},
		{"MaxBodyMemory", p.MaxBodyMemory, int64(idemproxy.DefaultMaxBodyMemory)},
		{"MaxConcurrent", p.MaxConcurrent, idemproxy.DefaultMaxConcurrent},
		{"BodyTimeout", p.BodyTimeout, idemproxy.DefaultBodyTimeout},
		{"UpstreamTimeout", p.UpstreamTimeout, idemproxy.DefaultUpstreamTimeout},
		{"WriteTimeout", p.WriteTimeout, idemproxy.DefaultWriteTimeout},
		{"FenceHeader", p.FenceHeader, idemproxy.DefaultFenceHeader},
		{"DisableFence", p.DisableFence, false},
		{"ProblemTypeBase", p.ProblemTypeBase, idemhttp.DefaultProblemTypeBase},
		{"ScopeHeader", p.ScopeHeader, ""},
		{"Wait", p.Wait, time.Duration(0)},
		{"FailOpen", p.FailOpen, false},
		{"StreamAll", p.StreamAll, false},
		{"KeySource", p.KeySource, keysource.Source{}},
		{"Fingerprint", p.Fingerprint, keysource.Fingerprint{}},
	} {
		if fmt.Sprint(tc.got) != fmt.Sprint(tc.lib) {
			t.Errorf("%s: the flag's default is %v, the library's %v", tc.field, tc.got, tc.lib)
		}
	}
	// The flags' 0 lifts a bound: the field's negative value.
	fs := newFlagSet(proxyCommand())
	c = registerProxyFlags(fs)
	if _, err := fs.Parse([]string{"--max-concurrent", "0", "--body-timeout", "0", "--write-timeout", "0", "--upstream-timeout", "0", "--fence-header="}, noEnv); err != nil {
		t.Fatal(err)
	}
	if p := &c.proxy; p.MaxConcurrent >= 0 || p.BodyTimeout >= 0 || p.WriteTimeout >= 0 || p.UpstreamTimeout >= 0 || !p.DisableFence {
		t.Errorf("0 flags: got %d %v %v %v fence off %v, want negative bounds and the fence off", p.MaxConcurrent, p.BodyTimeout, p.WriteTimeout, p.UpstreamTimeout, p.DisableFence)
	}
}

// TestProxyInProcess runs the proxy inside the test process, so that the
// race detector sees its code: concurrent requests, a client that goes
// away, an upstream that answers 502 itself, a response that breaks off,
// and a shutdown by context.
func TestProxyInProcess(t *testing.T) {
	t.Parallel()
	up := newUpstream(t)
	addr, admin := freeAddr(t), freeAddr(t)
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	var stdout, stderr syncBuffer
	exited := make(chan int, 1)
	go func() {
		exited <- run(ctx, []string{"proxy", "--listen", addr, "--admin-listen", admin, "--upstream", up.url(),
			"--data", t.TempDir(), "--lease", "600ms", "--log-format", "json"}, &stdout, &stderr, noEnv)
	}()
	deadline := time.Now().Add(readyTimeout)
	for {
		res, err := http.Get("http://" + admin + "/readyz")
		if err == nil {
			res.Body.Close()
			if res.StatusCode == 200 {
				break
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("proxy not ready: %v\n%s", err, stderr.String())
		}
		time.Sleep(20 * time.Millisecond) // poll until the proxy serves
	}
	url := "http://" + addr + "/items"

	t.Run("concurrent", func(t *testing.T) {
		done := make(chan int, 30)
		for range 30 {
			go func() { done <- post(t, url, "c", "x", "X-Test-Sleep", "200ms").status }()
		}
		for range 30 {
			if s := <-done; s != 201 && s != 409 {
				t.Errorf("got %d, want 201 or 409", s)
			}
		}
		if n := up.executions("c"); n != 1 {
			t.Errorf("executions: got %d, want 1", n)
		}
	})

	t.Run("client gone", func(t *testing.T) {
		// The client gives up before the upstream answers; the upstream
		// call goes on and its response is stored for the retry.
		rctx, rcancel := context.WithTimeout(t.Context(), 100*time.Millisecond)
		defer rcancel()
		req, _ := http.NewRequestWithContext(rctx, http.MethodPost, url, strings.NewReader("x"))
		req.Header.Set("Idempotency-Key", "gone")
		req.Header.Set("X-Test-Sleep", "400ms")
		if res, err := client.Do(req); err == nil {
			res.Body.Close()
			t.Fatalf("got %d, want the client to time out", res.StatusCode)
		}
		time.Sleep(500 * time.Millisecond) // the upstream finishes
		res := post(t, url, "gone", "x")
		if !res.replayed() || res.body != "execution 1 of gone: x" {
			t.Errorf("retry: got %d %q replayed=%v, want the stored response", res.status, res.body, res.replayed())
		}
	})

	t.Run("no body", func(t *testing.T) {
		// The key reaches the upstream (under a lower-case name, so that
		// the transport never resends the request).
		first := post(t, url, "nobody", "")
		second := post(t, url, "nobody", "")
		if first.body != "execution 1 of nobody: " || !second.replayed() || up.executions("nobody") != 1 {
			t.Errorf("got %q then replayed=%v after %d executions, want execution 1 replayed", first.body, second.replayed(), up.executions("nobody"))
		}
	})

	t.Run("upstream 502", func(t *testing.T) {
		// A 502 from the upstream itself is an answer: stored, replayed.
		first := post(t, url, "u502", "x", "X-Test-Status", "502")
		second := post(t, url, "u502", "x")
		if first.status != 502 || second.status != 502 || !second.replayed() || up.executions("u502") != 1 {
			t.Errorf("got %d then %d replayed=%v after %d executions, want 502 replayed after 1", first.status, second.status, second.replayed(), up.executions("u502"))
		}
	})

	t.Run("hang-up", func(t *testing.T) {
		// The upstream read the request and closed the connection without
		// an answer: it may have acted, so 502 and the key is left to its
		// lease.
		res := post(t, url, "hangup", "x", "X-Test-Hangup", "1")
		if res.status != 502 || res.header.Get("Retry-After") != "1" || !strings.Contains(res.body, "after the request was sent") {
			t.Errorf("got %d Retry-After %q %q, want 502 with Retry-After 1", res.status, res.header.Get("Retry-After"), res.body)
		}
		if res := post(t, url, "hangup", "x"); res.status != 409 {
			t.Errorf("retry during the lease: got %d, want 409", res.status)
		}
	})

	t.Run("broken response", func(t *testing.T) {
		// The upstream acted and its response broke off: the client's
		// connection is aborted, and the key is left to its lease.
		req, _ := http.NewRequest(http.MethodPost, url, strings.NewReader("x"))
		req.Header.Set("Idempotency-Key", "broken")
		req.Header.Set("X-Test-Break", "1")
		if res, err := client.Do(req); err == nil {
			_, rerr := readAll(res)
			if rerr == nil {
				t.Errorf("got a whole %d response, want it cut off", res.StatusCode)
			}
		}
		if res := post(t, url, "broken", "x"); res.status != 409 {
			t.Errorf("retry during the lease: got %d, want 409", res.status)
		}
		time.Sleep(700 * time.Millisecond) // the lease ends
		if res := post(t, url, "broken", "x"); res.status != 201 || res.body != "execution 2 of broken: x" {
			t.Errorf("retry after the lease: got %d %q, want execution 2", res.status, res.body)
		}
	})

	cancel()
	select {
	case code := <-exited:
		if code != 0 {
			t.Errorf("exit code: got %d, want 0\n%s", code, stderr.String())
		}
	case <-time.After(exitTimeout):
		t.Fatal("the proxy did not stop")
	}
	if !strings.Contains(stderr.String(), `"msg":"idem proxy stopped"`) {
		t.Errorf("log: got %s, want a JSON stop line", stderr.String())
	}
}

// TestVersionStamped: the version, commit, date and dirty flag that make
// sets at link time are what `idem version` prints, as a line and with
// --json as one JSON object.
func TestVersionStamped(t *testing.T) {
	old := [4]string{buildVersion, buildCommit, buildDate, buildDirty}
	t.Cleanup(func() { buildVersion, buildCommit, buildDate, buildDirty = old[0], old[1], old[2], old[3] })
	for _, tc := range []struct {
		name, version, dirty string
		wantLine             string
		wantDirty            bool
	}{
		{"clean", "v1.2.3", "false", "idem v1.2.3 (commit 0123456789ab, built 2026-01-02T03:04:05Z, ", false},
		{"dirty from describe", "v1.2.3-dirty", "true", "idem v1.2.3-dirty (commit 0123456789ab, built 2026-01-02T03:04:05Z, ", true},
		{"dirty, version given", "v1.2.3", "true", "idem v1.2.3 (commit 0123456789ab, dirty, built 2026-01-02T03:04:05Z, ", true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			buildVersion, buildCommit, buildDate, buildDirty = tc.version, "0123456789abcdef0123", "2026-01-02T03:04:05Z", tc.dirty
			var out, errOut strings.Builder
			if code := run(t.Context(), []string{"version"}, &out, &errOut, noEnv); code != 0 {
				t.Fatalf("version: exit %d, %s", code, errOut.String())
			}
			if !strings.HasPrefix(out.String(), tc.wantLine) {
				t.Errorf("version: got %q, want it to start with %q", out.String(), tc.wantLine)
			}
			out.Reset()
			if code := run(t.Context(), []string{"version", "--json"}, &out, &errOut, noEnv); code != 0 {
				t.Fatalf("version --json: exit %d, %s", code, errOut.String())
			}
			var got buildinfo.Info
			if err := json.Unmarshal([]byte(out.String()), &got); err != nil {
				t.Fatalf("version --json: %v in %q", err, out.String())
			}
			want := buildinfo.Info{Version: tc.version, Commit: "0123456789abcdef0123", Dirty: tc.wantDirty,
				Date: "2026-01-02T03:04:05Z", Go: runtime.Version(), Platform: runtime.GOOS + "/" + runtime.GOARCH}
			if got != want {
				t.Errorf("version --json: got %+v, want %+v", got, want)
			}
		})
	}
}
