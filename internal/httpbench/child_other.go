//go:build !linux

package main

import "os/exec"

// child returns cmd: ending it with this process needs Linux's Pdeathsig.
func child(cmd *exec.Cmd) *exec.Cmd { return cmd }
