package idem_test

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

// TestReadmeEffectExample checks the Redis-side effects snippet of
// docs/redis.md against ExampleWithEffect, which the redisstore tests
// compile.
func TestReadmeEffectExample(t *testing.T) {
	readmetest.Snippet(t, "docs/redis.md", "<!-- example: the body of ExampleWithEffect", "redisstore/example_test.go",
		"func ExampleWithEffect() {")
}

// TestGRPCDocExample checks the snippet of docs/grpc.md against Example
// in idemgrpc/example_test.go, which the idemgrpc tests run.
func TestGRPCDocExample(t *testing.T) {
	readmetest.Snippet(t, "docs/grpc.md", "<!-- example: the body of Example in idemgrpc/example_test.go", "idemgrpc/example_test.go",
		"func Example() {")
}
