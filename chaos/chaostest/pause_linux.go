package chaostest

import (
	"bytes"
	"fmt"
	"os"
	"strconv"
	"time"
)

// waitStopped waits until /proc reports the process as stopped.
func waitStopped(pid int, d time.Duration) error {
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
