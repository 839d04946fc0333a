//go:build !linux

package fsync

import "os"

// Data flushes f to disk: fsync where there is no fdatasync.
func Data(f *os.File) error { return f.Sync() }
