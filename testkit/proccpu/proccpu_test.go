package proccpu

import (
	"os"
	"runtime"
	"testing"
	"time"
)

func TestReadSelf(t *testing.T) {
	if runtime.GOOS != "linux" {
		// Deliberate: Read reads /proc/PID/stat, which only Linux has;
		// elsewhere it reports no process, which TestReadNoProcess covers.
		t.Skip("Read needs Linux's /proc")
	}
	_, before, ok := Read(os.Getpid())
	if !ok {
		t.Fatal("no CPU time for this process")
	}
	// Burn CPU until the kernel's tick accounting shows it (10 ms ticks).
	deadline := time.Now().Add(10 * time.Second)
	x := 0
	for {
		for i := range 1 << 20 {
			x += i
		}
		_, now, _ := Read(os.Getpid())
		if now > before {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("CPU time did not grow in 10s of work (%v, %d)", before, x)
		}
	}
}

func TestReadNoProcess(t *testing.T) {
	if _, _, ok := Read(-1); ok {
		t.Error("Read(-1) reported a process")
	}
}
