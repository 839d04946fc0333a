package main

import (
	"fmt"
	"io"
	"os"
	"runtime/pprof"
)

// profileEnv names the file where the binary writes a CPU profile of its
// whole run (pprof format; `go tool pprof idem FILE` reads it), for
// measuring a command under load (make bench-consume with
// IDEM_BENCH_CPU_PROFILE). The profile is written when the command
// returns, after SIGTERM or Ctrl-C too, not after SIGKILL.
const profileEnv = "IDEM_CPU_PROFILE"

// startProfile starts the CPU profile that getenv(profileEnv) asks for,
// if any, and returns the function that writes it. A failure to start is
// reported on stderr and the command runs without a profile.
func startProfile(getenv func(string) string, stderr io.Writer) (stop func()) {
	path := getenv(profileEnv)
	if path == "" {
		return func() {}
	}
	f, err := os.Create(path)
	if err != nil {
		fmt.Fprintf(stderr, "idem: %s: %v\n", profileEnv, err)
		return func() {}
	}
	if err := pprof.StartCPUProfile(f); err != nil {
		fmt.Fprintf(stderr, "idem: %s: %v\n", profileEnv, err)
		f.Close()
		return func() {}
	}
	return func() {
		pprof.StopCPUProfile()
		if err := f.Close(); err != nil {
			fmt.Fprintf(stderr, "idem: %s: %v\n", profileEnv, err)
		}
	}
}
