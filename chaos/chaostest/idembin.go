package chaostest

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// BuildIdem builds the idem binary (the root module's cmd/idem, without the
// race detector) into a temporary directory of t and returns its path.
// The build cache makes every build after the first one quick, but each
// build still links the binary again; when IDEM_CHAOS_BIN names a binary
// built from the same tree (make chaos-suite builds it once, beside the
// test binaries), BuildIdem returns that path instead.
func BuildIdem(t testing.TB) string {
	t.Helper()
	if bin := os.Getenv("IDEM_CHAOS_BIN"); bin != "" {
		return bin
	}
	out, err := exec.Command("go", "env", "GOMOD").Output()
	if err != nil {
		t.Fatalf("chaostest: go env GOMOD: %v", err)
	}
	gomod := strings.TrimSpace(string(out))
	if gomod == "" || gomod == os.DevNull {
		t.Fatalf("chaostest: not inside the chaos module (go env GOMOD = %q)", gomod)
	}
	src := filepath.Join(filepath.Dir(gomod), "..", "cmd", "idem")
	bin := filepath.Join(t.TempDir(), "idem")
	// -trimpath: the build cache's keys do not hold the checkout's
	// directory, so a fresh clone reuses the packages another checkout
	// compiled (cmd/idem compiled in 429 s in a new checkout, 38 s in a
	// second one, on a loaded 2-core machine).
	cmd := exec.Command("go", "build", "-trimpath", "-o", bin, ".")
	cmd.Dir = src
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("chaostest: building the idem binary in %s: %v\n%s", src, err, out)
	}
	return bin
}

// StartProxy starts `idem proxy` (bin, from BuildIdem) on a free loopback
// port, with args added (--upstream, the store flags, --lease, ...), waits
// until it listens and returns it with the address it serves on.
func StartProxy(t testing.TB, bin string, args ...string) (*Proc, string) {
	t.Helper()
	p := StartCommand(t, bin, append([]string{"proxy", "--listen", "127.0.0.1:0", "--log-format", "text"}, args...))
	line := p.ExpectStderr(`msg="idem proxy started"`, 60*time.Second)
	for f := range strings.FieldsSeq(line) {
		if addr, ok := strings.CutPrefix(f, "listen="); ok {
			return p, addr
		}
	}
	t.Fatalf("chaostest: no listen= in the proxy's line %q", line)
	return nil, ""
}
