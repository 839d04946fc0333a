package main

import (
	"bytes"
	"os"
	"path/filepath"
	"testing"
)

// TestCPUProfile: IDEM_CPU_PROFILE writes a CPU profile (gzipped pprof)
// when the command returns; without it, nothing is written.
func TestCPUProfile(t *testing.T) {
	path := filepath.Join(t.TempDir(), "cpu.pprof")
	var stderr bytes.Buffer
	startProfile(func(string) string { return "" }, &stderr)()
	stop := startProfile(func(k string) string {
		if k == profileEnv {
			return path
		}
		return ""
	}, &stderr)
	stop()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if len(b) < 2 || b[0] != 0x1f || b[1] != 0x8b || stderr.Len() != 0 {
		t.Errorf("got %d bytes starting %x, stderr %q; want a gzipped profile and no error", len(b), b[:min(len(b), 2)], stderr.String())
	}
}
