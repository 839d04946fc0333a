package chaostest

import (
	"fmt"
	"io"
	"os"
	"os/exec"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// childEnv names the child role a test binary runs as (see Child).
const childEnv = "IDEM_CHAOS_CHILD"

// Role returns the role this process was started with by StartChild, or "".
// A test binary's TestMain calls it first and, when it is not "", runs the
// role and exits instead of running the tests:
//
//	func TestMain(m *testing.M) {
//		if role := chaostest.Role(); role != "" {
//			os.Exit(runChild(role))
//		}
//		os.Exit(m.Run())
//	}
func Role() string { return os.Getenv(childEnv) }

// Proc is a child process: the test binary itself, run as a role.
type Proc struct {
	t    testing.TB
	cmd  *exec.Cmd
	out  chan string // stdout, line by line
	errb *lockedBuffer
	done chan struct{}
	err  error
}

type lockedBuffer struct {
	mu sync.Mutex
	b  strings.Builder
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// StartChild starts the test binary again as role, with env added to the
// environment. The child's stdout is read line by line (Line); its stderr is
// logged if the test fails. It is killed, by its PID, when the test ends.
func StartChild(t testing.TB, role string, env ...string) *Proc {
	t.Helper()
	return StartCommand(t, os.Args[0], []string{"-test.run=^$"}, append([]string{childEnv + "=" + role}, env...)...)
}

// Pid returns the child's process ID.
func (p *Proc) Pid() int { return p.cmd.Process.Pid }

// Signal sends sig to the child, if it is still running.
func (p *Proc) Signal(sig syscall.Signal) {
	select {
	case <-p.done:
	default:
		_ = p.cmd.Process.Signal(sig)
	}
}

// Kill sends SIGKILL and waits for the child to be gone.
func (p *Proc) Kill() {
	p.Signal(syscall.SIGKILL)
	<-p.done
}

// Wait waits at most d for the child to exit and returns its error (nil for
// exit code 0).
func (p *Proc) Wait(d time.Duration) error {
	select {
	case <-p.done:
		return p.err
	case <-time.After(d):
		return fmt.Errorf("chaostest: child still running after %v", d)
	}
}

// Line returns the child's next line of stdout, failing the test if none
// comes within d or the child exited.
func (p *Proc) Line(d time.Duration) string {
	p.t.Helper()
	select {
	case line, ok := <-p.out:
		if !ok {
			p.t.Fatalf("chaostest: child exited (%v) before writing a line; stderr:\n%s", p.wait(), p.errb.String())
		}
		return line
	case <-time.After(d):
		p.t.Fatalf("chaostest: no line from the child within %v; stderr:\n%s", d, p.errb.String())
	}
	return ""
}

// NextLine returns the child's next line of stdout, waiting at most d. ok
// is false if none came in time or the child exited; unlike Line, it
// never fails the test, so a goroutine that supervises the child may call
// it.
func (p *Proc) NextLine(d time.Duration) (line string, ok bool) {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case line, ok := <-p.out:
		return line, ok
	case <-t.C:
		return "", false
	}
}

// Expect reads lines until one starts with prefix, and returns it.
func (p *Proc) Expect(prefix string, d time.Duration) string {
	p.t.Helper()
	deadline := time.Now().Add(d)
	for {
		line := p.Line(time.Until(deadline))
		if strings.HasPrefix(line, prefix) {
			return line
		}
	}
}

func (p *Proc) wait() error {
	select {
	case <-p.done:
		return p.err
	case <-time.After(5 * time.Second):
		return fmt.Errorf("still running")
	}
}

// Stderr returns what the child wrote to stderr so far.
func (p *Proc) Stderr() string { return p.errb.String() }

// Say writes a line to stdout, for a child to report to its parent.
func Say(format string, args ...any) {
	fmt.Fprintf(os.Stdout, format+"\n", args...)
}

var _ io.Writer = (*lockedBuffer)(nil)
