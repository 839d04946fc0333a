package main

import (
	"net"
	"strconv"
	"strings"
	"testing"

	"github.com/idemgo/idem/testkit/redistest"
)

// TestLaunchRefusesAnotherServer: when another redis-server holds the
// port before the command's own one starts (here: a server already there,
// and ours started a moment late), launch must not take the other server
// for its own — the command flushes the server it measures.
func TestLaunchRefusesAnotherServer(t *testing.T) {
	other := redistest.Start(t)
	other.Do(t, "SET", "theirs", "1")
	_, p, _ := net.SplitHostPort(other.Addr())
	port, err := strconv.Atoi(p)
	if err != nil {
		t.Fatal(err)
	}
	s := &server{
		port: port,
		dir:  t.TempDir(),
		// Start redis-server a moment late, as a busy machine or valgrind
		// does: the other server answers PING meanwhile.
		wrap: []string{"sh", "-c", `sleep 0.3; exec "$@"`, "sh"},
		done: make(chan struct{}),
	}
	err = s.launch(t.Context())
	if err == nil {
		s.stop()
		t.Fatalf("launch on port %d returned no error: it took the server already there for its own", port)
	}
	if !strings.Contains(err.Error(), "Address already in use") {
		t.Fatalf("launch: got %v, want the start to fail on the port in use", err)
	}
	if got := other.Do(t, "GET", "theirs"); got != "1" {
		t.Fatalf("the other server's key: got %v", got)
	}
}
