//go:build !linux

package main

import "syscall"

// sysProcAttr returns nil: only Linux can tie the server's life to this
// command's; elsewhere the deferred cleanup alone stops it.
func sysProcAttr() *syscall.SysProcAttr { return nil }

// processCPU returns 0: the CPU column stays empty where getrusage is not
// used.
func processCPU() float64 { return 0 }
