// Package readmetest checks that a Go snippet in a README is the body of a
// function that the tests compile (and, for an example with output, run),
// so that what a reader copies is code that works.
//
// It lives in testkit, the packages that serve idem's own tests and those
// who write a store or a broker adapter for idem (docs/design.md#where-new-code-goes);
// its API is not covered by the modules' compatibility promise and may
// change in any release.
package readmetest

import (
	"os"
	"strings"
	"testing"
)

// Snippet fails t unless the first Go code block after the line of readme
// that contains marker is, once its indentation is removed, the body of the
// function declared by decl (for example "func Example() {") in the Go file
// src. An example's "// Output:" comment is not part of the body.
func Snippet(t testing.TB, readme, marker, src, decl string) {
	t.Helper()
	block := fenced(t, readme, marker, "```go\n", "Go block")

	code, err := os.ReadFile(src)
	if err != nil {
		t.Fatal(err)
	}
	_, body, ok := strings.Cut(string(code), decl+"\n")
	if !ok {
		t.Fatalf("%s has no %q", src, decl)
	}
	body, _, _ = strings.Cut(body, "\n}\n")
	body, _, _ = strings.Cut(body, "\t// Output:")
	var lines []string
	for _, l := range strings.Split(body, "\n") {
		lines = append(lines, strings.TrimPrefix(l, "\t"))
	}
	want := strings.TrimSpace(strings.Join(lines, "\n"))
	if got := strings.TrimSpace(block); got != want {
		t.Fatalf("the snippet in %s differs from %s in %s:\n--- %s\n%s\n--- %s\n%s", readme, decl, src, readme, got, src, want)
	}
}
