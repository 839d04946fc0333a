//go:build !linux && !darwin

package idemgrpc_test

import "time"

// processCPU is not measured here: the benchmarks report no cpu-µs/call.
func processCPU() (time.Duration, bool) { return 0, false }
