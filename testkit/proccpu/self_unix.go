//go:build unix

package proccpu

import (
	"syscall"
	"time"
)

// Self returns the CPU time, user and system, this process has used so far,
// in seconds (getrusage: microsecond resolution, finer than /proc's ticks).
func Self() float64 {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano()).Seconds()
}
