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

// waitStopped waits until the kernel reports the process as stopped, so
// that Pause returns only once the server no longer runs.
func waitStopped(p *os.Process) error {
	path := "/proc/" + strconv.Itoa(p.Pid) + "/stat"
	deadline := time.Now().Add(exitTimeout)
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
			return fmt.Errorf("process %d not stopped after %v", p.Pid, exitTimeout)
		}
		time.Sleep(time.Millisecond) // poll /proc until the stop is visible
	}
}
