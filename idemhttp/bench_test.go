package idemhttp_test

import (
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/idemgo/idem"
	"github.com/idemgo/idem/idemhttp"
	"github.com/idemgo/idem/idemhttp/httpkit"
	"github.com/idemgo/idem/memstore"
)

// The benchmarks measure the middleware's overhead in process, on memstore,
// against the bare handler: one request per iteration through
// httptest.NewRecorder (no network), and in parallel over loopback through
// httptest.NewServer. Store round trips to Redis are not included; the load
// generator measures them.

const benchBody = `{"amount":1000,"currency":"EUR","customer":"cus_123","description":"order 17"}`

var benchHandler = http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
	io.Copy(io.Discard, r.Body)
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(http.StatusCreated)
	io.WriteString(w, `{"id":"pay_1","status":"succeeded","amount":1000,"currency":"EUR"}`)
})

func benchMiddleware(b *testing.B, opts ...idemhttp.Option) http.Handler {
	b.Helper()
	s, err := memstore.New()
	if err != nil {
		b.Fatal(err)
	}
	exec, err := idem.New(s)
	if err != nil {
		b.Fatal(err)
	}
	mw, err := idemhttp.New(exec, opts...)
	if err != nil {
		b.Fatal(err)
	}
	return mw.Handler(benchHandler)
}

func benchServe(b *testing.B, h http.Handler, key func(i int) string) {
	b.ReportAllocs()
	i := 0
	for b.Loop() {
		r := httptest.NewRequest("POST", "/payments", strings.NewReader(benchBody))
		if key != nil {
			r.Header.Set("Idempotency-Key", key(i))
		}
		w := httptest.NewRecorder()
		h.ServeHTTP(w, r)
		if w.Code != http.StatusCreated {
			b.Fatalf("status: got %d, want 201", w.Code)
		}
		i++
	}
}

func BenchmarkMiddlewareBare(b *testing.B) {
	benchServe(b, benchHandler, nil)
}

func BenchmarkMiddlewareNewKey(b *testing.B) {
	benchServe(b, benchMiddleware(b), func(i int) string { return "key-" + strconv.Itoa(i) })
}

// BenchmarkMiddlewareNewKeyStreamAll is BenchmarkMiddlewareNewKey with
// the response written through and stored afterwards (httpkit.StreamAll): the
// difference is what holding a response back until it is stored costs.
func BenchmarkMiddlewareNewKeyStreamAll(b *testing.B) {
	benchServe(b, benchMiddleware(b, httpkit.StreamAll(true)), func(i int) string { return "key-" + strconv.Itoa(i) })
}

func BenchmarkMiddlewareReplay(b *testing.B) {
	benchServe(b, benchMiddleware(b), func(int) string { return "key" })
}

// BenchmarkMiddlewareServer sends requests in parallel over loopback to an
// httptest.Server with keep-alive connections.
func BenchmarkMiddlewareServer(b *testing.B) {
	for _, bc := range []struct {
		name string
		h    func(b *testing.B) http.Handler
		key  func(i int64) string
	}{
		{"bare", func(*testing.B) http.Handler { return benchHandler }, nil},
		{"new-key", func(b *testing.B) http.Handler { return benchMiddleware(b) }, func(i int64) string { return "key-" + strconv.FormatInt(i, 10) }},
		{"replay", func(b *testing.B) http.Handler { return benchMiddleware(b) }, func(int64) string { return "key" }},
	} {
		b.Run(bc.name, func(b *testing.B) {
			srv := httptest.NewServer(bc.h(b))
			defer srv.Close()
			client := srv.Client()
			client.Transport.(*http.Transport).MaxIdleConnsPerHost = 256
			send := func(key string) error {
				req, _ := http.NewRequest("POST", srv.URL+"/payments", strings.NewReader(benchBody))
				if key != "" {
					req.Header.Set("Idempotency-Key", key)
				}
				res, err := client.Do(req)
				if err != nil {
					return err
				}
				io.Copy(io.Discard, res.Body)
				res.Body.Close()
				if res.StatusCode != http.StatusCreated {
					return fmt.Errorf("status: got %d, want 201", res.StatusCode)
				}
				return nil
			}
			var seq atomic.Int64
			if bc.key != nil {
				// Store the response to replay before the clock starts.
				if err := send(bc.key(0)); err != nil {
					b.Fatal(err)
				}
			}
			b.ReportAllocs()
			b.ResetTimer()
			b.RunParallel(func(pb *testing.PB) {
				for pb.Next() {
					key := ""
					if bc.key != nil {
						key = bc.key(seq.Add(1))
					}
					if err := send(key); err != nil {
						b.Error(err)
						return
					}
				}
			})
		})
	}
}
