// Package proccpu reads the CPU time of a process (Read: any process, from
// Linux's /proc; Self: this one, with getrusage), for the benchmarks that
// say where each request's, key's or message's time goes (the load
// generator, the server, Redis, Postgres).
//
// It lives in testkit, the packages that serve idem's own tests and those
// who write a store or a broker adapter for idem (docs/design.md#where-new-code-goes);
// its API is not covered by the modules' compatibility promise and may
// change in any release.
package proccpu

import (
	"os"
	"strconv"
	"strings"
)

// Read returns the command name of process pid and the CPU seconds (user +
// system) it has used so far, from /proc/PID/stat; ok is false where there
// is no such process or no /proc.
func Read(pid int) (comm string, secs float64, ok bool) {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return "", 0, false
	}
	s := string(b)
	// The command name is in parentheses and may hold spaces and
	// parentheses itself: it ends at the last ')'.
	open, end := strings.IndexByte(s, '('), strings.LastIndexByte(s, ')')
	if open < 0 || end < open {
		return "", 0, false
	}
	f := strings.Fields(s[end+1:]) // f[0] is field 3 (state); utime and stime are fields 14 and 15
	if len(f) < 13 {
		return "", 0, false
	}
	utime, err1 := strconv.ParseFloat(f[11], 64)
	stime, err2 := strconv.ParseFloat(f[12], 64)
	if err1 != nil || err2 != nil {
		return "", 0, false
	}
	return s[open+1 : end], (utime + stime) / clockTicks, true
}

// clockTicks is USER_HZ, the unit of /proc's CPU times: 100 on every Linux
// architecture Go supports.
const clockTicks = 100
