package sqsconsumer_test

import (
	"testing"

	"github.com/idemgo/idem/testkit/readmetest"
)

// TestReadmeExample checks that the snippet in README.md is the body of
// Example in example_test.go, which the tests compile and run.
func TestReadmeExample(t *testing.T) {
	readmetest.Snippet(t, "README.md", "<!-- README example: the body of Example in example_test.go", "example_test.go",
		"func Example() {")
}
