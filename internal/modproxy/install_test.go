package main

import (
	"bytes"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"strings"
	"testing"

	"golang.org/x/mod/modfile"
)

// repoRoot returns the repository's root, its modules and the version they
// require of each other (go.work's replace of the root module).
func repoRoot(t *testing.T) (string, []Module, string) {
	t.Helper()
	root, err := filepath.Abs(filepath.Join("..", ".."))
	if err != nil {
		t.Fatal(err)
	}
	mods, err := Modules(root)
	if err != nil {
		t.Fatal(err)
	}
	data, err := os.ReadFile(filepath.Join(root, "go.work"))
	if err != nil {
		t.Fatal(err)
	}
	wf, err := modfile.ParseWork("go.work", data, nil)
	if err != nil {
		t.Fatal(err)
	}
	root0 := rootPath(mods)
	for _, r := range wf.Replace {
		if r.Old.Path == root0 {
			return root, mods, r.Old.Version
		}
	}
	t.Fatalf("go.work has no versioned replace of %s; run make tidy", root0)
	return "", nil, ""
}

// TestInSync checks that every module requires its siblings at the version
// go.work maps to the working tree, with no replace, and that go.work uses
// every module.
func TestInSync(t *testing.T) {
	root, mods, version := repoRoot(t)
	changed, err := Sync(root, mods, version, false)
	if err != nil {
		t.Fatal(err)
	}
	if len(changed) > 0 {
		t.Errorf("out of line with %s: %v; run make tidy", version, changed)
	}
}

// TestInstall serves the repository from a local file-based module proxy,
// as if every module were tagged at the version they require of each other,
// and does in an empty GOPATH what a user does: go install of the binary,
// go get and build of each module from a fresh module. Then it builds and
// vets every module of the tagged tree on its own (GOWORK=off), and checks
// that this needed no change to any go.mod (they are tidy).
//
// It needs the go command and the module proxy for third-party modules.
func TestInstall(t *testing.T) {
	if testing.Short() {
		t.Skip("downloads every dependency into an empty module cache")
	}
	root, mods, version := repoRoot(t)
	proxy := t.TempDir()
	if err := Serve(root, mods, version, proxy); err != nil {
		t.Fatal(err)
	}
	env, err := Env(proxy, mods)
	if err != nil {
		t.Fatal(err)
	}
	gopath := t.TempDir()
	env = append(env,
		"GOPATH="+gopath,
		"GOMODCACHE="+filepath.Join(gopath, "pkg", "mod"),
		"GOBIN="+filepath.Join(gopath, "bin"),
		// The module cache's files are read-only by default, which
		// t.TempDir could not remove. -trimpath keeps the directories
		// of this test's module cache and snapshot out of the build
		// cache's keys, so a second run compiles only what changed, as
		// a user's go command would; what is checked (resolution from
		// the proxy, tidiness, building and vetting) is the same.
		"GOFLAGS=-mod=mod -modcacherw -trimpath",
	)
	goCmd := func(dir string, args ...string) string {
		t.Helper()
		cmd := exec.Command("go", args...)
		cmd.Dir, cmd.Env = dir, env
		out, err := cmd.CombinedOutput()
		if err != nil {
			t.Fatalf("in %s: go %s: %v\n%s", dir, strings.Join(args, " "), err, out)
		}
		return string(out)
	}

	var cmdPath string
	for _, m := range mods {
		if m.Dir == "cmd/idem" {
			cmdPath = m.Path
		}
	}
	if cmdPath == "" {
		t.Fatal("no module in cmd/idem")
	}
	t.Run("install", func(t *testing.T) {
		goCmd(t.TempDir(), "install", cmdPath+"@"+version)
		out, err := exec.Command(filepath.Join(gopath, "bin", "idem"), "version").CombinedOutput()
		if err != nil {
			t.Fatalf("idem version: %v\n%s", err, out)
		}
		if !strings.HasPrefix(string(out), "idem "+version+" ") {
			t.Errorf("idem version printed %q, want it to start with %q", out, "idem "+version+" ")
		}
	})

	for _, m := range mods {
		if !m.Published || m.Dir == "cmd/idem" {
			continue
		}
		t.Run("get/"+m.Dir, func(t *testing.T) {
			dir := t.TempDir()
			goCmd(dir, "mod", "init", "example.com/user")
			goCmd(dir, "get", m.Path+"@"+version)
			goCmd(dir, "build", m.Path+"/...")
		})
	}

	t.Run("gowork-off", func(t *testing.T) {
		tree := t.TempDir()
		if err := snapshot(root, tree); err != nil {
			t.Fatal(err)
		}
		for _, m := range mods {
			dir := filepath.Join(tree, filepath.FromSlash(m.Dir))
			gomod := filepath.Join(dir, "go.mod")
			before, err := os.ReadFile(gomod)
			if err != nil {
				t.Fatal(err)
			}
			goCmd(dir, "build", "./...")
			goCmd(dir, "vet", "./...")
			after, err := os.ReadFile(gomod)
			if err != nil {
				t.Fatal(err)
			}
			if !bytes.Equal(before, after) {
				t.Errorf("%s is not tidy: building it on its own changed it; run make tidy", path.Join(m.Dir, "go.mod"))
			}
		}
	})
}
