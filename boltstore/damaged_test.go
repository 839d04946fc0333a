package boltstore

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/idemgo/idem/storekit"
)

// TestOpenDamagedFile checks that Open reports a damaged file (truncated,
// or with B+tree pages overwritten) as an error wrapping ErrCorrupt. bbolt
// alone panics on such a file in a goroutine of its own, which no caller can
// recover, so the process died with a stack trace.
func TestOpenDamagedFile(t *testing.T) {
	const pageSize = 4096
	for _, tc := range []struct {
		name   string
		damage func(t *testing.T, f *os.File, size int64) // size: of the data
	}{
		{"truncated", func(t *testing.T, f *os.File, size int64) {
			if err := f.Truncate(size / 2); err != nil {
				t.Fatal(err)
			}
		}},
		{"pages overwritten", func(t *testing.T, f *os.File, size int64) {
			junk := make([]byte, 8*pageSize)
			for i := range junk {
				junk[i] = byte(i * 7)
			}
			if _, err := f.WriteAt(junk, 4*pageSize); err != nil {
				t.Fatal(err)
			}
		}},
		{"meta pages overwritten", func(t *testing.T, f *os.File, size int64) {
			if _, err := f.WriteAt(make([]byte, 2*pageSize), 0); err != nil {
				t.Fatal(err)
			}
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			path := filepath.Join(t.TempDir(), "idem.db")
			s := openTest(t, path)
			// Enough records for a few levels of B+tree pages, written by
			// concurrent callers so that the commits are grouped.
			var wg sync.WaitGroup
			for w := range 32 {
				wg.Go(func() {
					for i := w; i < 2000; i += 32 {
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
			if t.Failed() {
				t.FailNow()
			}
			if err := s.Close(); err != nil {
				t.Fatal(err)
			}
			size := dataSizeClosed(t, path)
			f, err := os.OpenFile(path, os.O_RDWR, 0)
			if err != nil {
				t.Fatal(err)
			}
			tc.damage(t, f, size)
			if err := f.Close(); err != nil {
				t.Fatal(err)
			}

			s2, err := Open(path)
			if err == nil {
				s2.Close()
				t.Fatal("Open of a damaged file: got no error, want ErrCorrupt")
			}
			if !errors.Is(err, ErrCorrupt) {
				t.Fatalf("Open of a damaged file: got %v, want an error wrapping ErrCorrupt", err)
			}
			// The file is closed and unlocked: it can be moved aside and a
			// new store opened at the same path.
			if err := os.Rename(path, path+".damaged"); err != nil {
				t.Fatal(err)
			}
			openTest(t, path)
		})
	}
}
