//go:build linux || darwin

package idemgrpc_test

import (
	"syscall"
	"time"
)

// processCPU returns the CPU time (user and system) this process has used
// so far, for the benchmarks' cpu-µs/call: on a machine shared with other
// work it moves far less than the calls per second do.
func processCPU() (time.Duration, bool) {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0, false
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano()), true
}
