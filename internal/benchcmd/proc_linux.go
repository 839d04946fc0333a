package main

import (
	"syscall"
	"time"
)

// sysProcAttr makes the kernel kill redis-server if this command dies
// without running its cleanup (SIGKILL). The signal is tied to the OS thread
// that started the process, which only exits if a goroutine locked to it
// returns without unlocking; nothing here locks threads.
func sysProcAttr() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
}

// processCPU returns the CPU time, user and system, this process has used,
// in seconds.
func processCPU() float64 {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano()).Seconds()
}
