package sidecar_test

import (
	"context"
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/idemgo/idem/consumer/sidecar"
)

// BenchmarkCall: the sidecar's cost of one 2xx call (request building,
// the round trip on a kept-alive connection, reading and encoding the
// result), with an in-process handler answering a short body.
func BenchmarkCall(b *testing.B) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/plain")
		_, _ = w.Write([]byte("ok"))
	}))
	defer srv.Close()
	h := &sidecar.Handler{URL: srv.URL}
	d := sidecar.Delivery{Key: "k", Body: []byte(`{"n":1}`), Header: http.Header{sidecar.HeaderBroker: {"redis-stream"}, sidecar.HeaderTopic: {"t"}}}
	b.ReportAllocs()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			if err := h.Call(context.Background(), d); err != nil {
				b.Fatal(err)
			}
		}
	})
}
