package main

import (
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"github.com/idemgo/idem/boltstore"
)

// TestEmbeddedStoreNotReadable: get, ls and doctor on an embedded store the
// user may not read say that they cannot read it (permission denied), not
// that there is no store.
func TestEmbeddedStoreNotReadable(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name string
		deny func(t *testing.T, dir string) // makes the store unreadable to runAsOther
	}{
		// The proxy creates --data private to its user (0700).
		{"private directory", func(t *testing.T, dir string) { chmod(t, dir, 0o700, 0) }},
		{"private file", func(t *testing.T, dir string) { chmod(t, filepath.Join(dir, dataFile), 0o600, 0) }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			dir := filepath.Join(t.TempDir(), "data")
			if err := os.Mkdir(dir, 0o755); err != nil {
				t.Fatal(err)
			}
			st, err := boltstore.Open(filepath.Join(dir, dataFile))
			if err != nil {
				t.Fatal(err)
			}
			st.Close()
			tc.deny(t, dir)
			for _, args := range [][]string{{"get", "k"}, {"ls"}, {"rm", "k"}} {
				code, _, stderr := runAsOther(t, append(args, "--data", dir)...)
				if code != 1 || !strings.Contains(stderr, "cannot read the embedded store") || !strings.Contains(stderr, "permission denied") ||
					strings.Contains(stderr, "no embedded store") {
					t.Errorf("%s: got %d %q, want 1 and that it cannot read the store (permission denied)", args[0], code, stderr)
				}
			}
			code, out, _ := runAsOther(t, "doctor", "--data", dir)
			if code != 1 || !strings.Contains(out, "FAIL  embedded store: cannot read the embedded store") {
				t.Errorf("doctor: got %d\n%s\nwant 1 and a FAIL that it cannot read the store", code, out)
			}
		})
	}
}

// chmod sets the mode of path to mode, or to other when the tests run as
// a user that root's rights would not stop (runAsOther runs as another
// user then), and restores it when the test ends.
func chmod(t *testing.T, path string, mode, other os.FileMode) {
	t.Helper()
	if os.Geteuid() != 0 {
		mode = other
	}
	if err := os.Chmod(path, mode); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.Chmod(path, 0o755) })
}

// runAsOther runs the binary to its end as a user other than the owner of
// the test's files when the tests run as root (nobody, uid 65534, running
// TestMain's binary, whose directory TestMain opened to others), and as the
// test's user otherwise (chmod took the rights away then).
//
// The binary is run where TestMain built it, not from a copy: writing an
// executable while parallel tests fork lets a child inherit the open file,
// and exec of it then fails with "text file busy" (ETXTBSY).
func runAsOther(t *testing.T, args ...string) (code int, stdout, stderr string) {
	t.Helper()
	if os.Geteuid() != 0 {
		return runIdem(t, args...)
	}
	var out, errOut strings.Builder
	cmd := exec.Command(idemBin, args...)
	cmd.Env = testEnv()
	cmd.Dir = filepath.Dir(idemBin)
	cmd.Stdout, cmd.Stderr = &out, &errOut
	cmd.SysProcAttr = sysProcAttr()
	if cmd.SysProcAttr == nil {
		cmd.SysProcAttr = &syscall.SysProcAttr{}
	}
	cmd.SysProcAttr.Credential = &syscall.Credential{Uid: 65534, Gid: 65534}
	err := cmd.Run()
	if _, ok := err.(*exec.ExitError); err != nil && !ok {
		t.Fatalf("run idem %q as nobody: %v", args, err)
	}
	return cmd.ProcessState.ExitCode(), out.String(), errOut.String()
}

// TestRedisFlagsOnHTTPPort: a Redis flag pointed at an HTTP server says
// that it is not a Redis server, not that a reply could not be parsed.
func TestRedisFlagsOnHTTPPort(t *testing.T) {
	t.Parallel()
	srv := httptest.NewServer(http.NotFoundHandler())
	t.Cleanup(srv.Close)
	addr := strings.TrimPrefix(srv.URL, "http://")
	for _, args := range [][]string{
		{"ls", "--redis", "redis://" + addr},
		{"get", "k", "--redis-cluster", addr},
		{"ls", "--redis-sentinel", "mymaster@" + addr},
		{"proxy", "--upstream", srv.URL, "--redis", "redis://" + addr},
	} {
		var out, errOut strings.Builder
		code := run(t.Context(), args, &out, &errOut, noEnv)
		if msg := errOut.String(); code != 1 || !strings.Contains(msg, addr+" is not a Redis server") || !strings.Contains(msg, "HTTP/1.1 400 Bad Request") ||
			strings.Contains(msg, "parse") {
			t.Errorf("%q: got %d %q, want 1 and that %s is not a Redis server (an HTTP server)", args, code, msg, addr)
		}
	}
	var out, errOut strings.Builder
	code := run(t.Context(), []string{"doctor", "--redis", "redis://" + addr}, &out, &errOut, noEnv)
	if code != 1 || !strings.Contains(out.String(), "FAIL  connect: "+addr+" is not a Redis server") || strings.Contains(out.String(), "parse") {
		t.Errorf("doctor: got %d\n%s\nwant 1 and a FAIL that it is not a Redis server", code, out.String())
	}
}
