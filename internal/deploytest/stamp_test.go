package deploytest

import (
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// git runs git in dir and returns its output, trimmed.
func git(t *testing.T, dir string, args ...string) string {
	t.Helper()
	cmd := exec.Command("git", args...)
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), "GIT_AUTHOR_NAME=test", "GIT_AUTHOR_EMAIL=test@example.com",
		"GIT_COMMITTER_NAME=test", "GIT_COMMITTER_EMAIL=test@example.com")
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("git %s: %v\n%s", strings.Join(args, " "), err, out)
	}
	return strings.TrimSpace(string(out))
}

// TestStamp: make build stamps the binary with what git says of the
// checkout: the commit alone where no tag is reachable; the nearest tag,
// the commits past it and -dirty for a tree with changes; and idem version
// --json reports them. It runs this Makefile in a clone of the
// repository's committed tree, whose tags and changes it controls.
func TestStamp(t *testing.T) {
	makefile, err := filepath.Abs(filepath.Join(repoRoot, "Makefile"))
	if err != nil {
		t.Fatal(err)
	}
	clone := filepath.Join(t.TempDir(), "idem")
	git(t, repoRoot, "clone", "--quiet", "--local", "--no-tags", ".", clone)
	head := git(t, clone, "rev-parse", "HEAD")
	short := git(t, clone, "rev-parse", "--short", "HEAD")
	bin := filepath.Join(t.TempDir(), "idem")

	build := func() (v struct {
		Version, Commit, Date string
		Dirty                 bool
	}) {
		t.Helper()
		// The variables of the caller's make would win over the clone's.
		cmd := exec.Command("make", "--no-print-directory", "-f", makefile, "-C", clone, "build", "BUILD_OUT="+bin)
		cmd.Env = withoutMakeVars(os.Environ())
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("make build: %v\n%s", err, out)
		}
		out, err := exec.Command(bin, "version", "--json").Output()
		if err != nil {
			t.Fatalf("idem version --json: %v", err)
		}
		if err := json.Unmarshal(out, &v); err != nil {
			t.Fatalf("idem version --json: %v in %q", err, out)
		}
		return v
	}

	v := build()
	if v.Version != short || v.Commit != head || v.Dirty || v.Date == "" {
		t.Errorf("untagged, clean: got %+v, want version %s, commit %s, not dirty, a date", v, short, head)
	}

	git(t, clone, "tag", "v9.8.7")
	git(t, clone, "commit", "--quiet", "--allow-empty", "-m", "one past the tag")
	next := git(t, clone, "rev-parse", "HEAD")
	nextShort := git(t, clone, "rev-parse", "--short", "HEAD")
	if err := os.WriteFile(filepath.Join(clone, "README.md"), []byte("changed\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	v = build()
	want := "v9.8.7-1-g" + nextShort + "-dirty"
	if v.Version != want || v.Commit != next || !v.Dirty {
		t.Errorf("past a tag, changed: got %+v, want version %s, commit %s, dirty", v, want, next)
	}
}

// withoutMakeVars drops the variables a calling make exports (MAKEFLAGS
// carries its command-line variables, such as VERSION).
func withoutMakeVars(env []string) []string {
	var out []string
	for _, kv := range env {
		name, _, _ := strings.Cut(kv, "=")
		switch name {
		case "MAKEFLAGS", "MFLAGS", "MAKELEVEL", "VERSION", "COMMIT", "DATE", "DIRTY", "STAMP":
			continue
		}
		out = append(out, kv)
	}
	return out
}
