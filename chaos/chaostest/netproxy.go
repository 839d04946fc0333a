package chaostest

import (
	"context"
	"encoding/json"
	"fmt"
	"net"
	"strings"
	"sync"
	"sync/atomic"
	"testing"

	toxiproxy "github.com/Shopify/toxiproxy/v2"
	"github.com/Shopify/toxiproxy/v2/stream"
	"github.com/rs/zerolog"
)

// NetProxy is a TCP proxy inside the test process, on a free loopback port,
// in front of one upstream, whose connections pass through Shopify
// toxiproxy's toxics (latency, timeout, reset_peer, limit_data, bandwidth,
// …) run as a library. Its methods are safe for concurrent use.
//
// The proxy holds its listener from start to the end of the test: a cut
// (Disable) closes the connections and resets new ones as soon as they are
// accepted, and Enable lets them through again on the same address. A
// proxy that closed its listener for a cut (toxiproxy's own Stop and
// Start) could not always listen again: another process may take the port
// in between ("bind: address already in use").
type NetProxy struct {
	p   *toxiproxy.Proxy
	srv *toxiproxy.ApiServer
	ln  net.Listener
	seq atomic.Int64

	mu       sync.Mutex
	upstream string
	disabled bool
	closed   bool
	conns    map[*net.TCPConn]struct{} // open ones, and closed ones not yet pruned
	pruneAt  int
}

var proxySeq atomic.Int64

// StartNetProxy starts a proxy to upstream ("host:port") and stops it, with
// every connection through it, when the test ends.
func StartNetProxy(t testing.TB, upstream string) *NetProxy {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatalf("chaostest: start proxy to %s: %v", upstream, err)
	}
	srv := toxiproxy.NewServer(toxiproxy.NewMetricsContainer(nil), zerolog.Nop())
	// The toxiproxy.Proxy is never started: it holds the toxics and names
	// the links; the accept loop is NetProxy's.
	p := toxiproxy.NewProxy(srv, fmt.Sprintf("chaos-%d", proxySeq.Add(1)), ln.Addr().String(), upstream)
	n := &NetProxy{p: p, srv: srv, ln: ln, upstream: upstream, conns: map[*net.TCPConn]struct{}{}, pruneAt: 64}
	go n.accept()
	t.Cleanup(n.close)
	return n
}

// Addr returns the address the clients connect to. It does not change across
// Disable and Enable.
func (n *NetProxy) Addr() string { return n.ln.Addr().String() }

// SetUpstream points the connections accepted from now on at upstream; open
// ones keep theirs.
func (n *NetProxy) SetUpstream(upstream string) {
	n.mu.Lock()
	defer n.mu.Unlock()
	n.upstream = upstream
}

// AddToxic adds a toxic of type typ on stream ("upstream": client to server,
// "downstream": server to client) with the given attributes (as in
// toxiproxy's HTTP API, e.g. {"latency": 50, "jitter": 10}) and returns its
// name, for RemoveToxic. It applies to open connections and to new ones.
func (n *NetProxy) AddToxic(t testing.TB, typ, stream string, attrs map[string]any) string {
	t.Helper()
	name := fmt.Sprintf("%s_%s_%d", typ, stream, n.seq.Add(1))
	body, err := json.Marshal(map[string]any{
		"name": name, "type": typ, "stream": stream, "toxicity": 1.0, "attributes": attrs,
	})
	if err != nil {
		t.Fatalf("chaostest: toxic: %v", err)
	}
	if _, err := n.p.Toxics.AddToxicJson(strings.NewReader(string(body))); err != nil {
		t.Fatalf("chaostest: add toxic %s: %v", body, err)
	}
	return name
}

// RemoveToxic removes the toxic named name.
func (n *NetProxy) RemoveToxic(t testing.TB, name string) {
	t.Helper()
	if err := n.p.Toxics.RemoveToxic(context.Background(), name); err != nil {
		t.Fatalf("chaostest: remove toxic %s: %v", name, err)
	}
}

// ResetToxics removes every toxic.
func (n *NetProxy) ResetToxics() { n.p.Toxics.ResetToxics(context.Background()) }

// Disable cuts the proxy: it closes every connection through it, and until
// Enable it resets each new connection as soon as it is accepted (the
// client's connect succeeds; its first read or write fails).
func (n *NetProxy) Disable() {
	n.mu.Lock()
	defer n.mu.Unlock()
	n.disabled = true
	n.closeConns()
}

// Enable ends a cut (Disable): new connections pass again, on the same
// address. The testing.TB is kept for the callers written when Enable
// could fail.
func (n *NetProxy) Enable(testing.TB) {
	n.mu.Lock()
	defer n.mu.Unlock()
	n.disabled = false
}

func (n *NetProxy) close() {
	n.ln.Close()
	n.mu.Lock()
	defer n.mu.Unlock()
	n.closed = true
	n.closeConns()
}

// closeConns closes every connection; n.mu is held.
func (n *NetProxy) closeConns() {
	for c := range n.conns {
		c.Close()
	}
	clear(n.conns)
}

func (n *NetProxy) accept() {
	for {
		c, err := n.ln.Accept()
		if err != nil {
			return // closed when the test ended
		}
		client := c.(*net.TCPConn)
		n.mu.Lock()
		disabled, upstream := n.disabled || n.closed, n.upstream
		n.mu.Unlock()
		if disabled {
			reset(client)
			continue
		}
		// Dialled in the accept loop, as toxiproxy does: connections pass
		// one at a time.
		uc, err := net.Dial("tcp", upstream)
		if err != nil {
			client.Close()
			continue
		}
		server := uc.(*net.TCPConn)
		n.mu.Lock()
		if n.disabled || n.closed { // cut while dialling
			n.mu.Unlock()
			reset(client)
			server.Close()
			continue
		}
		n.track(client, server)
		n.mu.Unlock()
		name := client.RemoteAddr().String()
		n.p.Toxics.StartLink(n.srv, name+"upstream", client, server, stream.Upstream)
		n.p.Toxics.StartLink(n.srv, name+"downstream", server, client, stream.Downstream)
	}
}

// track records the two sides of a new connection; n.mu is held. The
// toxics' links close them, unseen by the proxy: the closed ones are
// pruned whenever the set has doubled since the last pruning.
func (n *NetProxy) track(conns ...*net.TCPConn) {
	for _, c := range conns {
		n.conns[c] = struct{}{}
	}
	if len(n.conns) < n.pruneAt {
		return
	}
	for c := range n.conns {
		if isClosed(c) {
			delete(n.conns, c)
		}
	}
	n.pruneAt = max(64, 2*len(n.conns))
}

// isClosed reports whether c was closed (by this process).
func isClosed(c *net.TCPConn) bool {
	rc, err := c.SyscallConn()
	if err != nil {
		return true
	}
	return rc.Control(func(uintptr) {}) != nil
}
