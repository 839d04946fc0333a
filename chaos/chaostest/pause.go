package chaostest

import (
	"syscall"
	"time"

	"github.com/idemgo/idem/testkit/redistest"
)

// Pause sends SIGSTOP to the process and returns once the kernel reports it
// stopped (on Linux; elsewhere once the signal was sent), failing the test
// if that takes longer than d. Resume it with Signal(syscall.SIGCONT); the
// cleanup of StartChild and StartCommand resumes it before killing it.
func (p *Proc) Pause(d time.Duration) {
	p.t.Helper()
	p.Signal(syscall.SIGSTOP)
	if err := redistest.WaitStopped(p.Pid(), d); err != nil {
		p.t.Fatalf("chaostest: %v", err)
	}
}
