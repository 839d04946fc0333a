package main

import (
	"bytes"
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/idemgo/idem/testkit/redistest"
)

// server is the throwaway redis-server the command measures against.
type server struct {
	cmd  *exec.Cmd
	port int
	dir  string
	wrap []string      // a command that runs redis-server (valgrind …), or none
	done chan struct{} // closed once the process has exited
}

// startServer starts redis-server on a free loopback port, without
// persistence, and waits until it answers PING. If another process takes
// the port first, it tries another one. wrap, if given, is a command line
// that runs redis-server under another program (valgrind …).
func startServer(ctx context.Context, wrap ...string) (*server, error) {
	dir, err := os.MkdirTemp("", "idem-bench-")
	if err != nil {
		return nil, err
	}
	var lastErr error
	for range 5 {
		port, err := freePort()
		if err != nil {
			os.RemoveAll(dir)
			return nil, err
		}
		s := &server{port: port, dir: dir, wrap: wrap, done: make(chan struct{})}
		err = s.launch(ctx)
		if err == nil {
			return s, nil
		}
		lastErr = err
		if !strings.Contains(err.Error(), "Address already in use") {
			break
		}
	}
	os.RemoveAll(dir)
	return nil, lastErr
}

func freePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, fmt.Errorf("find a free port: %w", err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

func (s *server) launch(ctx context.Context) error {
	logPath := filepath.Join(s.dir, "redis.log")
	argv := append(append([]string{}, s.wrap...), "redis-server",
		"--port", strconv.Itoa(s.port), "--bind", "127.0.0.1",
		"--save", "", "--appendonly", "no",
		"--dir", s.dir, "--logfile", logPath)
	s.cmd = exec.Command(argv[0], argv[1:]...)
	s.cmd.SysProcAttr = sysProcAttr()
	if err := s.cmd.Start(); err != nil {
		return fmt.Errorf("start redis-server: %w", err)
	}
	go func() {
		s.cmd.Wait()
		close(s.done)
	}()
	wait := 10 * time.Second
	if len(s.wrap) > 0 {
		wait = 2 * time.Minute // valgrind starts slowly, more so on a busy machine
	}
	deadline := time.Now().Add(wait)
	for {
		if err := redistest.Probe(s.addr(), s.cmd.Process.Pid); err == nil {
			return nil
		}
		select {
		case <-s.done:
			log, _ := os.ReadFile(logPath)
			return fmt.Errorf("redis-server exited at start: %s", tail(log, 10))
		case <-ctx.Done():
			s.stop()
			return ctx.Err()
		case <-time.After(10 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			s.stop()
			return fmt.Errorf("redis-server did not answer PING within %v", wait)
		}
	}
}

// runqueueWait returns how long, in seconds, the server's main thread has
// been runnable but waiting for a core so far (the second field of Linux's
// /proc/PID/schedstat), or 0 where that is not known.
func (s *server) runqueueWait() float64 {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(s.cmd.Process.Pid) + "/schedstat")
	if err != nil {
		return 0
	}
	f := strings.Fields(string(b))
	if len(f) < 2 {
		return 0
	}
	ns, _ := strconv.ParseFloat(f[1], 64)
	return ns / 1e9
}

func (s *server) addr() string { return "127.0.0.1:" + strconv.Itoa(s.port) }

// stop kills the server by its PID, waits for it to exit and removes its
// directory.
func (s *server) stop() {
	if s.cmd != nil && s.cmd.Process != nil {
		s.cmd.Process.Kill()
		<-s.done
	}
}

func (s *server) remove() { os.RemoveAll(s.dir) }

func tail(b []byte, n int) string {
	lines := bytes.Split(bytes.TrimSpace(b), []byte("\n"))
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return string(bytes.Join(lines, []byte("\n")))
}
