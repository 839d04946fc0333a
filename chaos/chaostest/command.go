package chaostest

import (
	"bufio"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
)

// StartCommand starts the program at path with args as a Proc, with env
// added to the test's environment: for processes other than the test binary,
// such as the idem proxy. Like StartChild, its stdout is read line by line
// (Line, Expect), its stderr is kept (Stderr, ExpectStderr) and logged if the
// test fails, and it is killed, by its PID, when the test ends.
func StartCommand(t testing.TB, path string, args []string, env ...string) *Proc {
	t.Helper()
	cmd := exec.Command(path, args...)
	cmd.Env = append(append(os.Environ(), "GORACE=atexit_sleep_ms=0"), env...)
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	p := &Proc{t: t, cmd: cmd, out: make(chan string, 1024), errb: &lockedBuffer{}, done: make(chan struct{})}
	cmd.Stderr = p.errb
	if err := cmd.Start(); err != nil {
		t.Fatalf("chaostest: start %s: %v", path, err)
	}
	go func() {
		r := bufio.NewReader(stdout)
		for {
			line, err := r.ReadString('\n')
			if line != "" {
				p.out <- strings.TrimRight(line, "\n")
			}
			if err != nil {
				break
			}
		}
		close(p.out)
	}()
	go func() {
		p.err = cmd.Wait()
		close(p.done)
	}()
	name := filepath.Base(path) + " " + strings.Join(args, " ")
	t.Cleanup(func() {
		p.Signal(syscall.SIGCONT)
		p.Kill()
		if strings.Contains(p.errb.String(), "DATA RACE") {
			t.Errorf("the race detector found a data race in %s", name)
		}
		if t.Failed() {
			t.Logf("%s stderr:\n%s", name, p.errb.String())
		}
	})
	return p
}

// ExpectStderr waits at most d for a line of the process's stderr that
// contains substr, and returns it. It fails the test if none comes or the
// process exits first. It looks at what was written so far every 10ms.
func (p *Proc) ExpectStderr(substr string, d time.Duration) string {
	p.t.Helper()
	deadline := time.Now().Add(d)
	for {
		for line := range strings.Lines(p.errb.String()) {
			if strings.Contains(line, substr) {
				return strings.TrimRight(line, "\n")
			}
		}
		select {
		case <-p.done:
			p.t.Fatalf("chaostest: process exited (%v) before writing %q to stderr:\n%s", p.err, substr, p.errb.String())
		default:
		}
		if time.Now().After(deadline) {
			p.t.Fatalf("chaostest: %q not on stderr within %v:\n%s", substr, d, p.errb.String())
		}
		time.Sleep(10 * time.Millisecond) // poll the buffer until the line is there
	}
}

// Exited reports whether the process has exited.
func (p *Proc) Exited() bool {
	select {
	case <-p.done:
		return true
	default:
		return false
	}
}
