package main

import (
	"os/exec"
	"syscall"
)

// child makes cmd's process end with this one, even when this one dies on
// log.Fatal (which runs no deferred call): otherwise a failed run would
// leave its redis-server and servers running.
func child(cmd *exec.Cmd) *exec.Cmd {
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	return cmd
}
