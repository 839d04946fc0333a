package main

import (
	"context"
	"net"
	"net/http"
	"net/url"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idemgo/idem"
	"github.com/idemgo/idem/idemproxy"
	"github.com/idemgo/idem/memstore"
)

// TestProxyH2C: the h2c row speaks HTTP/2 end to end: the Go load
// generator reaches the proxy over HTTP/2, the proxy (UpstreamH2C, what
// --upstream-h2c sets) reaches the h2c-only upstream over HTTP/2, every new
// key runs the upstream once and the replays none. Controls: the h1 row's
// client reaches the same proxy over HTTP/1.1, the upstream refuses
// HTTP/1.1, and the h2c client refuses a server that speaks only HTTP/1.1
// instead of falling back.
func TestProxyH2C(t *testing.T) {
	var closers []func()
	defer func() {
		for _, c := range closers {
			c()
		}
	}()
	var upRuns, upNotH2 atomic.Int32
	upstream := serveH2C(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		upRuns.Add(1)
		if r.ProtoMajor != 2 {
			upNotH2.Add(1)
		}
		handler.ServeHTTP(w, r)
	}), &closers)
	if resp, err := http.Post(upstream+"/pay", "application/json", nil); err == nil {
		resp.Body.Close()
		t.Fatalf("the h2c upstream answered an HTTP/1.1 request: %s", resp.Status)
	}

	store, err := memstore.New()
	if err != nil {
		t.Fatal(err)
	}
	exec, err := idem.New(store)
	if err != nil {
		t.Fatal(err)
	}
	target, _ := url.Parse(upstream)
	p := &idemproxy.Proxy{Target: target, Executor: exec, UpstreamH2C: true}
	var inbound [3]atomic.Int32 // requests the proxy received, by ProtoMajor
	// Served as cmd/idem serves the proxy with --h2c (cmd/idem/proxy.go).
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		inbound[min(r.ProtoMajor, 2)].Add(1)
		p.ServeHTTP(w, r)
	}), Protocols: new(http.Protocols)}
	srv.Protocols.SetHTTP1(true)
	srv.Protocols.SetUnencryptedHTTP2(true)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go srv.Serve(ln)
	defer srv.Close()
	proxyURL := "http://" + ln.Addr().String()
	ctx := context.Background()

	r, err := generateLoad(ctx, proxyURL, "h2c", "new", "t", 4, 200*time.Millisecond)
	if err != nil {
		t.Fatal(err)
	}
	if r.requests == 0 || inbound[2].Load() != int32(r.requests) || inbound[1].Load() != 0 {
		t.Fatalf("h2c new keys: %d requests; the proxy received %d over HTTP/2, %d over HTTP/1.1", r.requests, inbound[2].Load(), inbound[1].Load())
	}
	if upRuns.Load() != int32(r.requests) || upNotH2.Load() != 0 {
		t.Fatalf("h2c new keys: %d requests; the upstream ran %d times, %d of them not over HTTP/2", r.requests, upRuns.Load(), upNotH2.Load())
	}

	primeReplay(proxyURL)
	before := upRuns.Load()
	r, err = generateLoad(ctx, proxyURL, "h2c", "replay", "", 4, 100*time.Millisecond)
	if err != nil {
		t.Fatal(err)
	}
	if r.requests == 0 || upRuns.Load() != before {
		t.Fatalf("h2c replays: %d requests ran the upstream %d times, want 0", r.requests, upRuns.Load()-before)
	}

	// The h1 row's client, to the same proxy.
	// (primeReplay sent one request over HTTP/1.1 before.)
	h1Before, h2Before := inbound[1].Load(), inbound[2].Load()
	r, err = generateLoad(ctx, proxyURL, "h1", "new", "h1", 2, 100*time.Millisecond)
	if err != nil {
		t.Fatal(err)
	}
	if r.requests == 0 || inbound[1].Load()-h1Before != int32(r.requests) || inbound[2].Load() != h2Before {
		t.Fatalf("h1 new keys: %d requests; the proxy received %d over HTTP/1.1, %d more over HTTP/2", r.requests, inbound[1].Load()-h1Before, inbound[2].Load()-h2Before)
	}

	// The h2c client does not fall back to HTTP/1.1.
	h1Only := &http.Server{Handler: handler, Protocols: new(http.Protocols)}
	h1Only.Protocols.SetHTTP1(true)
	ln1, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go h1Only.Serve(ln1)
	defer h1Only.Close()
	if _, err := generateLoad(ctx, "http://"+ln1.Addr().String(), "h2c", "new", "x", 1, 50*time.Millisecond); err == nil {
		t.Fatal("the h2c client measured a server that speaks only HTTP/1.1")
	}
}
