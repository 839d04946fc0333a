package chaostest

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"sync/atomic"
	"testing"

	toxiproxy "github.com/Shopify/toxiproxy/v2"
	"github.com/rs/zerolog"
)

// NetProxy is a Shopify toxiproxy TCP proxy run as a library inside the test
// process, on a free loopback port, in front of one upstream (a
// redis-server). Toxics added to it (latency, timeout, reset_peer,
// limit_data, bandwidth, …) act on the connections that pass through it.
// Its methods are safe for concurrent use.
type NetProxy struct {
	p   *toxiproxy.Proxy
	seq atomic.Int64
}

var proxySeq atomic.Int64

// StartNetProxy starts a proxy to upstream ("host:port") and stops it, with
// every connection through it, when the test ends.
func StartNetProxy(t testing.TB, upstream string) *NetProxy {
	t.Helper()
	srv := toxiproxy.NewServer(toxiproxy.NewMetricsContainer(nil), zerolog.Nop())
	name := fmt.Sprintf("chaos-%d", proxySeq.Add(1))
	p := toxiproxy.NewProxy(srv, name, "127.0.0.1:0", upstream)
	if err := p.Start(); err != nil {
		t.Fatalf("chaostest: start toxiproxy to %s: %v", upstream, err)
	}
	t.Cleanup(p.Stop)
	return &NetProxy{p: p}
}

// Addr returns the address the clients connect to. It does not change across
// Disable and Enable.
func (n *NetProxy) Addr() string {
	n.p.Lock()
	defer n.p.Unlock()
	return n.p.Listen
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

// Disable closes the listener and every connection through the proxy: new
// connections are refused until Enable.
func (n *NetProxy) Disable() { n.p.Stop() }

// Enable listens again on the same address after Disable.
func (n *NetProxy) Enable(t testing.TB) {
	t.Helper()
	if err := n.p.Start(); err != nil && err != toxiproxy.ErrProxyAlreadyStarted {
		t.Fatalf("chaostest: restart toxiproxy on %s: %v", n.Addr(), err)
	}
}
