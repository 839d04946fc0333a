package main

import (
	"bytes"
	"os"
	"path/filepath"
	"slices"
	"testing"
)

// TestGenerated fails when internal/valkey is not what genvalkey makes of
// internal/rueidis: run go generate in internal/valkey.
func TestGenerated(t *testing.T) {
	want, err := generate("../rueidis")
	if err != nil {
		t.Fatal(err)
	}
	have, err := generated("../valkey")
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for name := range want {
		names = append(names, name)
	}
	slices.Sort(names)
	if !slices.Equal(have, names) {
		t.Errorf("generated files in internal/valkey: got %v, want %v (run go generate in internal/valkey)", have, names)
	}
	for _, name := range names {
		got, err := os.ReadFile(filepath.Join("../valkey", name))
		if err != nil {
			t.Errorf("%s: %v (run go generate in internal/valkey)", name, err)
			continue
		}
		if !bytes.Equal(got, want[name]) {
			t.Errorf("internal/valkey/%s is stale: run go generate in internal/valkey", name)
		}
	}
}

// TestRenamesLeaveNoRueidis: no name of rueidis is left in the
// translation, outside the header.
func TestRenamesLeaveNoRueidis(t *testing.T) {
	files, err := generate("../rueidis")
	if err != nil {
		t.Fatal(err)
	}
	for name, code := range files {
		if i := bytes.Index(bytes.TrimPrefix(code, []byte(header)), []byte("rueidis")); i >= 0 {
			t.Errorf("%s: %q left at %d", name, "rueidis", i)
		}
	}
}
