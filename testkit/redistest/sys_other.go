//go:build !linux

package redistest

import (
	"syscall"
	"time"
)

// sysProcAttr returns nil: only Linux can kill the child when the test
// binary dies, so elsewhere a test binary killed by its -timeout may leave
// servers behind.
func sysProcAttr() *syscall.SysProcAttr { return nil }

// WaitStopped returns at once: only Linux tells, through /proc, when the
// stop has taken effect.
func WaitStopped(int, time.Duration) error { return nil }
