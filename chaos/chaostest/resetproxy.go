package chaostest

import (
	"io"
	"math/rand/v2"
	"net"
	"sync"
	"sync/atomic"
	"testing"
)

// ResetProxy is a TCP proxy, on a free loopback port, that resets
// connections as a network fault does after the server has answered:
// each chunk the server sends of at least MinBytes is, with probability P,
// dropped, and the connection is reset on both sides (RST: SO_LINGER 0).
// Smaller chunks (an HTTP/2 SETTINGS, PING or WINDOW_UPDATE) pass, so
// that the faults fall on responses. Toxiproxy (NetProxy) decides a
// toxic once per connection; this one decides per response, which a
// multiplexed protocol (HTTP/2, gRPC) needs to see a fault on many calls
// of one connection. Its methods are safe for concurrent use.
type ResetProxy struct {
	ln       net.Listener
	upstream string
	p        float64
	minBytes int
	resets   atomic.Int64
	mu       sync.Mutex
	conns    map[net.Conn]bool
}

// StartResetProxy starts a ResetProxy to upstream ("host:port") with
// probability p and threshold minBytes; it stops, with its connections,
// when the test ends.
func StartResetProxy(t testing.TB, upstream string, p float64, minBytes int) *ResetProxy {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatalf("chaostest: reset proxy: %v", err)
	}
	r := &ResetProxy{ln: ln, upstream: upstream, p: p, minBytes: minBytes, conns: map[net.Conn]bool{}}
	go r.accept()
	t.Cleanup(func() {
		ln.Close()
		r.mu.Lock()
		for c := range r.conns {
			c.Close()
		}
		r.mu.Unlock()
	})
	return r
}

// Addr returns the address the clients connect to.
func (r *ResetProxy) Addr() string { return r.ln.Addr().String() }

// Resets returns the number of connections reset so far.
func (r *ResetProxy) Resets() int64 { return r.resets.Load() }

func (r *ResetProxy) track(c net.Conn, on bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if on {
		r.conns[c] = true
	} else {
		delete(r.conns, c)
	}
}

func (r *ResetProxy) accept() {
	for {
		c, err := r.ln.Accept()
		if err != nil {
			return
		}
		go r.serve(c)
	}
}

func reset(c net.Conn) {
	if tc, ok := c.(*net.TCPConn); ok {
		tc.SetLinger(0)
	}
	c.Close()
}

func (r *ResetProxy) serve(client net.Conn) {
	server, err := net.Dial("tcp", r.upstream)
	if err != nil {
		reset(client)
		return
	}
	r.track(client, true)
	r.track(server, true)
	defer func() {
		r.track(client, false)
		r.track(server, false)
	}()
	go func() {
		io.Copy(server, client)
		server.Close()
	}()
	buf := make([]byte, 64<<10)
	for {
		n, err := server.Read(buf)
		if n >= r.minBytes && rand.Float64() < r.p {
			r.resets.Add(1)
			reset(client)
			reset(server)
			return
		}
		if n > 0 {
			if _, werr := client.Write(buf[:n]); werr != nil {
				server.Close()
				return
			}
		}
		if err != nil {
			client.Close()
			return
		}
	}
}
