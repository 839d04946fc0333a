package idemproxy

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/idemgo/idem"
	"github.com/idemgo/idem/adapterkit"
	"github.com/idemgo/idem/idemhttp"
	"github.com/idemgo/idem/memstore"
)

// upstream is the API behind the proxy under test: it counts executions
// per Idempotency-Key and records the fields of each request.
type upstream struct {
	srv *httptest.Server

	mu      sync.Mutex
	execs   map[string]int
	headers []http.Header
	handle  func(w http.ResponseWriter, r *http.Request) bool // true: handled
}

func newUpstream(t *testing.T) *upstream {
	t.Helper()
	u := &upstream{execs: make(map[string]int)}
	u.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		u.mu.Lock()
		key := r.Header.Get("Idempotency-Key")
		u.execs[key]++
		n := u.execs[key]
		u.headers = append(u.headers, r.Header.Clone())
		handle := u.handle
		u.mu.Unlock()
		if handle != nil && handle(w, r) {
			return
		}
		w.WriteHeader(http.StatusCreated)
		fmt.Fprintf(w, "execution %d of %s: %s", n, key, body)
	}))
	t.Cleanup(u.srv.Close)
	return u
}

func (u *upstream) executions(key string) int {
	u.mu.Lock()
	defer u.mu.Unlock()
	return u.execs[key]
}

func (u *upstream) lastHeader() http.Header {
	u.mu.Lock()
	defer u.mu.Unlock()
	return u.headers[len(u.headers)-1]
}

func (u *upstream) target(t *testing.T) *url.URL {
	t.Helper()
	target, err := url.Parse(u.srv.URL)
	if err != nil {
		t.Fatal(err)
	}
	return target
}

func newExecutor(t *testing.T, opts ...idem.Option) *idem.Executor {
	t.Helper()
	store, err := memstore.New()
	if err != nil {
		t.Fatal(err)
	}
	exec, err := idem.New(store, opts...)
	if err != nil {
		t.Fatal(err)
	}
	return exec
}

// serve serves p on a test server and returns its URL.
func serve(t *testing.T, p *Proxy) string {
	t.Helper()
	if p.Logger == nil {
		p.Logger = slog.New(slog.DiscardHandler)
	}
	srv := httptest.NewServer(p)
	t.Cleanup(srv.Close)
	return srv.URL
}

type response struct {
	status int
	header http.Header
	body   string
}

func (r response) replayed() bool { return r.header.Get(idemhttp.ReplayedHeader) == "true" }

// send sends a request with key (none if "") and the given header fields
// (name, value, ...).
func send(t *testing.T, method, url, key string, body []byte, fields ...string) response {
	t.Helper()
	req, err := http.NewRequestWithContext(t.Context(), method, url, bytes.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	if key != "" {
		req.Header.Set("Idempotency-Key", key)
	}
	for i := 0; i+1 < len(fields); i += 2 {
		req.Header.Add(fields[i], fields[i+1])
	}
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer res.Body.Close()
	b, err := io.ReadAll(res.Body)
	if err != nil {
		t.Fatal(err)
	}
	return response{status: res.StatusCode, header: res.Header, body: string(b)}
}

// TestZeroValueDefaults: a Proxy with a Target and an Executor and nothing
// else behaves as `idem proxy` at its defaults: POST and PATCH covered,
// other methods passed through, the key required, bodies up to 1 MiB,
// responses stored up to the Executor's limit, the fence sent in
// Idempotency-Fence (a client's own removed), problem+json errors, and the
// bounds of the binary's flags.
func TestZeroValueDefaults(t *testing.T) {
	up := newUpstream(t)
	p := &Proxy{Target: up.target(t), Executor: newExecutor(t)}
	base := serve(t, p)

	t.Run("covered methods", func(t *testing.T) {
		for _, method := range []string{http.MethodPost, http.MethodPatch} {
			key := "covered-" + method
			first := send(t, method, base+"/payments", key, []byte("x"))
			again := send(t, method, base+"/payments", key, []byte("x"))
			if first.status != 201 || !again.replayed() || again.body != first.body || up.executions(key) != 1 {
				t.Errorf("%s twice: got %d then replayed=%v %q after %d executions, want 201, then the replay, 1 execution",
					method, first.status, again.replayed(), again.body, up.executions(key))
			}
		}
		for _, method := range []string{http.MethodGet, http.MethodPut, http.MethodDelete} {
			key := "passed-" + method
			send(t, method, base+"/payments", key, nil)
			res := send(t, method, base+"/payments", key, nil)
			if res.replayed() || up.executions(key) != 2 || res.header.Get(idemhttp.IgnoredHeader) != "true" {
				t.Errorf("%s twice: got replayed=%v, %d executions, %s %q, want no replay, 2 executions, the key ignored",
					method, res.replayed(), up.executions(key), idemhttp.IgnoredHeader, res.header.Get(idemhttp.IgnoredHeader))
			}
		}
	})

	t.Run("key required", func(t *testing.T) {
		res := send(t, http.MethodPost, base+"/payments", "", []byte("x"))
		if res.status != 400 || res.header.Get("Content-Type") != "application/problem+json" || !strings.Contains(res.body, idemhttp.TypeKeyMissing) {
			t.Errorf("POST without a key: got %d %q %q, want 400 problem+json %s", res.status, res.header.Get("Content-Type"), res.body, idemhttp.TypeKeyMissing)
		}
	})

	t.Run("body limit", func(t *testing.T) {
		if res := send(t, http.MethodPost, base+"/payments", "body-max", bytes.Repeat([]byte("b"), idemhttp.DefaultMaxBodySize)); res.status != 201 {
			t.Errorf("a body of 1 MiB: got %d, want 201", res.status)
		}
		if res := send(t, http.MethodPost, base+"/payments", "body-over", bytes.Repeat([]byte("b"), idemhttp.DefaultMaxBodySize+1)); res.status != 413 || up.executions("body-over") != 0 {
			t.Errorf("a body over 1 MiB: got %d after %d executions, want 413 and none", res.status, up.executions("body-over"))
		}
	})

	t.Run("response limit", func(t *testing.T) {
		up.mu.Lock()
		up.handle = func(w http.ResponseWriter, r *http.Request) bool {
			if r.URL.Path != "/big" {
				return false
			}
			w.Write(bytes.Repeat([]byte("r"), adapterkit.DefaultMaxResultSize+1))
			return true
		}
		up.mu.Unlock()
		first := send(t, http.MethodPost, base+"/big", "big", []byte("x"))
		retry := send(t, http.MethodPost, base+"/big", "big", []byte("x"))
		if len(first.body) != adapterkit.DefaultMaxResultSize+1 || retry.status != 422 || !strings.Contains(retry.body, idemhttp.TypeKeyFailed) {
			t.Errorf("a response over 1 MiB: got %d bytes, then %d %q, want it whole once, then 422 %s", len(first.body), retry.status, retry.body, idemhttp.TypeKeyFailed)
		}
	})

	t.Run("fence", func(t *testing.T) {
		send(t, http.MethodPost, base+"/payments", "fence", []byte("x"), "Idempotency-Fence", "999999999999999999", "Idempotency_Fence", "1")
		h := up.lastHeader()
		fence, err := strconv.ParseInt(h.Get(DefaultFenceHeader), 10, 64)
		if err != nil || fence <= 0 || fence == 999999999999999999 || len(h.Values(DefaultFenceHeader)) != 1 || h.Get("Idempotency_Fence") != "" {
			t.Errorf("upstream fence fields: got %q and %q, want the attempt's fence alone", h.Values(DefaultFenceHeader), h.Values("Idempotency_Fence"))
		}
		send(t, http.MethodGet, base+"/payments", "", nil, "Idempotency-Fence", "7")
		if v := up.lastHeader().Values(DefaultFenceHeader); len(v) != 0 {
			t.Errorf("GET with a forged fence: upstream got %q, want none", v)
		}
	})

	t.Run("bounds", func(t *testing.T) {
		g := p.gw
		tr, ok := g.rp.Transport.(*http.Transport)
		switch {
		case !ok || tr.ResponseHeaderTimeout != DefaultUpstreamTimeout:
			t.Errorf("transport: got %T, want an *http.Transport with ResponseHeaderTimeout %v", g.rp.Transport, DefaultUpstreamTimeout)
		case g.bodyTimeout != DefaultBodyTimeout || g.writeTimeout != DefaultWriteTimeout || g.maxActive != DefaultMaxConcurrent:
			t.Errorf("bounds: got body %v write %v concurrent %d, want %v %v %d", g.bodyTimeout, g.writeTimeout, g.maxActive, DefaultBodyTimeout, DefaultWriteTimeout, DefaultMaxConcurrent)
		case g.fenceHeader != DefaultFenceHeader || g.lease != adapterkit.DefaultLease:
			t.Errorf("got fence %q lease %v, want %q and the Executor's %v", g.fenceHeader, g.lease, DefaultFenceHeader, adapterkit.DefaultLease)
		}
	})
}

// TestStreams: a text/event-stream response streams through, each event as
// the upstream flushes it; a response of unknown length that the upstream
// flushes is stored whole before the client gets it, and replayed.
func TestStreams(t *testing.T) {
	up := newUpstream(t)
	next := make(chan struct{})
	up.handle = func(w http.ResponseWriter, r *http.Request) bool {
		switch r.URL.Path {
		case "/events":
			w.Header().Set("Content-Type", "text/event-stream")
			io.WriteString(w, "data: 1\n\n")
			http.NewResponseController(w).Flush()
			<-next // the client read the first event
			io.WriteString(w, "data: 2\n\n")
		case "/chunked":
			io.WriteString(w, "part 1, ")
			http.NewResponseController(w).Flush()
			io.WriteString(w, "part 2")
		default:
			return false
		}
		return true
	}
	base := serve(t, &Proxy{Target: up.target(t), Executor: newExecutor(t)})

	req, _ := http.NewRequestWithContext(t.Context(), http.MethodPost, base+"/events", nil)
	req.Header.Set("Idempotency-Key", "sse")
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer res.Body.Close()
	rd := bufio.NewReader(res.Body)
	if line, err := rd.ReadString('\n'); err != nil || line != "data: 1\n" {
		t.Fatalf("first event: got %q, %v, want data: 1 before the stream ends", line, err)
	}
	close(next)
	if rest, err := io.ReadAll(rd); err != nil || string(rest) != "\ndata: 2\n\n" {
		t.Errorf("rest of the stream: got %q, %v", rest, err)
	}

	first := send(t, http.MethodPost, base+"/chunked", "chunked", nil)
	again := send(t, http.MethodPost, base+"/chunked", "chunked", nil)
	if first.body != "part 1, part 2" || !again.replayed() || again.body != first.body {
		t.Errorf("flushed response: got %q, then replayed=%v %q, want it whole, then replayed", first.body, again.replayed(), again.body)
	}
}

// TestFields: the fields other than Target and Executor change what their
// comments say.
func TestFields(t *testing.T) {
	up := newUpstream(t)
	var got []Event
	var mu sync.Mutex
	p := &Proxy{
		Target: up.target(t), Executor: newExecutor(t),
		Methods:      []string{"put"},
		KeyOptional:  true,
		ScopeHeader:  "X-Tenant",
		FenceHeader:  "x-fence",
		MaxBodySize:  4,
		ErrorHandler: idemhttp.WriteStripeError,
		Rewrite:      func(pr *httputil.ProxyRequest) { pr.Out.Header.Set("X-Rewritten", "yes") },
		Observer: func(r *http.Request, ev Event) {
			mu.Lock()
			got = append(got, ev)
			mu.Unlock()
		},
	}
	base := serve(t, p)

	if res := send(t, http.MethodPut, base+"/a", "k", []byte("x"), "X-Tenant", "t1"); res.status != 201 || up.lastHeader().Get("X-Fence") == "" || up.lastHeader().Get("X-Rewritten") != "yes" {
		t.Errorf("PUT: got %d, upstream fields %v, want 201 with X-Fence and X-Rewritten", res.status, up.lastHeader())
	}
	if res := send(t, http.MethodPut, base+"/a", "k", []byte("x"), "X-Tenant", "t2"); res.replayed() || up.executions("k") != 2 {
		t.Errorf("PUT by another tenant: got replayed=%v after %d executions, want its own execution", res.replayed(), up.executions("k"))
	}
	if res := send(t, http.MethodPut, base+"/a", "", []byte("x"), "X-Tenant", "t1"); res.status != 201 {
		t.Errorf("PUT without a key (KeyOptional): got %d, want 201", res.status)
	}
	if res := send(t, http.MethodPut, base+"/a", "k2", []byte("12345"), "X-Tenant", "t1"); res.status != 413 || !strings.Contains(res.body, `"error"`) {
		t.Errorf("PUT over MaxBodySize: got %d %q, want 413 in Stripe's shape", res.status, res.body)
	}
	if res := send(t, http.MethodPost, base+"/a", "k3", []byte("x")); res.replayed() || up.executions("k3") != 1 {
		t.Errorf("POST (not covered): got replayed=%v, want it passed through", res.replayed())
	}

	mu.Lock()
	defer mu.Unlock()
	var kinds []string
	for _, ev := range got {
		kinds = append(kinds, ev.Kind.String()+"/"+ev.Outcome.String())
	}
	want := []string{"covered/executed", "covered/executed", "covered/no-key", "covered/rejected", "passthrough/invalid"}
	if strings.Join(kinds, " ") != strings.Join(want, " ") {
		t.Errorf("observed: got %q, want %q", kinds, want)
	}
	if len(got) == len(want) && (got[0].Upstream <= 0 || got[0].Status != 201 || got[4].Status != 201 || got[4].Duration <= 0) {
		t.Errorf("events: got %+v and %+v, want the upstream's time and the statuses", got[0], got[4])
	}
}

// TestUpstreamFailures: what the proxy answers and does with the key when
// the upstream did not answer, and what the Observer is told.
func TestUpstreamFailures(t *testing.T) {
	gone := httptest.NewServer(http.NotFoundHandler())
	goneURL, _ := url.Parse(gone.URL)
	gone.Close()

	hang := make(chan struct{})
	slow := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { <-hang }))
	t.Cleanup(slow.Close)
	t.Cleanup(func() { close(hang) })
	slowURL, _ := url.Parse(slow.URL)

	for _, tc := range []struct {
		name    string
		target  *url.URL
		method  string
		status  int
		failure UpstreamFailure
		retry   int // the status of a retry with the same key
	}{
		{"unreachable", goneURL, http.MethodPost, 502, UpstreamUnreachable, 502},
		{"timeout", slowURL, http.MethodPost, 504, UpstreamTimeout, 409},
		{"passthrough timeout", slowURL, http.MethodGet, 504, UpstreamTimeout, 504},
	} {
		t.Run(tc.name, func(t *testing.T) {
			events := make(chan Event, 4)
			p := &Proxy{Target: tc.target, Executor: newExecutor(t, idem.WithLease(time.Minute)), UpstreamTimeout: 100 * time.Millisecond,
				Observer: func(r *http.Request, ev Event) { events <- ev }}
			base := serve(t, p)
			res := send(t, tc.method, base+"/x", "k", nil)
			if res.status != tc.status {
				t.Errorf("got %d %q, want %d", res.status, res.body, tc.status)
			}
			if ev := <-events; ev.UpstreamFailure != tc.failure {
				t.Errorf("observed failure: got %v, want %v", ev.UpstreamFailure, tc.failure)
			}
			if retry := send(t, tc.method, base+"/x", "k", nil); retry.status != tc.retry {
				t.Errorf("retry: got %d %q, want %d", retry.status, retry.body, tc.retry)
			}
		})
	}
}

// TestBusy: beyond MaxConcurrent requests in flight, a request gets 503
// with Retry-After, and the Observer is told.
func TestBusy(t *testing.T) {
	up := newUpstream(t)
	entered, release := make(chan struct{}), make(chan struct{})
	up.handle = func(w http.ResponseWriter, r *http.Request) bool {
		entered <- struct{}{}
		<-release
		return false
	}
	events := make(chan Event, 4)
	p := &Proxy{Target: up.target(t), Executor: newExecutor(t), MaxConcurrent: 1,
		Observer: func(r *http.Request, ev Event) { events <- ev }}
	base := serve(t, p)
	done := make(chan response)
	go func() { done <- send(t, http.MethodPost, base+"/a", "first", nil) }()
	<-entered
	if res := send(t, http.MethodPost, base+"/a", "second", nil); res.status != 503 || res.header.Get("Retry-After") != "1" || !strings.Contains(res.body, idemhttp.TypeServerBusy) {
		t.Errorf("over MaxConcurrent: got %d %q, want 503 %s with Retry-After", res.status, res.body, idemhttp.TypeServerBusy)
	}
	if ev := <-events; ev.Kind != KindBusy {
		t.Errorf("observed: got %v, want busy", ev.Kind)
	}
	close(release)
	if res := <-done; res.status != 201 {
		t.Errorf("the request in flight: got %d, want 201", res.status)
	}
}

// TestDrainAndReady: Ready is nil while the store answers; Drain makes it
// ErrDraining at once and returns when the request in flight ended; a
// store that reports its health makes Ready fail with its finding.
func TestDrainAndReady(t *testing.T) {
	up := newUpstream(t)
	entered, release := make(chan struct{}), make(chan struct{})
	up.handle = func(w http.ResponseWriter, r *http.Request) bool {
		if r.URL.Path == "/slow" {
			entered <- struct{}{}
			<-release
		}
		return false
	}
	p := &Proxy{Target: up.target(t), Executor: newExecutor(t)}
	base := serve(t, p)
	if err := p.Ready(t.Context()); err != nil {
		t.Fatalf("Ready: got %v, want nil", err)
	}
	done := make(chan response)
	go func() { done <- send(t, http.MethodPost, base+"/slow", "slow", nil) }()
	<-entered
	if n := p.InFlight(); n != 1 {
		t.Errorf("InFlight: got %d, want 1", n)
	}

	expired, cancel := context.WithCancel(t.Context())
	cancel()
	if err := p.Drain(expired); !errors.Is(err, context.Canceled) {
		t.Errorf("Drain with a request in flight and a done context: got %v, want context.Canceled", err)
	}
	if err := p.Ready(t.Context()); !errors.Is(err, ErrDraining) {
		t.Errorf("Ready while draining: got %v, want ErrDraining", err)
	}
	drained := make(chan error)
	go func() { drained <- p.Drain(t.Context()) }()
	close(release)
	if res := <-done; res.status != 201 {
		t.Errorf("the request in flight: got %d, want 201", res.status)
	}
	if err := <-drained; err != nil || p.InFlight() != 0 {
		t.Errorf("Drain: got %v with %d in flight, want nil and 0", err, p.InFlight())
	}

	sick := errors.New("maxmemory-policy allkeys-lru")
	ms, err := memstore.New()
	if err != nil {
		t.Fatal(err)
	}
	exec, err := idem.New(wrapper{healthStore{Store: ms, err: sick}})
	if err != nil {
		t.Fatal(err)
	}
	if err := (&Proxy{Target: up.target(t), Executor: exec}).Ready(t.Context()); !errors.Is(err, sick) {
		t.Errorf("Ready on a store whose check fails: got %v, want %v", err, sick)
	}
}

// healthStore is a store that reports a health finding, as redisstore's.
type healthStore struct {
	idem.Store
	err error
}

func (h healthStore) Health() error { return h.err }

// wrapper is a store decorator that unwraps to its store (as otelidem's).
type wrapper struct{ idem.Store }

func (w wrapper) Unwrap() idem.Store { return w.Store }

// TestInitErrors: a bad field is a *FieldError that names it, from Init
// and for every request.
func TestInitErrors(t *testing.T) {
	target, _ := url.Parse("http://127.0.0.1:1")
	exec := newExecutor(t)
	for _, tc := range []struct {
		field string
		p     *Proxy
	}{
		{"Target", &Proxy{Executor: exec}},
		{"Target", &Proxy{Target: &url.URL{Host: "h"}, Executor: exec}},
		{"Executor", &Proxy{Target: target}},
		{"Methods", &Proxy{Target: target, Executor: exec, Methods: []string{"PO ST"}}},
		{"ScopeHeader", &Proxy{Target: target, Executor: exec, ScopeHeader: "a b"}},
		{"FenceHeader", &Proxy{Target: target, Executor: exec, FenceHeader: "a:b"}},
		{"MaxBodySize", &Proxy{Target: target, Executor: exec, MaxBodySize: -1}},
		{"MaxResponseSize", &Proxy{Target: target, Executor: exec, MaxResponseSize: -1}},
		{"Wait", &Proxy{Target: target, Executor: exec, Wait: -time.Second}},
		{"ProblemTypeBase", &Proxy{Target: target, Executor: exec, ProblemTypeBase: "errors#"}},
	} {
		p := tc.p
		p.Logger = slog.New(slog.DiscardHandler)
		err := p.Init()
		var fe *FieldError
		if !errors.As(err, &fe) || fe.Field != tc.field || !errors.Is(err, idem.ErrInvalid) {
			t.Errorf("Init with a bad %s: got %v, want a *FieldError for it wrapping idem.ErrInvalid", tc.field, err)
			continue
		}
		w := httptest.NewRecorder()
		p.ServeHTTP(w, httptest.NewRequest(http.MethodPost, "/", nil))
		if w.Code != 500 {
			t.Errorf("a request with a bad %s: got %d, want 500", tc.field, w.Code)
		}
	}
}
