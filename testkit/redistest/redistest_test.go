package redistest_test

import (
	"errors"
	"fmt"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/idemgo/idem/testkit/redistest"
)

func TestAvailable(t *testing.T) {
	t.Parallel()
	if err := redistest.Available(); err != nil {
		t.Fatalf("Available() = %v, want nil (CI must have redis-server installed)", err)
	}
}

func TestStartPing(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t)
	if got := srv.Do(t, "PING"); got != "PONG" {
		t.Fatalf("PING = %q, want PONG", got)
	}
	if got := srv.Do(t, "CONFIG", "GET", "appendonly"); got != "appendonly\nno" {
		t.Errorf("CONFIG GET appendonly = %q, want appendonly\\nno (default)", got)
	}
	if got := srv.Do(t, "CONFIG", "GET", "dir"); got != "dir\n"+srv.Dir() {
		t.Errorf("CONFIG GET dir = %q, want dir\\n%s", got, srv.Dir())
	}
}

func TestStartArgsOverrideDefaults(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t, "--save", "3600 1", "--maxmemory-policy", "allkeys-lru")
	if got := srv.Do(t, "CONFIG", "GET", "save"); got != "save\n3600 1" {
		t.Errorf("CONFIG GET save = %q, want save\\n3600 1", got)
	}
	if got := srv.Do(t, "CONFIG", "GET", "maxmemory-policy"); got != "maxmemory-policy\nallkeys-lru" {
		t.Errorf("CONFIG GET maxmemory-policy = %q, want maxmemory-policy\\nallkeys-lru", got)
	}
}

func TestCommandReplies(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t)
	tests := []struct {
		args []string
		want string
	}{
		{[]string{"SET", "k", "v"}, "OK"},
		{[]string{"GET", "k"}, "v"},
		{[]string{"GET", "missing"}, ""},
		{[]string{"INCRBY", "n", "41"}, "41"},
		{[]string{"RPUSH", "l", "a", "b"}, "2"},
		{[]string{"LRANGE", "l", "0", "-1"}, "a\nb"},
	}
	for _, tt := range tests {
		got, err := srv.Command(tt.args...)
		if err != nil || got != tt.want {
			t.Errorf("Command(%q) = %q, %v; want %q, nil", tt.args, got, err, tt.want)
		}
	}
	_, err := srv.Command("NOSUCHCOMMAND")
	var re redistest.ReplyError
	if !errors.As(err, &re) || !strings.HasPrefix(string(re), "ERR") {
		t.Errorf("Command(NOSUCHCOMMAND) error = %v, want a ReplyError starting with ERR", err)
	}
}

func TestKillRefusesConnections(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t)
	srv.Kill(t)
	conn, err := net.DialTimeout("tcp", srv.Addr(), time.Second)
	if err == nil {
		conn.Close()
		t.Fatalf("dial %s after Kill succeeded, want connection refused", srv.Addr())
	}
	srv.Kill(t) // killing a dead server does nothing
}

func TestRestartKeepsAOFData(t *testing.T) {
	t.Parallel()
	// appendfsync always makes the test independent of the fsync timer;
	// after SIGKILL the written AOF is in the page cache either way.
	srv := redistest.Start(t, "--appendonly", "yes", "--appendfsync", "always")
	addr := srv.Addr()
	srv.Do(t, "SET", "k", "v")
	srv.Kill(t)
	srv.Restart(t)
	if srv.Addr() != addr {
		t.Errorf("Addr after Restart = %s, want %s", srv.Addr(), addr)
	}
	if got := srv.Do(t, "GET", "k"); got != "v" {
		t.Fatalf("GET k after Kill+Restart = %q, want %q", got, "v")
	}
}

func TestRestartWithoutPersistenceLosesData(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t)
	srv.Do(t, "SET", "k", "v")
	srv.Restart(t) // kills the running server first
	if got := srv.Do(t, "GET", "k"); got != "" {
		t.Fatalf("GET k after Restart without persistence = %q, want empty", got)
	}
}

func TestStopThenRestart(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t, "--appendonly", "yes")
	srv.Do(t, "SET", "k", "v")
	srv.Stop(t)
	if _, err := srv.Command("PING"); err == nil {
		t.Fatal("PING after Stop succeeded, want an error")
	}
	srv.Restart(t)
	if got := srv.Do(t, "GET", "k"); got != "v" {
		t.Fatalf("GET k after Stop+Restart = %q, want %q", got, "v")
	}
}

func TestPauseResume(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t)
	srv.Pause(t)

	conn, err := net.DialTimeout("tcp", srv.Addr(), time.Second)
	if err != nil {
		t.Fatalf("dial paused server: %v", err)
	}
	defer conn.Close()
	if _, err := conn.Write([]byte("*1\r\n$4\r\nPING\r\n")); err != nil {
		t.Fatalf("write PING: %v", err)
	}
	if err := conn.SetReadDeadline(time.Now().Add(200 * time.Millisecond)); err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, 16)
	if n, err := conn.Read(buf); err == nil {
		t.Fatalf("paused server replied %q, want no reply", buf[:n])
	}

	srv.Resume(t)
	if err := conn.SetReadDeadline(time.Now().Add(5 * time.Second)); err != nil {
		t.Fatal(err)
	}
	n, err := conn.Read(buf)
	if err != nil || string(buf[:n]) != "+PONG\r\n" {
		t.Fatalf("after Resume read %q, %v; want +PONG", buf[:n], err)
	}
}

func TestStopPausedServer(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t)
	srv.Pause(t)
	srv.Stop(t)
	if _, err := srv.Command("PING"); err == nil {
		t.Fatal("PING after Stop succeeded, want an error")
	}
}

func TestCluster(t *testing.T) {
	t.Parallel()
	start := time.Now()
	c := redistest.StartCluster(t, 3)
	t.Logf("StartCluster(3) took %v", time.Since(start))

	addrs := c.Addrs()
	if len(addrs) != 3 {
		t.Fatalf("len(Addrs()) = %d, want 3", len(addrs))
	}
	for _, n := range c.Nodes() {
		info := n.Do(t, "CLUSTER", "INFO")
		for _, want := range []string{"cluster_state:ok", "cluster_slots_assigned:16384", "cluster_slots_ok:16384", "cluster_known_nodes:3", "cluster_size:3"} {
			if !strings.Contains(info, want) {
				t.Errorf("%s CLUSTER INFO lacks %q:\n%s", n.Addr(), want, info)
			}
		}
	}
	// A key lives on exactly one node; the others redirect.
	var owners int
	for _, n := range c.Nodes() {
		_, err := n.Command("SET", "{user1}k", "v")
		var re redistest.ReplyError
		switch {
		case err == nil:
			owners++
		case errors.As(err, &re) && strings.HasPrefix(string(re), "MOVED"):
		default:
			t.Errorf("SET on %s: %v, want OK or MOVED", n.Addr(), err)
		}
	}
	if owners != 1 {
		t.Errorf("%d nodes accepted SET {user1}k, want 1", owners)
	}

	// A restarted node keeps its identity (nodes.conf) and rejoins.
	node := c.Nodes()[1]
	node.Kill(t)
	node.Restart(t)
	start = time.Now()
	c.WaitOK(t)
	t.Logf("WaitOK after a node restart took %v", time.Since(start))
}

func TestClusterReplicasFailover(t *testing.T) {
	t.Parallel()
	c := redistest.StartClusterReplicas(t, 3, 1, "--cluster-node-timeout", "1000")
	if n := len(c.Nodes()); n != 6 {
		t.Fatalf("len(Nodes()) = %d, want 6", n)
	}
	masters := c.Masters()
	if len(masters) != 3 {
		t.Fatalf("len(Masters()) = %d, want 3", len(masters))
	}
	old := masters[0]
	old.Kill(t)
	promoted := c.WaitFailover(t, old)
	if promoted == old {
		t.Fatal("WaitFailover returned the killed node")
	}
	if info := promoted.Do(t, "INFO", "replication"); !strings.Contains(info, "role:master") {
		t.Errorf("%s after WaitFailover:\n%s\nwant role:master", promoted.Addr(), info)
	}
}

func TestReservedArgsAreRefused(t *testing.T) {
	t.Parallel()
	for _, args := range [][]string{
		{"--port", "6379"},
		{"--appendonly", "yes", "--dir", "/tmp"},
		{"--bind 0.0.0.0"},
		{"redis.conf"},
	} {
		ft := &fatalRecorder{TB: t}
		func() {
			defer func() { _ = recover() }()
			redistest.Start(ft, args...)
		}()
		if !ft.fatal {
			t.Errorf("Start(%q) did not fail the test", args)
		}
	}
}

// TestMissingRedisFailsWithInstallHint is not parallel: it empties PATH,
// which t.Setenv allows only while no parallel test runs.
func TestMissingRedisFailsWithInstallHint(t *testing.T) {
	t.Setenv("PATH", t.TempDir())
	const hint = "apt-get install -y redis-server"
	if err := redistest.Available(); err == nil || !strings.Contains(err.Error(), hint) {
		t.Errorf("Available() with an empty PATH = %v, want an error naming %q", err, hint)
	}
	ft := &fatalRecorder{TB: t}
	func() {
		defer func() { _ = recover() }()
		redistest.Start(ft)
	}()
	if !ft.fatal || !strings.Contains(ft.msg, hint) {
		t.Errorf("Start with an empty PATH: fatal %v with %q, want a fatal naming %q", ft.fatal, ft.msg, hint)
	}
}

func TestRestartWaitsForBusyPort(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t)
	srv.Kill(t)
	// Someone else holds the port for a while; Restart must retry, not fail.
	l, err := net.Listen("tcp", srv.Addr())
	if err != nil {
		t.Fatalf("listen on the killed server's port: %v", err)
	}
	released := make(chan struct{})
	time.AfterFunc(300*time.Millisecond, func() {
		l.Close()
		close(released)
	})
	srv.Restart(t)
	<-released
	if got := srv.Do(t, "PING"); got != "PONG" {
		t.Fatalf("PING after Restart = %q, want PONG", got)
	}
}

// fatalRecorder records a Fatal instead of failing the real test, and stops
// the calling function as Fatal does, by a panic that the test recovers.
type fatalRecorder struct {
	testing.TB
	fatal bool
	msg   string
}

func (f *fatalRecorder) Helper() {}

func (f *fatalRecorder) Fatal(args ...any) {
	f.fatal, f.msg = true, fmt.Sprint(args...)
	panic("fatal")
}

func (f *fatalRecorder) Fatalf(format string, args ...any) {
	f.fatal, f.msg = true, fmt.Sprintf(format, args...)
	panic("fatal")
}

// TestSentinel checks that StartSentinel's Sentinels fail over to a replica
// when the primary is killed.
func TestSentinel(t *testing.T) {
	t.Parallel()
	s := redistest.StartSentinel(t, 2)
	old := s.Primary()
	if old != s.Data()[0] {
		t.Fatalf("primary: got %v, want the first data server %s", old, s.Data()[0].Addr())
	}
	old.Kill(t)
	next := s.WaitFailover(t, old)
	if next == old {
		t.Fatalf("failover: the primary is still %s", old.Addr())
	}
	if got := s.Primary(); got != next {
		t.Errorf("Primary after the failover: got %v, want %s", got, next.Addr())
	}
}
