package boltstore

import (
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/idemgo/idem/storekit"
)

// TestOpenUnderAddressSpaceLimit: where a limit of the address space
// (ulimit -v) refuses the large map, Open maps what the file needs, and the
// store works.
func TestOpenUnderAddressSpaceLimit(t *testing.T) {
	if initialMmapSize == 0 {
		// 32-bit Linux: Open maps what the file needs and never asks for
		// the large map, so there is no refusal to fall back from.
		t.Skip("no large map on this platform")
	}
	statm, err := os.ReadFile("/proc/self/statm")
	if err != nil {
		t.Fatal(err)
	}
	pages, err := strconv.ParseUint(strings.Fields(string(statm))[0], 10, 64)
	if err != nil {
		t.Fatal(err)
	}
	var old syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_AS, &old); err != nil {
		t.Fatal(err)
	}
	// Room for what the process maps meanwhile, not for the large map.
	limit := pages*uint64(os.Getpagesize()) + initialMmapSize/2
	if limit > old.Cur {
		// A limit lower than ours already refuses the large map at every
		// Open in this process, so every other test of the package runs
		// the fallback; setting ours would raise the limit, not test it.
		t.Skipf("the address space is already limited to %d bytes", old.Cur)
	}
	path := filepath.Join(t.TempDir(), "idem.db")
	if err := syscall.Setrlimit(syscall.RLIMIT_AS, &syscall.Rlimit{Cur: limit, Max: old.Max}); err != nil {
		t.Fatal(err)
	}
	s, err := Open(path, WithSweepInterval(0))
	if err := syscall.Setrlimit(syscall.RLIMIT_AS, &old); err != nil {
		t.Fatal(err)
	}
	if err != nil {
		t.Fatalf("Open under a limit of %d bytes of address space: %v", limit, err)
	}
	defer s.Close()
	a := mustAcquire(t, s, "k", newReq("o", time.Minute), storekit.Acquired)
	if err := s.Complete(t.Context(), "k", a.Lease, []byte("r"), time.Hour); err != nil {
		t.Fatal(err)
	}
	if _, err := s.requestCheckpoint(t.Context()); err != nil {
		t.Fatal(err)
	}
	if recs, _ := onDisk(t, s); recs != 1 {
		t.Fatalf("%d records in the file, want 1", recs)
	}
}
