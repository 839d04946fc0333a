package fsync

import (
	"os"
	"syscall"
)

// Data flushes f's data to disk, and no metadata that reading the data back
// does not need (fdatasync(2)).
func Data(f *os.File) error { return syscall.Fdatasync(int(f.Fd())) }
