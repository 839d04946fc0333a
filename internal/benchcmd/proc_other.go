//go:build !linux

package main

import "syscall"

// sysProcAttr returns nil: only Linux can tie the server's life to this
// command's; elsewhere the deferred cleanup alone stops it.
func sysProcAttr() *syscall.SysProcAttr { return nil }
