package main

import (
	"os"
	"syscall"
)

// fdatasync flushes f's data (and no metadata that reading it back does not
// need), as boltstore's commits do.
func fdatasync(f *os.File) error { return syscall.Fdatasync(int(f.Fd())) }
