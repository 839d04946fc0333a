package main

import (
	"bufio"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"
)

// bigUpstream answers every request with size bytes and counts the calls.
func bigUpstream(t *testing.T, size int) (*httptest.Server, *atomic.Int64) {
	var calls atomic.Int64
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		calls.Add(1)
		w.Header().Set("Content-Type", "application/octet-stream")
		buf := make([]byte, 64<<10)
		for left := size; left > 0; left -= len(buf) {
			if _, err := w.Write(buf[:min(left, len(buf))]); err != nil {
				return
			}
		}
	}))
	t.Cleanup(srv.Close)
	return srv, &calls
}

// slowReader sends a covered request with key on a connection of its own,
// reads the response's header, and then stops reading. It returns the
// connection, which the test closes.
func slowReader(t *testing.T, addr, key string) net.Conn {
	t.Helper()
	conn, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	if _, err := conn.Write([]byte("POST /big HTTP/1.1\r\nHost: proxy\r\nIdempotency-Key: " + key + "\r\nContent-Length: 0\r\n\r\n")); err != nil {
		t.Fatal(err)
	}
	conn.SetReadDeadline(time.Now().Add(30 * time.Second))
	br := bufio.NewReaderSize(conn, 16)
	status, err := br.ReadString('\n')
	if err != nil || !strings.Contains(status, " 200 ") {
		t.Fatalf("slow reader: got %q, %v, want a 200 status line", status, err)
	}
	return conn
}

// TestProxySlowReaderAtShutdown: a client reads a response over
// --max-response (so it streams) and stops reading; the proxy gets SIGTERM
// with --shutdown-timeout 1s. The proxy closes the slow reader's
// connection, reads the rest from the upstream, and stores the key's
// outcome (FAILED: the response was too large to replay) before it closes
// the store, so a retry after the restart gets 422 and never a second
// execution. Before, the store was closed under the request, the key
// stayed in progress, and the retry got 409 (and, after the lease, ran
// again).
func TestProxySlowReaderAtShutdown(t *testing.T) {
	t.Parallel()
	up, calls := bigUpstream(t, 64<<20)
	p := startProxy(t, up.URL, []string{"--data", t.TempDir()}, "--max-response", "1MiB", "--shutdown-timeout", "1s", "--write-timeout", "0")
	slowReader(t, p.addr, "slow")
	p.terminate()
	if code := p.wait(); code != 0 {
		t.Fatalf("exit code: got %d, want 0", code)
	}
	p = p.restart()
	res := post(t, p.url("/big"), "slow", "")
	if res.status != 422 || !strings.Contains(res.body, "key-failed") {
		t.Errorf("retry after the restart: got %d %.200q, want 422 TypeKeyFailed", res.status, res.body)
	}
	if n := calls.Load(); n != 1 {
		t.Errorf("upstream executions: got %d, want 1", n)
	}
}

// TestProxyWriteTimeout: a client that stops reading a streamed response
// loses its connection after --write-timeout, and the key's outcome is
// stored then, without a shutdown: a retry gets 422, not 409 for as long
// as the client likes.
func TestProxyWriteTimeout(t *testing.T) {
	t.Parallel()
	up, calls := bigUpstream(t, 64<<20)
	p := startProxy(t, up.URL, []string{"--data", t.TempDir()}, "--max-response", "1MiB", "--write-timeout", "1s")
	slowReader(t, p.addr, "slow")
	deadline := time.Now().Add(20 * time.Second)
	for {
		res := post(t, p.url("/big"), "slow", "")
		if res.status == 422 && strings.Contains(res.body, "key-failed") {
			break
		}
		if res.status != 409 || time.Now().After(deadline) {
			t.Fatalf("retry: got %d %.200q, want 409 while the slow reader holds the key, then 422", res.status, res.body)
		}
		time.Sleep(50 * time.Millisecond) // poll until the write timeout ended the request
	}
	if n := calls.Load(); n != 1 {
		t.Errorf("upstream executions: got %d, want 1", n)
	}
}
