package main

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idemgo/idem/internal/storescripts"
	"github.com/idemgo/idem/testkit/redistest"
)

// TestFloor: with each client, the floor runs the handler once per key,
// stores the response before sending it, and answers the key's next
// request with the stored body: its rows measure the two round trips they
// claim to, not a shortcut.
func TestFloor(t *testing.T) {
	srv := redistest.Start(t)
	gr := srv.GoRedis(t)
	ru := srv.Rueidis(t)
	for _, c := range []struct {
		name  string
		store floorStore
	}{{"go-redis", floorGoRedis{gr}}, {"rueidis", floorRueidis{ru}}} {
		t.Run(c.name, func(t *testing.T) {
			var runs atomic.Int32
			h := floorMiddleware(c.store, "floor-"+c.name+":", http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				// The response is stored before it is sent.
				if got, err := gr.Get(r.Context(), "floor-"+c.name+":k").Result(); err != nil || got != floorClaim {
					t.Errorf("during the handler the key holds %q, %v; want the claim", got, err)
				}
				runs.Add(1)
				w.WriteHeader(http.StatusCreated)
				io.WriteString(w, `{"n":1}`)
			}))
			for i := range 3 {
				rec := httptest.NewRecorder()
				req := httptest.NewRequest("POST", "/", strings.NewReader("{}"))
				req.Header.Set("Idempotency-Key", "k")
				h.ServeHTTP(rec, req)
				if rec.Body.String() != `{"n":1}` {
					t.Fatalf("request %d: body %q", i, rec.Body.String())
				}
				if i == 0 && rec.Code != http.StatusCreated {
					t.Fatalf("first request: status %d, want 201", rec.Code)
				}
			}
			if n := runs.Load(); n != 1 {
				t.Fatalf("the handler ran %d times for one key, want 1", n)
			}
			if got, _ := gr.Get(t.Context(), "floor-"+c.name+":k").Result(); got != `{"n":1}` {
				t.Fatalf("stored %q, want the body", got)
			}
		})
	}
}

// TestFloorFile: the file floor answers as the Redis floors do, and a
// write has reached the log file when it returns, also when many callers
// write at once and their writes are synced in groups.
func TestFloorFile(t *testing.T) {
	dir := t.TempDir()
	s, err := openFloorFile(dir)
	if err != nil {
		t.Fatal(err)
	}
	defer s.f.Close()
	logged := func(key, val string) bool {
		f, err := os.Open(filepath.Join(dir, "floor.log"))
		if err != nil {
			t.Fatal(err)
		}
		defer f.Close()
		b := make([]byte, 1<<20) // the log's beginning: the test writes less
		if _, err := io.ReadFull(f, b); err != nil {
			t.Fatal(err)
		}
		return bytes.Contains(b, appendFloorRecord(nil, key, val))
	}
	ctx := t.Context()
	var wg sync.WaitGroup
	for i := range 64 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			key := fmt.Sprint("k", i)
			if _, found, err := s.claim(ctx, key); err != nil || found {
				t.Errorf("first claim of %s: found %v, %v", key, found, err)
				return
			}
			if !logged(key, floorClaim) {
				t.Errorf("the claim of %s is not in the log when claim returns", key)
			}
			if old, found, err := s.claim(ctx, key); err != nil || !found || old != floorClaim {
				t.Errorf("second claim of %s: %q %v %v, want the claim", key, old, found, err)
			}
			body := fmt.Sprint(`{"n":`, i, `}`)
			if err := s.store(ctx, key, []byte(body)); err != nil {
				t.Error(err)
				return
			}
			if !logged(key, body) {
				t.Errorf("the body of %s is not in the log when store returns", key)
			}
			if old, found, err := s.claim(ctx, key); err != nil || !found || old != body {
				t.Errorf("claim of %s after store: %q %v %v, want the body", key, old, found, err)
			}
		}()
	}
	wg.Wait()
}

// TestProxyFloor: the plain proxy behind a floor forwards a key's first
// request once and answers its next ones with the stored body.
func TestProxyFloor(t *testing.T) {
	var runs atomic.Int32
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		runs.Add(1)
		w.WriteHeader(http.StatusCreated)
		io.WriteString(w, `{"n":1}`)
	}))
	defer up.Close()
	upURL, _ := url.Parse(up.URL)
	rp := &httputil.ReverseProxy{Rewrite: func(r *httputil.ProxyRequest) { r.SetURL(upURL) }}
	srv := redistest.Start(t)
	for _, spec := range []string{"rueidis=" + srv.Addr(), "file=" + t.TempDir()} {
		runs.Store(0)
		h := floorMiddleware(openFloor(spec), "pxfloor:", rp)
		for i := range 3 {
			rec := httptest.NewRecorder()
			req := httptest.NewRequest("POST", "/", strings.NewReader("{}"))
			req.Header.Set("Idempotency-Key", "k")
			h.ServeHTTP(rec, req)
			if rec.Body.String() != `{"n":1}` || (i == 0 && rec.Code != http.StatusCreated) {
				t.Fatalf("%s, request %d: %d %q", spec, i, rec.Code, rec.Body.String())
			}
		}
		if n := runs.Load(); n != 1 {
			t.Fatalf("%s: the upstream ran %d times for one key, want 1", spec, n)
		}
	}
}

// TestFloorFileError: once a write of the log failed, every write returns
// the error, the ones that queued behind the failed group too.
func TestFloorFileError(t *testing.T) {
	s, err := openFloorFile(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	defer s.f.Close()
	// A group is being written, and 8 writes queue behind it.
	s.mu.Lock()
	s.syncing = true
	s.mu.Unlock()
	errs := make(chan error, 8)
	for i := range 8 {
		go func() { errs <- s.store(t.Context(), fmt.Sprint("k", i), []byte("v")) }()
	}
	for queued := 0; queued < 8; runtime.Gosched() {
		s.mu.Lock()
		queued = len(s.waiters)
		s.mu.Unlock()
	}
	// The group fails and its writer leaves; the next write finds the
	// error and must release the queued ones.
	failed := errors.New("the disk failed")
	s.mu.Lock()
	s.err, s.syncing = failed, false
	if err := s.appendLocked("k", "v"); err != failed {
		t.Fatalf("a write after the failure returned %v", err)
	}
	for range 8 {
		if err := <-errs; err != failed {
			t.Fatalf("a queued write returned %v, want the failure", err)
		}
	}
}

// TestScriptFloor: the script floor runs the store's own scripts: the
// handler runs once per key, a request of a key in progress gets 409, the
// key's next request gets the stored body, which only complete.lua can
// have stored (acquire.lua replays a COMPLETED record), and complete
// publishes on the key's channel, as the store does by default.
func TestScriptFloor(t *testing.T) {
	srv := redistest.Start(t)
	ru := srv.Rueidis(t)
	acq, cpl, err := storescripts.Capture(t.Context(), srv.Addr())
	if err != nil {
		t.Fatal(err)
	}
	f := newScriptFloor(ru, acq, cpl)
	var runs atomic.Int32
	inHandler, release := make(chan struct{}), make(chan struct{})
	h := f.middleware("sfloor:", http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if runs.Add(1) == 1 {
			close(inHandler)
			<-release
		}
		w.WriteHeader(http.StatusCreated)
		io.WriteString(w, `{"n":1}`)
	}))
	do := func() *httptest.ResponseRecorder {
		rec := httptest.NewRecorder()
		req := httptest.NewRequest("POST", "/", strings.NewReader("{}"))
		req.Header.Set("Idempotency-Key", "k")
		h.ServeHTTP(rec, req)
		return rec
	}
	first := make(chan *httptest.ResponseRecorder)
	go func() { first <- do() }()
	<-inHandler
	if rec := do(); rec.Code != http.StatusConflict {
		t.Errorf("request while the first runs: status %d %q, want 409", rec.Code, rec.Body.String())
	}
	sub := srv.GoRedis(t).Subscribe(t.Context(), "sfloor:k:w")
	defer sub.Close()
	if _, err := sub.Receive(t.Context()); err != nil { // the confirmation
		t.Fatal(err)
	}
	close(release)
	if rec := <-first; rec.Code != http.StatusCreated || rec.Body.String() != `{"n":1}` {
		t.Fatalf("first request: %d %q, want 201 and the body", rec.Code, rec.Body.String())
	}
	ctx, cancel := context.WithTimeout(t.Context(), 5*time.Second)
	defer cancel()
	if msg, err := sub.ReceiveMessage(ctx); err != nil || msg.Payload != "c" {
		t.Fatalf("the key's channel after complete: %v, %v; want the message c", msg, err)
	}
	for i := range 2 {
		if rec := do(); rec.Code != http.StatusOK || rec.Body.String() != `{"n":1}` {
			t.Fatalf("replay %d: %d %q, want the stored body", i, rec.Code, rec.Body.String())
		}
	}
	if n := runs.Load(); n != 1 {
		t.Fatalf("the handler ran %d times for one key, want 1", n)
	}
}
