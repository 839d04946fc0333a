package main

import (
	"io"
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"
	"time"

	"github.com/idemgo/idem/testkit/redistest"
)

// TestReadyzDraining: once the proxy is told to stop, /readyz answers 503
// for as long as it finishes the requests in flight, so that a load
// balancer sends it nothing new; /healthz still answers 200, so that a
// liveness probe does not kill it before they are stored. The request in
// flight gets its answer, and the proxy exits 0.
func TestReadyzDraining(t *testing.T) {
	t.Parallel()
	arrived, release := make(chan struct{}), make(chan struct{})
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		close(arrived)
		<-release
		w.WriteHeader(http.StatusCreated)
		io.WriteString(w, "done")
	}))
	t.Cleanup(up.Close)
	var releaseOnce sync.Once
	letGo := func() { releaseOnce.Do(func() { close(release) }) }
	t.Cleanup(letGo) // before up.Close, which waits for the handler
	p := startProxy(t, up.URL, []string{"--data", t.TempDir()}, "--shutdown-timeout", "30s")
	waitReady(t, p, http.StatusOK, "ready")

	answered := make(chan response, 1)
	go func() { answered <- post(t, p.url("/payments"), "drain-1", "x") }()
	select {
	case <-arrived:
	case <-time.After(readyTimeout):
		t.Fatal("the request did not reach the upstream")
	}

	p.terminate()
	waitReady(t, p, http.StatusServiceUnavailable, "not ready: shutting down")
	res, err := http.Get("http://" + p.admin + "/healthz")
	if err != nil {
		t.Fatalf("/healthz while draining: %v", err)
	}
	res.Body.Close()
	if res.StatusCode != http.StatusOK {
		t.Errorf("/healthz while draining: got %d, want 200", res.StatusCode)
	}

	letGo()
	if r := <-answered; r.status != http.StatusCreated || r.body != "done" {
		t.Errorf("the request in flight: got %d %q, want 201 done", r.status, r.body)
	}
	if code := p.wait(); code != 0 {
		t.Errorf("exit code: got %d, want 0", code)
	}
}

// TestReadyzStore: /readyz answers 503 while the store does not answer,
// and 200 again once it does; /healthz answers 200 throughout (the
// process is fine: restarting it would not bring Redis back).
func TestReadyzStore(t *testing.T) {
	t.Parallel()
	up := newUpstream(t)
	srv := redistest.Start(t)
	p := startProxy(t, up.url(), []string{"--redis", "redis://" + srv.Addr()})
	waitReady(t, p, http.StatusOK, "ready")

	srv.Stop(t)
	waitReady(t, p, http.StatusServiceUnavailable, "not ready: store")
	res, err := http.Get("http://" + p.admin + "/healthz")
	if err != nil {
		t.Fatal(err)
	}
	res.Body.Close()
	if res.StatusCode != http.StatusOK {
		t.Errorf("/healthz with the store down: got %d, want 200", res.StatusCode)
	}

	srv.Restart(t)
	waitReady(t, p, http.StatusOK, "ready")
}
