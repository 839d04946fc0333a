package main

import "syscall"

// sysProcAttr makes the kernel kill redis-server if this command dies
// without running its cleanup (SIGKILL). The signal is tied to the OS thread
// that started the process, which only exits if a goroutine locked to it
// returns without unlocking; nothing here locks threads.
func sysProcAttr() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
}
