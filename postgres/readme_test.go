package postgres_test

import (
	"testing"

	"github.com/idemgo/idem/testkit/readmetest"
)

// The Go snippets of the module's README and of the repository's
// docs/postgres.md are the bodies of examples the tests compile.
func TestReadmeSnippets(t *testing.T) {
	readmetest.Snippet(t, "README.md", "<!-- README example: the body of Example in pggate/example_test.go", "pggate/example_test.go", "func Example() {")
	readmetest.Snippet(t, "README.md", "<!-- README example: the body of ExampleGate_Handle in pggate/example_test.go", "pggate/example_test.go", "func ExampleGate_Handle() {")
	readmetest.Snippet(t, "README.md", "<!-- README example: the body of ExampleGate_HTTP in pggate/example_test.go", "pggate/example_test.go", "func ExampleGate_HTTP() {")
	readmetest.Snippet(t, "README.md", "<!-- README example: the body of Example in pgoutbox/example_test.go", "pgoutbox/example_test.go", "func Example() {")
	readmetest.Snippet(t, "../docs/postgres.md", "<!-- example: the body of Example in postgres/pggate/example_test.go", "pggate/example_test.go", "func Example() {")
}
