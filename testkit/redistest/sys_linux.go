package redistest

import (
	"bytes"
	"fmt"
	"os"
	"strconv"
	"syscall"
	"time"
)

// sysProcAttr makes the kernel kill redis-server when the test binary dies,
// so that a test binary killed by its -timeout does not leave servers
// behind. The signal is tied to the OS thread that started the process;
// that thread only exits if a goroutine locked to it (runtime.LockOSThread)
// returns without unlocking, which neither the tests nor their Redis
// clients do.
func sysProcAttr() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
}

// WaitStopped waits, for at most d, until the kernel reports process pid
// as stopped (after SIGSTOP), so that a caller that paused it knows it no
// longer runs.
func WaitStopped(pid int, d time.Duration) error {
	path := "/proc/" + strconv.Itoa(pid) + "/stat"
	deadline := time.Now().Add(d)
	for {
		data, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		// The state follows the command name, which is in parentheses.
		if i := bytes.LastIndexByte(data, ')'); i >= 0 && i+2 < len(data) {
			if state := data[i+2]; state == 'T' || state == 't' {
				return nil
			}
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("process %d not stopped after %v", pid, d)
		}
		time.Sleep(time.Millisecond) // poll /proc until the stop is visible
	}
}
