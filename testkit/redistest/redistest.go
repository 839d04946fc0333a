package redistest

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"
)

const (
	// readyTimeout bounds how long a start waits for PING to answer.
	readyTimeout = 10 * time.Second
	// exitTimeout bounds how long Kill and Stop wait for the process to exit.
	exitTimeout = 10 * time.Second
	// rebindTimeout bounds how long Restart retries when its port is taken.
	rebindTimeout = 10 * time.Second
	// startAttempts is how many ports Start tries when another process
	// takes the one it picked before redis-server binds it.
	startAttempts = 10
	// pollInterval is the pause between two readiness probes.
	pollInterval = 10 * time.Millisecond
	// logTailLines is how many log lines a failure message shows.
	logTailLines = 30
)

// installHint is the command that Available's error names.
const installHint = "apt-get install -y redis-server"

// reservedOptions are the redis-server options that the harness owns: a test
// that set them would break Addr, the log capture or the cleanup.
var reservedOptions = map[string]bool{
	"port":      true,
	"bind":      true,
	"dir":       true,
	"logfile":   true,
	"daemonize": true,
}

// errPortInUse reports that redis-server could not bind its port (or its
// cluster bus port) because another process holds it.
var errPortInUse = errors.New("port already in use")

// Available reports whether redis-server and redis-cli are on PATH. The error
// names the missing binary and the command that installs both.
func Available() error {
	for _, name := range []string{"redis-server", "redis-cli"} {
		if _, err := exec.LookPath(name); err != nil {
			return fmt.Errorf("redistest: %s not found on PATH; install it with `%s` (the package provides redis-server and redis-cli): %w",
				name, installHint, err)
		}
	}
	return nil
}

// Server is a redis-server process started for a test by Start. It listens
// on 127.0.0.1 on a port of its own and keeps its files in its own temporary
// directory; both stay the same across Kill, Stop and Restart.
//
// Addr, Dir, LogPath and Command may be called from any goroutine. The
// lifecycle methods (Kill, Stop, Restart, Pause, Resume) are serialized by a
// mutex, but as they call t.Fatal they belong on the test's goroutine.
type Server struct {
	port    int
	dir     string
	logPath string
	argv    []string // redis-server arguments, harness options first

	mu       sync.Mutex
	proc     *process // nil while the server is not running
	paused   bool
	logShown bool // a failure message already showed the log tail
}

// process is one run of redis-server.
type process struct {
	cmd  *exec.Cmd
	done chan struct{} // closed once Wait has returned
	err  error         // Wait's result; read only after done is closed
}

// Start starts a redis-server on a free loopback port with its own
// t.TempDir as --dir, waits (at most 10s) until it answers PING, and
// registers a cleanup that kills it.
//
// Persistence is off by default (--save "" --appendonly no). args are extra
// redis-server options in command-line form, such as "--appendonly", "yes",
// "--appendfsync", "always"; they come after the defaults, so they override
// them. The options port, bind, dir, logfile and daemonize belong to the
// harness and are refused.
//
// If another process takes the chosen port before redis-server binds it,
// Start tries another port. Any other failure, including a missing
// redis-server, fails the test with the end of the server log.
func Start(t testing.TB, args ...string) *Server {
	t.Helper()
	return start(t, args)
}

func start(t testing.TB, args []string) *Server {
	t.Helper()
	return startConf(t, "", args)
}

// startConf is start with a configuration file, written by conf into the
// server's directory before each start attempt and given to redis-server
// as its first argument (Sentinel needs one it can rewrite). conf is
// called with the port; "" means none.
func startConf(t testing.TB, conf string, args []string) *Server {
	t.Helper()
	if err := Available(); err != nil {
		t.Fatal(err)
	}
	if err := checkArgs(args); err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	confDir := dir
	if conf != "" {
		confDir = memDir(t)
	}
	s := &Server{dir: dir, logPath: filepath.Join(dir, "redis.log")}
	// Registered after t.TempDir, so it runs before the directory is
	// removed: the process is gone and the log is still there.
	t.Cleanup(func() { s.cleanup(t) })

	var lastErr error
	for range startAttempts {
		port, err := pickPort()
		if err != nil {
			t.Fatalf("redistest: %v", err)
		}
		s.port = port
		s.argv = buildArgv(port, dir, args)
		if conf != "" {
			path := filepath.Join(confDir, "redis.conf")
			if err := os.WriteFile(path, []byte(conf), 0o644); err != nil {
				t.Fatalf("redistest: %v", err)
			}
			s.argv = append([]string{path}, s.argv...)
		}
		s.mu.Lock()
		err = s.launch()
		s.mu.Unlock()
		if err == nil {
			return s
		}
		if !errors.Is(err, errPortInUse) {
			t.Fatalf("redistest: start redis-server %q: %v\n%s", s.argv, err, s.failureLog())
		}
		lastErr = err
	}
	t.Fatalf("redistest: start redis-server: no free port after %d attempts: %v", startAttempts, lastErr)
	return nil
}

// memDir returns a new directory on a memory file system (/dev/shm) where
// there is one, else in the test's temporary directory; it is removed when
// the test ends. Sentinel rewrites its configuration file, with fsync, in
// its main thread on every change: on a loaded disk one such write can
// take over 2 s, which puts the Sentinel in TILT mode for 30 s, and a
// primary killed meanwhile may then never be failed over (its replicas
// look too long disconnected by then).
func memDir(t testing.TB) string {
	t.Helper()
	if fi, err := os.Stat("/dev/shm"); err == nil && fi.IsDir() {
		if d, err := os.MkdirTemp("/dev/shm", "redistest-"); err == nil {
			t.Cleanup(func() { os.RemoveAll(d) })
			return d
		}
	}
	return t.TempDir()
}

// checkArgs refuses arguments that redis-server would read as a config file
// path and options that the harness owns.
func checkArgs(args []string) error {
	if len(args) > 0 && !strings.HasPrefix(args[0], "--") {
		return fmt.Errorf("redistest: server args must be redis-server options such as \"--appendonly\", \"yes\"; got %q first", args[0])
	}
	for _, a := range args {
		if !strings.HasPrefix(a, "--") {
			continue
		}
		fields := strings.Fields(strings.TrimPrefix(a, "--"))
		if len(fields) > 0 && reservedOptions[strings.ToLower(fields[0])] {
			return fmt.Errorf("redistest: option %q is set by the harness and cannot be overridden", a)
		}
	}
	return nil
}

// buildArgv returns the redis-server arguments: the harness's options, the
// defaults, then the test's own options, which win over the defaults.
func buildArgv(port int, dir string, args []string) []string {
	argv := []string{
		"--port", strconv.Itoa(port),
		"--bind", "127.0.0.1",
		"--dir", dir,
		"--daemonize", "no",
		"--save", "",
		"--appendonly", "no",
	}
	return append(argv, args...)
}

// Addr returns the server's address, "127.0.0.1:port". It does not change
// across restarts.
func (s *Server) Addr() string { return "127.0.0.1:" + strconv.Itoa(s.port) }

// Dir returns the server's working directory (--dir), where its RDB, AOF and
// cluster config files live. It is removed when the test ends.
func (s *Server) Dir() string { return s.dir }

// LogPath returns the path of the server's log file, which collects the
// output of every run of the server. It is removed when the test ends.
func (s *Server) LogPath() string { return s.logPath }

// Kill sends SIGKILL to the server, as a crash would, and waits until the
// process has exited; then its port refuses connections. Killing a server
// that is not running does nothing.
func (s *Server) Kill(t testing.TB) {
	t.Helper()
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.proc == nil {
		return
	}
	if err := s.proc.kill(); err != nil {
		t.Fatalf("redistest: kill redis-server on %s: %v", s.Addr(), err)
	}
	s.proc, s.paused = nil, false
}

// Stop asks the server to shut down (SIGTERM, which makes redis-server flush
// its AOF and exit cleanly) and waits, at most 10s, until it has exited. A
// paused server is resumed so that it can handle the signal. Stopping a
// server that is not running does nothing.
func (s *Server) Stop(t testing.TB) {
	t.Helper()
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.proc == nil {
		return
	}
	p := s.proc
	err := terminate(p.cmd.Process)
	if err == nil && s.paused {
		err = resume(p.cmd.Process)
	}
	if err == nil {
		err = p.wait(exitTimeout)
	}
	if err != nil {
		killErr := p.kill()
		s.proc, s.paused = nil, false
		s.logShown = true
		t.Fatalf("redistest: stop redis-server on %s: %v (then killed it: %v)\n%s", s.Addr(), err, killErr, s.logTail())
	}
	s.proc, s.paused = nil, false
}

// Restart starts the server again on the same port, with the same directory
// and options, and waits (at most 10s) until it answers PING. A server that
// is still running is killed first (SIGKILL), so Restart alone simulates a
// crash and recovery; call Stop first for a clean shutdown. If another
// process holds the port, Restart retries for up to 10s before failing the
// test.
func (s *Server) Restart(t testing.TB) {
	t.Helper()
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.proc != nil {
		if err := s.proc.kill(); err != nil {
			t.Fatalf("redistest: restart redis-server on %s: kill: %v", s.Addr(), err)
		}
		s.proc, s.paused = nil, false
	}
	deadline := time.Now().Add(rebindTimeout)
	for {
		err := s.launch()
		if err == nil {
			return
		}
		if !errors.Is(err, errPortInUse) || time.Now().After(deadline) {
			s.logShown = true
			t.Fatalf("redistest: restart redis-server on %s: %v\n%s", s.Addr(), err, s.logTail())
		}
		time.Sleep(50 * time.Millisecond) // the port is held by someone else; poll until freed
	}
}

// Pause stops the server process with SIGSTOP: it stays alive, its port
// accepts connections, but it answers nothing until Resume. Use it to
// simulate a hung server or a long GC-like stall. Command and Do time out
// (after 10s) against a paused server. Kill, Stop, Restart and the cleanup
// all work on a paused server.
func (s *Server) Pause(t testing.TB) {
	t.Helper()
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.proc == nil {
		t.Fatalf("redistest: pause redis-server on %s: not running", s.Addr())
	}
	if err := pause(s.proc.cmd.Process); err != nil {
		t.Fatalf("redistest: pause redis-server on %s: %v", s.Addr(), err)
	}
	s.paused = true
}

// Resume continues a server stopped by Pause with SIGCONT. Resuming a server
// that is not paused does nothing.
func (s *Server) Resume(t testing.TB) {
	t.Helper()
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.proc == nil || !s.paused {
		return
	}
	if err := resume(s.proc.cmd.Process); err != nil {
		t.Fatalf("redistest: resume redis-server on %s: %v", s.Addr(), err)
	}
	s.paused = false
}

// Do sends one command to the server and returns its reply as text (see
// Command for the format). It fails the test on a connection error, a
// timeout (10s) or an error reply. Use it for setup such as CONFIG SET,
// SCRIPT FLUSH or FLUSHALL, and for reading INFO.
func (s *Server) Do(t testing.TB, args ...string) string {
	t.Helper()
	reply, err := s.Command(args...)
	if err != nil {
		t.Fatalf("redistest: %s on %s: %v", strings.Join(args, " "), s.Addr(), err)
	}
	return reply
}

// launch starts one run of redis-server and waits until it is ready. On
// failure the process is gone when launch returns; the error wraps
// errPortInUse when the port (or the cluster bus port) was taken.
// The caller holds s.mu.
func (s *Server) launch() error {
	var offset int64
	if fi, err := os.Stat(s.logPath); err == nil {
		offset = fi.Size()
	}
	logFile, err := os.OpenFile(s.logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return fmt.Errorf("open log: %w", err)
	}
	cmd := exec.Command("redis-server", s.argv...)
	cmd.Dir = s.dir
	// Without --logfile redis-server logs to stdout; config errors go to
	// stderr. Both land in the one log file, and as it is an *os.File the
	// child writes to it directly: no copying goroutine, no pipe to drain.
	cmd.Stdout, cmd.Stderr = logFile, logFile
	cmd.SysProcAttr = sysProcAttr()
	err = cmd.Start()
	logFile.Close() // the child holds its own descriptor
	if err != nil {
		return fmt.Errorf("exec redis-server: %w", err)
	}
	p := &process{cmd: cmd, done: make(chan struct{})}
	go func() {
		p.err = cmd.Wait()
		close(p.done)
	}()
	if err := s.waitReady(p, offset); err != nil {
		if killErr := p.kill(); killErr != nil {
			return fmt.Errorf("%w (and kill failed: %v)", err, killErr)
		}
		return err
	}
	s.proc, s.paused = p, false
	return nil
}

// waitReady polls the server until it answers PING, with its own PID in
// INFO (so that another process that grabbed the port does not pass for
// it), for at most readyTimeout. It returns early when the process exits.
func (s *Server) waitReady(p *process, logOffset int64) error {
	addr := s.Addr()
	pid := p.cmd.Process.Pid
	deadline := time.Now().Add(readyTimeout)
	timer := time.NewTimer(0)
	defer timer.Stop()
	var probeErr error
	for {
		select {
		case <-p.done:
			if strings.Contains(s.logSince(logOffset), "Address already in use") {
				return fmt.Errorf("redis-server could not bind %s or its cluster bus port: %w", addr, errPortInUse)
			}
			return fmt.Errorf("redis-server exited before it was ready: %v", p.err)
		case <-timer.C:
		}
		probeErr = Probe(addr, pid)
		if probeErr == nil {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("redis-server on %s not ready after %v: %v", addr, readyTimeout, probeErr)
		}
		timer.Reset(pollInterval)
	}
}

// Probe checks that addr answers PING and that INFO reports pid: that the
// server there is the redis-server process pid, not one that took the port
// between the choice of a free port and the process's start. The benchmark
// commands use it too: they flush the server they measure.
func Probe(addr string, pid int) error {
	replies, err := roundTrip(addr, time.Second, []string{"PING"}, []string{"INFO", "server"})
	if err != nil {
		return err
	}
	if replies[0] != "PONG" {
		return fmt.Errorf("PING replied %v, want PONG", replies[0])
	}
	info, ok := replies[1].(string)
	if !ok {
		return fmt.Errorf("INFO server replied %v", replies[1])
	}
	if got := infoField(info, "process_id"); got != strconv.Itoa(pid) {
		return fmt.Errorf("%s is served by process %s, not by redis-server %d", addr, got, pid)
	}
	return nil
}

// infoField returns the value of field in the text of an INFO or CLUSTER
// INFO reply, or "" if it is absent.
func infoField(info, field string) string {
	for line := range strings.Lines(info) {
		if v, ok := strings.CutPrefix(strings.TrimSpace(line), field+":"); ok {
			return v
		}
	}
	return ""
}

// cleanup kills the server at the end of the test and, if the test failed,
// logs the end of the server's log.
func (s *Server) cleanup(t testing.TB) {
	s.mu.Lock()
	p, logShown := s.proc, s.logShown
	s.proc, s.paused = nil, false
	s.mu.Unlock()
	if p != nil {
		if err := p.kill(); err != nil {
			t.Errorf("redistest: cleanup: kill redis-server on %s: %v", s.Addr(), err)
		}
	}
	if t.Failed() && s.port != 0 && !logShown {
		t.Logf("redistest: last lines of the redis-server log for %s:\n%s", s.Addr(), s.logTail())
	}
}

// failureLog returns the log tail for a failure message and notes that it
// has been shown, so that the cleanup does not repeat it.
func (s *Server) failureLog() string {
	s.mu.Lock()
	s.logShown = true
	s.mu.Unlock()
	return s.logTail()
}

// logSince returns what the log gained after offset.
func (s *Server) logSince(offset int64) string {
	data, err := os.ReadFile(s.logPath)
	if err != nil || offset > int64(len(data)) {
		return ""
	}
	return string(data[offset:])
}

// logTail returns the last lines of the server log, for failure messages.
func (s *Server) logTail() string {
	data, err := os.ReadFile(s.logPath)
	if err != nil {
		return fmt.Sprintf("(no log: %v)", err)
	}
	lines := bytes.Split(bytes.TrimRight(data, "\n"), []byte("\n"))
	if len(lines) > logTailLines {
		lines = lines[len(lines)-logTailLines:]
	}
	return "\t" + string(bytes.Join(lines, []byte("\n\t")))
}

// kill sends SIGKILL and waits for the process to exit. A process that has
// already exited is not an error.
func (p *process) kill() error {
	if err := p.cmd.Process.Kill(); err != nil && !errors.Is(err, os.ErrProcessDone) {
		return err
	}
	return p.wait(exitTimeout)
}

// wait waits for the process to exit, for at most timeout.
func (p *process) wait(timeout time.Duration) error {
	timer := time.NewTimer(timeout)
	defer timer.Stop()
	select {
	case <-p.done:
		return nil
	case <-timer.C:
		return fmt.Errorf("process %d still running after %v", p.cmd.Process.Pid, timeout)
	}
}
