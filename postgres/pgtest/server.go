package pgtest

import (
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"sort"
	"strconv"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
)

// Server is a throwaway PostgreSQL server that a test starts, restarts and
// stops itself (StartServer), for scenarios that must not touch the shared
// server other tests use.
type Server struct {
	bin  string // the directory of initdb, pg_ctl and postgres
	dir  string // owns data/ and the socket
	port int
	cred *syscall.Credential // nil unless run as root: then the postgres user
	mu   sync.Mutex          // orders starts and stops
}

// StartServer initialises a cluster in a new temporary directory and starts
// it on a free loopback port, with trust authentication; it is stopped and
// its directory removed when t ends. The binaries are found in
// IDEM_POSTGRES_BIN, or the newest /usr/lib/postgresql/*/bin. initdb
// refuses to run as root, so under root the server runs as the postgres
// user, which then owns the directory. The test is skipped when no
// binaries are found.
func StartServer(t testing.TB) *Server {
	t.Helper()
	bin := os.Getenv("IDEM_POSTGRES_BIN")
	if bin == "" {
		dirs, _ := filepath.Glob("/usr/lib/postgresql/*/bin")
		sort.Slice(dirs, func(i, j int) bool { return version(dirs[i]) < version(dirs[j]) })
		if len(dirs) > 0 {
			bin = dirs[len(dirs)-1]
		}
	}
	if _, err := os.Stat(filepath.Join(bin, "pg_ctl")); bin == "" || err != nil {
		t.Skip("pgtest: no PostgreSQL binaries (set IDEM_POSTGRES_BIN to the directory of initdb and pg_ctl)")
	}
	dir, err := os.MkdirTemp("", "idem-pgtest-")
	if err != nil {
		t.Fatal(err)
	}
	s := &Server{bin: bin, dir: dir, port: freePort(t)}
	t.Cleanup(func() { os.RemoveAll(dir) })
	if os.Geteuid() == 0 {
		u, err := user.Lookup("postgres")
		if err != nil {
			t.Fatalf("pgtest: running as root and there is no postgres user to run the server as: %v", err)
		}
		uid, _ := strconv.Atoi(u.Uid)
		gid, _ := strconv.Atoi(u.Gid)
		s.cred = &syscall.Credential{Uid: uint32(uid), Gid: uint32(gid)}
		if err := os.Chown(dir, uid, gid); err != nil {
			t.Fatal(err)
		}
	}
	s.run(t, "initdb", "-D", s.data(), "-A", "trust", "-U", "postgres", "-E", "UTF8", "--no-sync")
	s.Start(t)
	t.Cleanup(func() { s.stop(t, "fast") })
	return s
}

// version orders /usr/lib/postgresql/N/bin by N.
func version(dir string) int {
	n, _ := strconv.Atoi(filepath.Base(filepath.Dir(dir)))
	return n
}

func freePort(t testing.TB) int {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}

func (s *Server) data() string { return filepath.Join(s.dir, "data") }

// URL returns the connection URL of the server's postgres database.
func (s *Server) URL() string {
	return fmt.Sprintf("postgres://postgres@127.0.0.1:%d/postgres?sslmode=disable", s.port)
}

// run runs one of the server's binaries as the server's user.
func (s *Server) run(t testing.TB, name string, args ...string) {
	t.Helper()
	cmd := exec.Command(filepath.Join(s.bin, name), args...)
	cmd.Dir = s.dir
	if s.cred != nil {
		cmd.SysProcAttr = &syscall.SysProcAttr{Credential: s.cred}
	}
	if out, err := cmd.CombinedOutput(); err != nil {
		log, _ := os.ReadFile(filepath.Join(s.dir, "log"))
		if len(log) > 2000 {
			log = log[len(log)-2000:]
		}
		t.Fatalf("pgtest: %s %v: %v\n%s\nserver log:\n%s", name, args, err, out, log)
	}
}

// Start starts the server and waits until it accepts connections.
func (s *Server) Start(t testing.TB) {
	t.Helper()
	s.mu.Lock()
	defer s.mu.Unlock()
	s.start(t)
}

func (s *Server) start(t testing.TB) {
	t.Helper()
	opts := fmt.Sprintf("-p %d -k %s -c listen_addresses=127.0.0.1 -c fsync=off -c max_connections=100", s.port, s.dir)
	s.run(t, "pg_ctl", "-D", s.data(), "-l", filepath.Join(s.dir, "log"), "-o", opts, "-w", "-t", "60", "start")
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	for {
		c, err := pgx.Connect(ctx, s.URL())
		if err == nil {
			c.Close(ctx)
			return
		}
		if ctx.Err() != nil {
			t.Fatalf("pgtest: the server does not answer after its start: %v", err)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// Restart stops the server in mode (pg_ctl's "immediate": as a crash, the
// start recovers from the WAL; "fast": open transactions rolled back and a
// checkpoint), waits pause, and starts it again.
func (s *Server) Restart(t testing.TB, mode string, pause time.Duration) {
	t.Helper()
	s.mu.Lock()
	defer s.mu.Unlock()
	s.stopLocked(t, mode)
	time.Sleep(pause)
	s.start(t)
}

func (s *Server) stop(t testing.TB, mode string) {
	t.Helper()
	s.mu.Lock()
	defer s.mu.Unlock()
	s.stopLocked(t, mode)
}

func (s *Server) stopLocked(t testing.TB, mode string) {
	t.Helper()
	cmd := exec.Command(filepath.Join(s.bin, "pg_ctl"), "-D", s.data(), "-m", mode, "-w", "stop")
	if s.cred != nil {
		cmd.SysProcAttr = &syscall.SysProcAttr{Credential: s.cred}
	}
	if out, err := cmd.CombinedOutput(); err != nil {
		if _, statErr := os.Stat(filepath.Join(s.data(), "postmaster.pid")); statErr == nil {
			t.Errorf("pgtest: pg_ctl stop: %v\n%s", err, out)
		}
	}
}
