package readmetest

import (
	"go/parser"
	"go/token"
	"os"
	"path"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"testing"
)

// TestNoCrossModuleInternalImports fails when a Go file of one module of
// the repository imports an internal package of another module
// (docs/design.md#architecture). The go command allows it whenever the
// importer's path lies under the internal directory's parent, as
// github.com/idemgo/idem/postgres lies under github.com/idemgo/idem, but a
// separately versioned module that does so breaks on any release of the
// other one: the piece must be public (testkit, storekit) or stay in one
// module.
func TestNoCrossModuleInternalImports(t *testing.T) {
	mods := repoModules(t)
	var bad []string
	for _, f := range repoFiles(t, ".go") {
		from := owner(mods, path.Dir(f))
		fset := token.NewFileSet()
		src, err := parser.ParseFile(fset, filepath.Join(root, f), nil, parser.ImportsOnly)
		if err != nil {
			t.Fatal(err)
		}
		for _, imp := range src.Imports {
			p, _ := strconv.Unquote(imp.Path.Value)
			if !strings.Contains(p+"/", "/internal/") {
				continue
			}
			to, ok := moduleOfImport(mods, p)
			if ok && to != from.path {
				bad = append(bad, f+" ("+from.path+") imports "+p+" (module "+to+")")
			}
		}
	}
	sort.Strings(bad)
	for _, b := range bad {
		t.Error(b)
	}
	if len(bad) > 0 {
		t.Errorf("got %d imports of another module's internal packages, want 0", len(bad))
	}
}

// module is one module of the repository: its directory, relative to
// root with slashes ("." for the root module), and its module path.
type module struct{ dir, path string }

// repoModules returns the repository's modules, from their go.mod files.
func repoModules(t *testing.T) []module {
	t.Helper()
	var mods []module
	for _, f := range repoFiles(t, "go.mod") {
		if path.Base(f) != "go.mod" {
			continue
		}
		b, err := os.ReadFile(filepath.Join(root, filepath.FromSlash(f)))
		if err != nil {
			t.Fatal(err)
		}
		for line := range strings.Lines(string(b)) {
			if w := strings.Fields(line); len(w) == 2 && w[0] == "module" {
				mods = append(mods, module{dir: path.Dir(f), path: w[1]})
			}
		}
	}
	if len(mods) < 2 {
		t.Fatalf("got %d modules, want the root and its siblings", len(mods))
	}
	return mods
}

// owner returns the module whose directory holds dir: the deepest one.
func owner(mods []module, dir string) module {
	var best module
	depth := -1
	for _, m := range mods {
		d := 0
		if m.dir != "." {
			if dir != m.dir && !strings.HasPrefix(dir, m.dir+"/") {
				continue
			}
			d = len(m.dir)
		}
		if d > depth {
			best, depth = m, d
		}
	}
	return best
}

// moduleOfImport returns the path of the repository's module that holds
// the package imp: the longest module path that is imp or a prefix of it.
func moduleOfImport(mods []module, imp string) (string, bool) {
	best := ""
	for _, m := range mods {
		if (imp == m.path || strings.HasPrefix(imp, m.path+"/")) && len(m.path) > len(best) {
			best = m.path
		}
	}
	return best, best != ""
}
