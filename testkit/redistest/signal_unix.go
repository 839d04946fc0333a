//go:build unix

package redistest

import (
	"os"
	"syscall"
)

// terminate asks the process to shut down cleanly.
func terminate(p *os.Process) error { return p.Signal(syscall.SIGTERM) }

// pause stops the process and waits until the stop has taken effect (on
// Linux; elsewhere WaitStopped cannot tell).
func pause(p *os.Process) error {
	if err := p.Signal(syscall.SIGSTOP); err != nil {
		return err
	}
	return WaitStopped(p.Pid, exitTimeout)
}

// resume continues a stopped process.
func resume(p *os.Process) error { return p.Signal(syscall.SIGCONT) }
