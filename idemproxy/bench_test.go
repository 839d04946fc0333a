package idemproxy

import (
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/idemgo/idem"
	"github.com/idemgo/idem/memstore"
)

// cannedUpstream is a RoundTripper that answers 201 at once, so that the
// benchmark measures the proxy and not a network.
type cannedUpstream struct{}

func (cannedUpstream) RoundTrip(r *http.Request) (*http.Response, error) {
	if r.Body != nil {
		io.Copy(io.Discard, r.Body)
		r.Body.Close()
	}
	body := `{"id":"pay_1","amount":100}`
	return &http.Response{
		StatusCode:    201,
		Header:        http.Header{"Content-Type": {"application/json"}},
		Body:          io.NopCloser(strings.NewReader(body)),
		ContentLength: int64(len(body)),
		Request:       r,
	}, nil
}

func newBenchProxy(b *testing.B) *Proxy {
	store, err := memstore.New()
	if err != nil {
		b.Fatal(err)
	}
	exec, err := idem.New(store)
	if err != nil {
		b.Fatal(err)
	}
	target, _ := url.Parse("http://upstream.test")
	p := &Proxy{Target: target, Executor: exec, Transport: cannedUpstream{}, Logger: slog.New(slog.DiscardHandler),
		Observer: func(*http.Request, Event) {}}
	if err := p.Init(); err != nil {
		b.Fatal(err)
	}
	return p
}

// BenchmarkProxy measures a new-key request through a Proxy at its
// defaults (exchange, middleware, reverse proxy, fence) on memstore,
// without a network.
func BenchmarkProxy(b *testing.B) {
	p := newBenchProxy(b)
	var seq atomic.Int64
	b.ReportAllocs()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			r := httptest.NewRequest("POST", "/payments", strings.NewReader(`{"amount":100}`))
			r.Header.Set("Idempotency-Key", strconv.FormatInt(seq.Add(1), 10))
			w := httptest.NewRecorder()
			p.ServeHTTP(w, r)
			if w.Code != 201 {
				b.Fatalf("got %d", w.Code)
			}
		}
	})
}

// BenchmarkReverseProxy is the baseline: the bare httputil.ReverseProxy.
func BenchmarkReverseProxy(b *testing.B) {
	p := newBenchProxy(b)
	b.ReportAllocs()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			r := httptest.NewRequest("POST", "/payments", strings.NewReader(`{"amount":100}`))
			w := httptest.NewRecorder()
			p.gw.rp.ServeHTTP(w, r)
		}
	})
}
