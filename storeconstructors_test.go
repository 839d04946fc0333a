package idem_test

import (
	"go/ast"
	"go/parser"
	"go/token"
	"io/fs"
	"path/filepath"
	"strings"
	"testing"
)

// serverStoreConstructors are the constructors of stores that check a
// server or a file, and so return an error on an unsupported one.
var serverStoreConstructors = map[string]bool{
	"redisstore.New": true, "redisstore.NewRueidis": true, "redisstore.NewValkey": true, "pgstore.New": true, "boltstore.Open": true,
}

// TestStoreConstructorErrorsChecked reads every test file of the
// repository, every module included, and fails on an assignment that
// discards the error of a store constructor: on a server the constructor
// refuses (an old version, an evicting policy), such a test would go on
// with a nil store and panic, which aborts its whole package instead of
// failing that test.
func TestStoreConstructorErrorsChecked(t *testing.T) {
	fset := token.NewFileSet()
	err := filepath.WalkDir(".", func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() && path != "." && (strings.HasPrefix(d.Name(), ".") || d.Name() == "testdata") {
			return filepath.SkipDir
		}
		if d.IsDir() || !strings.HasSuffix(path, "_test.go") {
			return nil
		}
		f, err := parser.ParseFile(fset, path, nil, parser.SkipObjectResolution)
		if err != nil {
			return err
		}
		ast.Inspect(f, func(n ast.Node) bool {
			as, ok := n.(*ast.AssignStmt)
			if !ok || len(as.Lhs) != 2 || len(as.Rhs) != 1 {
				return true
			}
			call, ok := as.Rhs[0].(*ast.CallExpr)
			if !ok {
				return true
			}
			sel, ok := call.Fun.(*ast.SelectorExpr)
			if !ok {
				return true
			}
			pkg, ok := sel.X.(*ast.Ident)
			if blank, _ := as.Lhs[1].(*ast.Ident); ok && blank != nil && blank.Name == "_" && serverStoreConstructors[pkg.Name+"."+sel.Sel.Name] {
				t.Errorf("%s: the error of %s.%s is discarded; check it (t.Fatal), so that an unsupported server fails the test instead of a nil store panicking",
					fset.Position(as.Pos()), pkg.Name, sel.Sel.Name)
			}
			return true
		})
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}
