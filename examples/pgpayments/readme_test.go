package main

import (
	"context"
	"os"
	"strings"
	"testing"

	"github.com/idemgo/idem/postgres/pgtest"
)

// readmeOutput returns the output blocks of the README, in order.
func readmeOutput(t *testing.T) []string {
	t.Helper()
	text, err := os.ReadFile("README.md")
	if err != nil {
		t.Fatal(err)
	}
	b := string(text)
	const marker = "<!-- output: TestReadmeOutput"
	var out []string
	rest := b
	for {
		_, after, ok := strings.Cut(rest, marker)
		if !ok {
			return out
		}
		_, block, _ := strings.Cut(after, "```\n")
		block, rest, _ = strings.Cut(block, "```")
		out = append(out, block)
	}
}

// TestReadmeOutput runs the example twice on one schema, as the README
// says, with its default batch: the first run's output and the second's
// are the README's, byte for byte (the second replays every message).
func TestReadmeOutput(t *testing.T) {
	want := readmeOutput(t)
	if len(want) != 2 {
		t.Fatalf("the README shows %d outputs, want 2 (the first run, the second)", len(want))
	}
	url := pgtest.Schema(t)
	for i, w := range want {
		var out strings.Builder
		if err := run(context.Background(), &out, url, "", 300); err != nil {
			t.Fatalf("run %d: %v", i+1, err)
		}
		if out.String() != w {
			t.Errorf("run %d: got\n%s\nthe README shows\n%s", i+1, out.String(), w)
		}
	}
}
