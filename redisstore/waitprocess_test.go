package redisstore_test

import (
	"bufio"
	"context"
	"errors"
	"os"
	"os/exec"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/idemgo/idem"
	"github.com/idemgo/idem/redisstore"
	"github.com/idemgo/idem/storekit"
	"github.com/idemgo/idem/testkit/redistest"
)

// TestWaitingDoAcrossProcesses: the first attempt of a key runs in another
// process (this test binary, run again as a child) and holds the key until
// the test lets it end. Here, a Do of the same key without a wait gets an
// *idem.InProgressError (the control: what a caller got before
// idem.WaitFor); a Do with WaitFor waits, is woken when the child
// completes, and replays the child's result without running its own.
func TestWaitingDoAcrossProcesses(t *testing.T) {
	if addr := os.Getenv("IDEM_WAIT_CHILD"); addr != "" {
		waitChild(t, addr)
		return
	}
	t.Parallel()
	srv := redistest.Start(t)
	cmd := exec.Command(os.Args[0], "-test.run=^TestWaitingDoAcrossProcesses$", "-test.count=1")
	cmd.Env = append(os.Environ(), "IDEM_WAIT_CHILD="+srv.Addr())
	cmd.Stderr = os.Stderr
	release, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
	lines := bufio.NewScanner(out)
	for lines.Scan() && lines.Text() != "running" {
	}
	if lines.Err() != nil {
		t.Fatalf("the child did not start its attempt: %v", lines.Err())
	}

	st := newStore(t, srv.GoRedis(t))
	var ran atomic.Int32
	fn := func(context.Context) ([]byte, error) { ran.Add(1); return []byte("second"), nil }

	control, err := idem.New(st)
	if err != nil {
		t.Fatal(err)
	}
	_, err = control.Do(t.Context(), waitKey, "fp", fn)
	if ipe := (*idem.InProgressError)(nil); !errors.As(err, &ipe) || ran.Load() != 0 {
		t.Fatalf("without a wait: got %v, ran %d times; want an *idem.InProgressError, ran 0 times", err, ran.Load())
	}

	probe := &getProbe{Store: st, got: make(chan struct{})}
	exec, err := idem.New(probe)
	if err != nil {
		t.Fatal(err)
	}
	type outcome struct {
		res idem.Result
		err error
	}
	done := make(chan outcome, 1)
	go func() {
		res, err := exec.Do(t.Context(), waitKey, "fp", fn, idem.WaitFor(time.Minute))
		done <- outcome{res, err}
	}()
	select {
	case <-probe.got: // the waiter found the key in progress and looks at its record
	case o := <-done:
		t.Fatalf("the waiter returned before the child ended: %q, %v", o.res.Value, o.err)
	}
	release.Close() // the child completes its attempt
	o := <-done
	if o.err != nil || !o.res.Replayed || string(o.res.Value) != "first" || ran.Load() != 0 {
		t.Fatalf("waiter: got %q replayed=%v, %v, ran %d times; want the replay of the child's %q, ran 0 times", o.res.Value, o.res.Replayed, o.err, ran.Load(), "first")
	}
	lines.Scan()
	if lines.Text() != "completed" {
		t.Fatalf("the child said %q, want completed", lines.Text())
	}
}

var waitKey = idem.Key{Scope: "TestWaitingDoAcrossProcesses", ID: "k"}

// waitChild is the child's side: it runs the key's first attempt, says
// "running" on its standard output, holds the key until its standard
// input closes, then completes with "first" and says "completed".
func waitChild(t *testing.T, addr string) {
	c := redis.NewClient(&redis.Options{Addr: addr})
	defer c.Close()
	st, err := redisstore.New(c)
	if err != nil {
		t.Fatal(err)
	}
	exec, err := idem.New(st)
	if err != nil {
		t.Fatal(err)
	}
	_, err = exec.Do(context.Background(), waitKey, "fp", func(context.Context) ([]byte, error) {
		os.Stdout.WriteString("running\n")
		var b [1]byte
		os.Stdin.Read(b[:]) // returns at EOF: the parent closed it
		return []byte("first"), nil
	})
	if err != nil {
		t.Fatal(err)
	}
	os.Stdout.WriteString("completed\n")
}

// getProbe closes got at the first Get: a waiter reads the record of the
// key it found in progress. It unwraps to the store, so that the Executor
// finds the store's storekit.Watcher (storekit.StoreAs).
type getProbe struct {
	storekit.Store
	gets atomic.Int32
	got  chan struct{}
}

func (p *getProbe) Get(ctx context.Context, key string) (storekit.Record, error) {
	if p.gets.Add(1) == 1 {
		close(p.got)
	}
	return p.Store.Get(ctx, key)
}

func (p *getProbe) Unwrap() storekit.Store { return p.Store }
