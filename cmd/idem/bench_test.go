package main

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
	"github.com/idemgo/idem/idemhttp"
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

func newBenchGateway(b *testing.B) *gateway {
	store, err := memstore.New()
	if err != nil {
		b.Fatal(err)
	}
	obs := newObserver()
	exec, err := idem.New(obs.instrument(store))
	if err != nil {
		b.Fatal(err)
	}
	log := slog.New(slog.DiscardHandler)
	mw, err := idemhttp.New(exec, idemhttp.WithHook(obs.hook), idemhttp.WithPolicy(proxyPolicy(idemhttp.DefaultPolicy)), idemhttp.WithLogger(log))
	if err != nil {
		b.Fatal(err)
	}
	target, _ := url.Parse("http://upstream.test")
	return newGateway(target, cannedUpstream{}, mw, []string{"POST", "PATCH"}, idem.DefaultLease, obs, log)
}

// BenchmarkGateway measures a new-key request through the whole handler
// (exchange, middleware, reverse proxy) on memstore, without a network.
func BenchmarkGateway(b *testing.B) {
	g := newBenchGateway(b)
	var seq atomic.Int64
	b.ReportAllocs()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			r := httptest.NewRequest("POST", "/payments", strings.NewReader(`{"amount":100}`))
			r.Header.Set("Idempotency-Key", strconv.FormatInt(seq.Add(1), 10))
			w := httptest.NewRecorder()
			g.ServeHTTP(w, r)
			if w.Code != 201 {
				b.Fatalf("got %d", w.Code)
			}
		}
	})
}

// BenchmarkReverseProxy is the baseline: the bare httputil.ReverseProxy.
func BenchmarkReverseProxy(b *testing.B) {
	g := newBenchGateway(b)
	b.ReportAllocs()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			r := httptest.NewRequest("POST", "/payments", strings.NewReader(`{"amount":100}`))
			w := httptest.NewRecorder()
			g.rp.ServeHTTP(w, r)
		}
	})
}
