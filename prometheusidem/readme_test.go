package prometheusidem_test

import (
	"testing"

	"github.com/idemgo/idem/testkit/readmetest"
)

// TestReadmeExample checks that the Prometheus snippet in the
// repository's docs/operations.md is the body of Example, which the tests
// run.
func TestReadmeExample(t *testing.T) {
	readmetest.Snippet(t, "../docs/operations.md", "<!-- example: the body of Example in prometheusidem/example_test.go", "example_test.go",
		"func Example() {")
}
