// Command modproxy keeps the repository's modules consistent and serves
// them from a local, file-based module proxy, as if they had been tagged and
// published.
//
// The repository holds several modules (the root and one per directory
// with a go.mod). They are released together: one version V, tagged "V"
// for the root and "<dir>/V" for each sub-module. Every module requires its
// siblings at V, the next release, with no replace directive (go install
// refuses one), and go.work resolves them to the working tree, with a
// versioned replace per module because the go command otherwise reads the
// go.mod of a required version of a workspace module.
//
//	modproxy sync  -version V           set every requirement of a sibling to V, drop their replaces, rewrite go.work
//	modproxy check -version V           fail if sync would change anything
//	modproxy serve -version V -out DIR  snapshot the tree, tag every module at V and write a proxy in DIR
//	modproxy run -version V [-dirs a,b] -- CMD...
//	                                    run CMD (e.g. go mod tidy) in each module, GOWORK=off,
//	                                    against a proxy served from the tree
//
// serve snapshots the files git knows or would add (tracked, and untracked
// but not ignored) into a temporary repository, tags each module there
// (never in the repository itself) and writes the proxy with the layout of
// `go mod download`: DIR/<escaped module path>/@v/{list,V.info,V.mod,V.zip}.
// Use it with GOPROXY=file://DIR,<your proxy> and GONOSUMDB=github.com/idemgo/idem
// (the versions are not in the public checksum database).
//
// Modules under internal/ (this one) are tools and are not published.
package main

import (
	"bytes"
	"errors"
	"flag"
	"fmt"
	"io"
	"net/url"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"golang.org/x/mod/modfile"
	"golang.org/x/mod/module"
	"golang.org/x/mod/semver"
	modzip "golang.org/x/mod/zip"
)

func main() {
	if err := run(os.Args[1:], os.Stdout); err != nil {
		fmt.Fprintln(os.Stderr, "modproxy:", err)
		os.Exit(1)
	}
}

func run(args []string, stdout io.Writer) error {
	if len(args) == 0 {
		return errors.New("usage: modproxy sync|check|serve|run -version V [-out DIR] [-repo DIR] [-dirs a,b] [-- CMD...]")
	}
	fs := flag.NewFlagSet(args[0], flag.ContinueOnError)
	version := fs.String("version", "", "the version every module is released at (v0.x.y)")
	out := fs.String("out", "", "serve: the proxy's directory")
	repo := fs.String("repo", "", "the repository's root (default: git rev-parse --show-toplevel)")
	dirs := fs.String("dirs", "", "run: the modules' directories, comma-separated (default: every module)")
	if err := fs.Parse(args[1:]); err != nil {
		return err
	}
	if !semver.IsValid(*version) || semver.Canonical(*version) != *version {
		return fmt.Errorf("-version %q: want a canonical semantic version such as v0.1.0", *version)
	}
	root := *repo
	if root == "" {
		top, err := git("", "rev-parse", "--show-toplevel")
		if err != nil {
			return err
		}
		root = strings.TrimSpace(top)
	}
	mods, err := Modules(root)
	if err != nil {
		return err
	}
	switch args[0] {
	case "sync", "check":
		changed, err := Sync(root, mods, *version, args[0] == "sync")
		if err != nil {
			return err
		}
		if args[0] == "check" && len(changed) > 0 {
			return fmt.Errorf("%s not in line with version %s; run make tidy (or: go run ./internal/modproxy sync -version %s)", strings.Join(changed, ", "), *version, *version)
		}
		for _, f := range changed {
			fmt.Fprintln(stdout, "updated", f)
		}
		return nil
	case "serve":
		if *out == "" {
			return errors.New("serve: -out is required")
		}
		return Serve(root, mods, *version, *out)
	case "run":
		if fs.NArg() == 0 {
			return errors.New("run: no command; e.g. modproxy run -version v0.1.0 -- go mod tidy")
		}
		var only []string
		if *dirs != "" {
			only = strings.Split(*dirs, ",")
		}
		return Run(root, mods, *version, only, fs.Args(), stdout)
	}
	return fmt.Errorf("unknown command %q: want sync, check or serve", args[0])
}

// Module is one module of the repository.
type Module struct {
	Dir  string // slash-separated, relative to the repository root; "." for the root
	Path string // module path
	// Published says the module is released (tagged); modules under
	// internal/ are not.
	Published bool
}

// Tag returns the module's tag for version v.
func (m Module) Tag(v string) string {
	if m.Dir == "." {
		return v
	}
	return m.Dir + "/" + v
}

// Modules returns the modules of the repository at root: every go.mod that
// git tracks or would add, sorted by directory.
func Modules(root string) ([]Module, error) {
	files, err := repoFiles(root)
	if err != nil {
		return nil, err
	}
	var mods []Module
	for _, f := range files {
		if path.Base(f) != "go.mod" {
			continue
		}
		data, err := os.ReadFile(filepath.Join(root, f))
		if err != nil {
			return nil, err
		}
		mp := modfile.ModulePath(data)
		if mp == "" {
			return nil, fmt.Errorf("%s: no module path", f)
		}
		dir := path.Dir(f)
		mods = append(mods, Module{Dir: dir, Path: mp, Published: dir != "internal" && !strings.HasPrefix(dir, "internal/")})
	}
	slices.SortFunc(mods, func(a, b Module) int { return strings.Compare(a.Dir, b.Dir) })
	return mods, nil
}

// repoFiles lists the files git tracks or would add (untracked, not
// ignored), slash-separated and relative to root.
func repoFiles(root string) ([]string, error) {
	out, err := git(root, "ls-files", "-z", "--cached", "--others", "--exclude-standard")
	if err != nil {
		return nil, err
	}
	var files []string
	for f := range strings.SplitSeq(out, "\x00") {
		if f == "" {
			continue
		}
		// A tracked file deleted from the working tree is not part of it.
		if _, err := os.Lstat(filepath.Join(root, f)); err == nil {
			files = append(files, f)
		}
	}
	slices.Sort(files)
	return slices.Compact(files), nil
}

// Sync sets every requirement of a sibling module to version, drops the
// replace directives of siblings and rewrites go.work to use every module
// and to replace each published one at version by its directory. It returns
// the files that differed; with write false it changes nothing.
func Sync(root string, mods []Module, version string, write bool) ([]string, error) {
	siblings := make(map[string]bool)
	for _, m := range mods {
		siblings[m.Path] = true
	}
	var changed []string
	for _, m := range mods {
		name := path.Join(m.Dir, "go.mod")
		file := filepath.Join(root, filepath.FromSlash(name))
		data, err := os.ReadFile(file)
		if err != nil {
			return nil, err
		}
		f, err := modfile.Parse(name, data, nil)
		if err != nil {
			return nil, err
		}
		for _, r := range f.Require {
			if siblings[r.Mod.Path] && r.Mod.Version != version {
				if err := f.AddRequire(r.Mod.Path, version); err != nil {
					return nil, err
				}
			}
		}
		for _, r := range slices.Clone(f.Replace) {
			if siblings[r.Old.Path] {
				if err := f.DropReplace(r.Old.Path, r.Old.Version); err != nil {
					return nil, err
				}
			}
		}
		f.Cleanup()
		out, err := f.Format()
		if err != nil {
			return nil, err
		}
		if !bytes.Equal(out, data) {
			changed = append(changed, name)
			if write {
				if err := os.WriteFile(file, out, 0o644); err != nil {
					return nil, err
				}
			}
		}
	}
	work := filepath.Join(root, "go.work")
	old, err := os.ReadFile(work)
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		return nil, err
	}
	rootMod, err := os.ReadFile(filepath.Join(root, "go.mod"))
	if err != nil {
		return nil, err
	}
	rf, err := modfile.ParseLax("go.mod", rootMod, nil)
	if err != nil {
		return nil, err
	}
	if rf.Go == nil {
		return nil, errors.New("go.mod: no go directive")
	}
	if want := workFile(mods, version, rf.Go.Version); !bytes.Equal(old, want) {
		changed = append(changed, "go.work")
		if write {
			if err := os.WriteFile(work, want, 0o644); err != nil {
				return nil, err
			}
		}
	}
	return changed, nil
}

// workFile returns the go.work that uses every module and replaces each
// published one at version by its directory, for the root module's Go
// version.
func workFile(mods []Module, version, goVersion string) []byte {
	var b bytes.Buffer
	b.WriteString("// The workspace: every module of the repository, resolved to the working\n")
	b.WriteString("// tree. Generated by `make tidy` (internal/modproxy): a module requires its\n")
	b.WriteString("// siblings at the next release's version, which the replaces below map to\n")
	b.WriteString("// their directories. See CONTRIBUTING.md.\n")
	fmt.Fprintf(&b, "go %s\n\nuse (\n", goVersion)
	for _, m := range mods {
		fmt.Fprintf(&b, "\t%s\n", dotDir(m.Dir))
	}
	b.WriteString(")\n\nreplace (\n")
	for _, m := range mods {
		if m.Published {
			fmt.Fprintf(&b, "\t%s %s => %s\n", m.Path, version, dotDir(m.Dir))
		}
	}
	b.WriteString(")\n")
	return b.Bytes()
}

func dotDir(dir string) string {
	if dir == "." {
		return "."
	}
	return "./" + dir
}

// Serve snapshots the repository's files into a temporary git repository,
// tags every published module at version there and writes a file-based
// module proxy for them in out.
func Serve(root string, mods []Module, version, out string) error {
	snap, err := os.MkdirTemp("", "idem-modproxy-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(snap)
	if err := snapshot(root, snap); err != nil {
		return err
	}
	info := fmt.Appendf(nil, `{"Version":%q,"Time":%q}`+"\n", version, time.Now().UTC().Format(time.RFC3339))
	for _, m := range mods {
		if !m.Published {
			continue
		}
		tag := m.Tag(version)
		if _, err := git(snap, "tag", tag); err != nil {
			return err
		}
		esc, err := module.EscapePath(m.Path)
		if err != nil {
			return err
		}
		dir := filepath.Join(out, filepath.FromSlash(esc), "@v")
		if err := os.MkdirAll(dir, 0o755); err != nil {
			return err
		}
		var zb bytes.Buffer
		subdir := m.Dir
		if subdir == "." {
			subdir = ""
		}
		if err := modzip.CreateFromVCS(&zb, module.Version{Path: m.Path, Version: version}, snap, tag, subdir); err != nil {
			return fmt.Errorf("%s: %w", m.Path, err)
		}
		gomod, err := os.ReadFile(filepath.Join(snap, filepath.FromSlash(m.Dir), "go.mod"))
		if err != nil {
			return err
		}
		for name, data := range map[string][]byte{
			version + ".info": info,
			version + ".mod":  gomod,
			version + ".zip":  zb.Bytes(),
			"list":            []byte(version + "\n"),
		} {
			if err := os.WriteFile(filepath.Join(dir, name), data, 0o644); err != nil {
				return err
			}
		}
	}
	return nil
}

// Env returns the environment that makes the go command take the modules
// of the repository from the proxy in dir, and everything else from the
// proxy it uses now: GOWORK=off, GOPROXY=file://dir,<proxy>, GONOSUMDB for
// the repository's modules (their versions are not in the public checksum
// database) and GOFLAGS=-mod=mod (their checksums are not in the go.sum
// files: they change with every commit until the release).
func Env(dir string, mods []Module) ([]string, error) {
	out, err := exec.Command("go", "env", "GOPROXY", "GOFLAGS").Output()
	if err != nil {
		return nil, fmt.Errorf("go env: %w", err)
	}
	lines := strings.Split(strings.TrimSpace(string(out))+"\n", "\n")
	upstream, flags := lines[0], strings.TrimSpace(lines[1])
	if upstream == "" || upstream == "off" {
		upstream = "https://proxy.golang.org,direct"
	}
	u := url.URL{Scheme: "file", Path: filepath.ToSlash(dir)}
	if !strings.HasPrefix(u.Path, "/") {
		u.Path = "/" + u.Path // a Windows drive letter
	}
	return append(os.Environ(),
		"GOWORK=off",
		"GOPROXY="+u.String()+","+upstream,
		"GONOSUMDB="+rootPath(mods),
		"GOFLAGS="+strings.TrimSpace(flags+" -mod=mod"),
	), nil
}

// rootPath returns the module path of the repository's root module.
func rootPath(mods []Module) string {
	for _, m := range mods {
		if m.Dir == "." {
			return m.Path
		}
	}
	return mods[0].Path
}

// Run serves the modules at version from a temporary proxy and runs
// command in each module's directory (those in only, if any) with Env.
// Afterwards it removes the checksums of the repository's own modules from
// each go.sum: they are those of the working tree, not of the release.
func Run(root string, mods []Module, version string, only, command []string, stdout io.Writer) error {
	proxy, err := os.MkdirTemp("", "idem-proxy-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(proxy)
	if err := Serve(root, mods, version, proxy); err != nil {
		return err
	}
	env, err := Env(proxy, mods)
	if err != nil {
		return err
	}
	for _, m := range mods {
		if len(only) > 0 && !slices.Contains(only, m.Dir) {
			continue
		}
		dir := filepath.Join(root, filepath.FromSlash(m.Dir))
		fmt.Fprintf(stdout, "%s: %s\n", m.Dir, strings.Join(command, " "))
		cmd := exec.Command(command[0], command[1:]...)
		cmd.Dir, cmd.Env, cmd.Stdout, cmd.Stderr = dir, env, stdout, os.Stderr
		if err := cmd.Run(); err != nil {
			return fmt.Errorf("%s: %s: %w", m.Dir, strings.Join(command, " "), err)
		}
		if err := dropSums(filepath.Join(dir, "go.sum"), mods); err != nil {
			return err
		}
	}
	return nil
}

// dropSums removes the lines of the repository's modules from a go.sum.
func dropSums(file string, mods []Module) error {
	data, err := os.ReadFile(file)
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		return err
	}
	var out []byte
	for line := range strings.Lines(string(data)) {
		own := false
		for _, m := range mods {
			if strings.HasPrefix(line, m.Path+" ") {
				own = true
			}
		}
		if !own {
			out = append(out, line...)
		}
	}
	if bytes.Equal(out, data) {
		return nil
	}
	return os.WriteFile(file, out, 0o644)
}

// snapshot copies the files of the repository at root into dst and commits
// them there.
func snapshot(root, dst string) error {
	files, err := repoFiles(root)
	if err != nil {
		return err
	}
	for _, f := range files {
		src := filepath.Join(root, filepath.FromSlash(f))
		fi, err := os.Lstat(src)
		if err != nil {
			return err
		}
		if !fi.Mode().IsRegular() {
			continue // module zips hold regular files only
		}
		data, err := os.ReadFile(src)
		if err != nil {
			return err
		}
		target := filepath.Join(dst, filepath.FromSlash(f))
		if err := os.MkdirAll(filepath.Dir(target), 0o755); err != nil {
			return err
		}
		if err := os.WriteFile(target, data, fi.Mode().Perm()); err != nil {
			return err
		}
	}
	for _, args := range [][]string{
		{"init", "-q"},
		{"add", "-A"},
		{"-c", "user.name=modproxy", "-c", "user.email=modproxy@localhost", "-c", "commit.gpgsign=false", "commit", "-q", "-m", "snapshot"},
	} {
		if _, err := git(dst, args...); err != nil {
			return err
		}
	}
	return nil
}

func git(dir string, args ...string) (string, error) {
	cmd := exec.Command("git", args...)
	cmd.Dir = dir
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		return "", fmt.Errorf("git %s: %w: %s", strings.Join(args, " "), err, strings.TrimSpace(stderr.String()))
	}
	return string(out), nil
}
