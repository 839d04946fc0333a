package idemproxy_test

import (
	"testing"

	"github.com/idemgo/idem/testkit/readmetest"
)

// TestReadmeExample checks that the proxy snippet in the repository's
// README.md and in docs/proxy.md is the body of Example_listen, which the
// tests compile.
func TestReadmeExample(t *testing.T) {
	readmetest.Snippet(t, "../README.md", "<!-- README example: the body of Example_listen in idemproxy/example_test.go", "example_test.go",
		"func Example_listen() {")
	readmetest.Snippet(t, "../docs/proxy.md", "<!-- example: the body of Example_listen in idemproxy/example_test.go", "example_test.go",
		"func Example_listen() {")
}
