package boltstore

import (
	"bufio"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/idemgo/idem"
	"github.com/idemgo/idem/storekit"
)

// crashEnv names the file the helper process writes to; the helper does
// nothing without it.
const crashEnv = "BOLTSTORE_CRASH_DB"

// TestMain runs the tests, or, when TestCrash started this binary again
// with crashEnv set, the crash helper instead.
func TestMain(m *testing.M) {
	if path := os.Getenv(crashEnv); path != "" {
		crashHelper(path)
		return
	}
	os.Exit(m.Run())
}

// crashHelper is the process TestCrash kills: it acquires and completes
// keys from several goroutines, printing "ok <key> <fence>" once Complete
// returned, until it is killed.
func crashHelper(path string) {
	round := os.Getenv(crashEnv + "_ROUND")
	var opts []Option
	if n, err := strconv.ParseInt(os.Getenv(crashEnv+"_LOGLIMIT"), 10, 64); err == nil {
		opts = append(opts, withLogLimit(n))
	}
	s, err := Open(path, opts...)
	if err != nil {
		fmt.Fprintln(os.Stderr, "open:", err)
		os.Exit(2)
	}
	ctx := context.Background()
	var (
		out sync.Mutex
		seq atomic.Int64
	)
	fmt.Println("ready")
	var wg sync.WaitGroup
	for range 16 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				key := idem.Key{Scope: "crash", ID: fmt.Sprint(round, "-", seq.Add(1))}.Digest()
				a, err := s.Acquire(ctx, key, storekit.AcquireRequest{Fingerprint: "fp", Owner: "helper", Lease: time.Minute, Retention: time.Hour})
				if err == nil && a.Outcome != storekit.Acquired {
					err = fmt.Errorf("outcome %v", a.Outcome)
				}
				if err == nil {
					err = s.Complete(ctx, key, a.Lease, []byte(key), time.Hour)
				}
				if err != nil {
					fmt.Fprintln(os.Stderr, "helper:", err)
					os.Exit(3)
				}
				out.Lock()
				// One write(2) per line, straight to the pipe: nothing is
				// acknowledged that is not on disk, and nothing on disk is
				// lost in a buffer of ours.
				os.Stdout.WriteString("ok " + key + " " + strconv.FormatInt(a.Lease.Fence, 10) + "\n")
				out.Unlock()
			}
		}()
	}
	wg.Wait()
}

// TestCrash kills a process that writes to the store (SIGKILL, at a random
// point of its group commits) and checks that every key it reported as
// completed is COMPLETED after reopening, and that fences keep growing.
// It does so a few times on the same file; in every other round the log is
// small, so that the writer makes checkpoints all the time and the kill
// may land in one.
func TestCrash(t *testing.T) {
	if testing.Short() {
		// Only for -short runs; make test and CI run it.
		t.Skip("starts processes")
	}
	path := filepath.Join(t.TempDir(), "idem.db")
	acked := map[string]int64{}
	var maxFence int64
	for round := range 4 {
		cmd := exec.Command(os.Args[0], "-test.run=^$")
		cmd.Env = append(os.Environ(), crashEnv+"="+path, crashEnv+"_ROUND="+strconv.Itoa(round))
		if round%2 == 1 {
			cmd.Env = append(cmd.Env, crashEnv+"_LOGLIMIT=65536")
		}
		cmd.Stderr = os.Stderr
		stdout, err := cmd.StdoutPipe()
		if err != nil {
			t.Fatal(err)
		}
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		lines := bufio.NewScanner(stdout)
		if !lines.Scan() || lines.Text() != "ready" {
			cmd.Process.Kill()
			cmd.Wait()
			t.Fatalf("helper did not start: %q %v", lines.Text(), lines.Err())
		}
		// Let it write for a while, then kill it in the middle of its work.
		timer := time.AfterFunc(time.Duration(300+200*round)*time.Millisecond, func() {
			cmd.Process.Signal(syscall.SIGKILL)
		})
		n := 0
		for lines.Scan() {
			f := strings.Fields(lines.Text())
			if len(f) != 3 || f[0] != "ok" {
				t.Fatalf("helper printed %q", lines.Text())
			}
			fence, err := strconv.ParseInt(f[2], 10, 64)
			if err != nil {
				t.Fatal(err)
			}
			acked[f[1]] = fence
			maxFence = max(maxFence, fence)
			n++
		}
		timer.Stop()
		err = cmd.Wait()
		if ws, ok := cmd.ProcessState.Sys().(syscall.WaitStatus); !ok || !ws.Signaled() || ws.Signal() != syscall.SIGKILL {
			t.Fatalf("helper ended with %v, want killed by SIGKILL", err)
		}
		if n == 0 {
			t.Fatalf("round %d: helper completed no key before it was killed", round)
		}
		t.Logf("round %d: %d keys acknowledged before SIGKILL", round, n)

		// Every acknowledged key survived, with its result.
		s, err := Open(path, WithLockTimeout(5*time.Second))
		if err != nil {
			t.Fatalf("reopen after kill: %v", err)
		}
		ctx := t.Context()
		for key, fence := range acked {
			rec, err := s.Get(ctx, key)
			if err != nil {
				t.Fatalf("acknowledged key %s after the crash: %v", key, err)
			}
			if rec.State != storekit.StateCompleted || rec.Fence != fence || string(rec.Result) != key {
				t.Fatalf("acknowledged key %s after the crash: got %v fence %d result %q, want COMPLETED fence %d", key, rec.State, rec.Fence, rec.Result, fence)
			}
		}
		if err := s.Close(); err != nil {
			t.Fatal(err)
		}
		// The last fence issued survived too: a new key gets a higher one
		// even from a clock far in the past.
		s, err = Open(path, WithClock(func() time.Time { return time.Unix(1, 0) }))
		if err != nil {
			t.Fatal(err)
		}
		a, err := s.Acquire(ctx, fmt.Sprint("after-crash-", round), storekit.AcquireRequest{Owner: "t", Lease: time.Millisecond, Retention: time.Millisecond})
		if err != nil {
			t.Fatal(err)
		}
		if a.Lease.Fence <= maxFence {
			t.Fatalf("fence after the crash: got %d, want > %d", a.Lease.Fence, maxFence)
		}
		maxFence = a.Lease.Fence
		if err := s.Close(); err != nil {
			t.Fatal(err)
		}
	}
}
