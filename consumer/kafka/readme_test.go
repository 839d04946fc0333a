package kafka_test

import (
	"os"
	"strings"
	"testing"
)

// TestReadmeExample checks that the usage snippet in README.md is the body
// of consume in example_test.go, which the tests compile.
func TestReadmeExample(t *testing.T) {
	readme, err := os.ReadFile("README.md")
	if err != nil {
		t.Fatal(err)
	}
	const marker = "<!-- README example: the body of consume in example_test.go -->"
	_, after, ok := strings.Cut(string(readme), marker)
	if !ok {
		t.Fatal("README.md has no example marker")
	}
	_, block, ok := strings.Cut(after, "```go\n")
	if !ok {
		t.Fatal("no Go block after the marker")
	}
	block, _, _ = strings.Cut(block, "```")

	src, err := os.ReadFile("example_test.go")
	if err != nil {
		t.Fatal(err)
	}
	_, body, ok := strings.Cut(string(src), "func consume(ctx context.Context, rdb *redis.Client) error {\n")
	if !ok {
		t.Fatal("example_test.go has no consume function")
	}
	body, _, _ = strings.Cut(body, "\n}\n")
	var lines []string
	for _, l := range strings.Split(body, "\n") {
		lines = append(lines, strings.TrimPrefix(l, "\t"))
	}
	want := strings.TrimSpace(strings.Join(lines, "\n"))
	if got := strings.TrimSpace(block); got != want {
		t.Fatalf("README snippet differs from consume:\n--- README\n%s\n--- consume\n%s", got, want)
	}
}
