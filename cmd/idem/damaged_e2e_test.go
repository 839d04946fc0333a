package main

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/idemgo/idem/boltstore"
	"github.com/idemgo/idem/storekit"
)

// TestDamagedEmbeddedStore checks that proxy, ls and doctor report a
// damaged idem.db (B+tree pages overwritten) in one line that names the
// file and what to do, and exit non-zero, instead of a bbolt panic and its
// stack trace.
func TestDamagedEmbeddedStore(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	path := filepath.Join(dir, dataFile)
	writeRecords(t, path, 2000)
	f, err := os.OpenFile(path, os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	junk := make([]byte, 8*4096)
	for i := range junk {
		junk[i] = byte(i * 7)
	}
	if _, err := f.WriteAt(junk, 4*4096); err != nil {
		t.Fatal(err)
	}
	if err := f.Close(); err != nil {
		t.Fatal(err)
	}

	for _, args := range [][]string{
		{"proxy", "--listen", freeAddr(t), "--admin-listen", freeAddr(t), "--upstream", "http://" + freeAddr(t), "--check-upstream=false", "--data", dir},
		{"ls", "--data", dir},
	} {
		code, _, stderr := runIdem(t, args...)
		if code == 0 || strings.Count(strings.TrimSpace(stderr), "\n") != 0 ||
			!strings.Contains(stderr, path+" is damaged") || !strings.Contains(stderr, "move the file aside") ||
			strings.Contains(stderr, "goroutine") {
			t.Errorf("idem %s: got exit %d, stderr:\n%s\nwant a non-zero exit and one line naming %s and what to do", args[0], code, stderr, path)
		}
	}
	code, out, _ := runIdem(t, "doctor", "--data", dir)
	if code != 1 || !strings.Contains(out, "FAIL  embedded store: the embedded store "+path+" is damaged") {
		t.Errorf("doctor: got %d\n%s\nwant 1 and a FAIL for the damaged file", code, out)
	}
}

// writeRecords writes n completed records into a new embedded store at
// path, from concurrent callers so that the commits are grouped.
func writeRecords(t *testing.T, path string, n int) {
	t.Helper()
	s, err := boltstore.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	for w := range 32 {
		wg.Go(func() {
			for i := w; i < n; i += 32 {
				key := fmt.Sprintf("%064x", i)
				a, err := s.Acquire(t.Context(), key, storekit.AcquireRequest{Fingerprint: "f", Owner: "o", Lease: time.Minute, Retention: time.Hour, MaxAttempts: 3})
				if err == nil {
					err = s.Complete(t.Context(), key, a.Lease, make([]byte, 300), time.Hour)
				}
				if err != nil {
					t.Error(err)
					return
				}
			}
		})
	}
	wg.Wait()
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	if t.Failed() {
		t.FailNow()
	}
}
