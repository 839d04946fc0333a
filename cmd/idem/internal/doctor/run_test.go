package doctor

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestBolt: a missing embedded store is a warning, a file that is not one
// a failure that names it, a store that opens OK.
func TestBolt(t *testing.T) {
	dir := t.TempDir()
	check := func(path string) string {
		var b bytes.Buffer
		r := &Report{W: &b}
		Bolt(r, path)
		return b.String()
	}
	missing := filepath.Join(dir, "none", "idem.db")
	if got := check(missing); !strings.Contains(got, "WARN") || !strings.Contains(got, "does not exist yet") {
		t.Errorf("missing store: got %q, want a WARN that it does not exist yet", got)
	}
	junk := filepath.Join(dir, "junk.db")
	if err := os.WriteFile(junk, bytes.Repeat([]byte("not a bolt file "), 512), 0o600); err != nil {
		t.Fatal(err)
	}
	if got := check(junk); !strings.Contains(got, "FAIL") || !strings.Contains(got, junk) {
		t.Errorf("junk file: got %q, want a FAIL naming %s", got, junk)
	}
}
