package main

import "syscall"

// sysProcAttr makes the kernel kill the processes a test starts when the
// test binary dies, so that none is left behind after a -timeout.
func sysProcAttr() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
}
