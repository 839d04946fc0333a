package sidecar_test

import (
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/idemgo/idem"
	"github.com/idemgo/idem/consumer"
	"github.com/idemgo/idem/consumer/sidecar"
	"github.com/idemgo/idem/memstore"
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

// BenchmarkBatch: the sidecar's cost of one batch of 100 messages in
// --to-batch mode (the Processor with gathered handlers, as idem consume
// runs it, on memstore), per message: acquiring, the gathered handlers,
// the request's JSON, the round trip, reading the outcomes, storing each
// result and completing the keys.
func BenchmarkBatch(b *testing.B) {
	answer := []byte("[" + strings.Repeat(`{"status":200,"body":"{\"ok\":true}"},`, 99) + `{"status":200,"body":"{\"ok\":true}"}]`)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		w.Header().Set("Content-Type", "application/json")
		_, _ = w.Write(answer)
	}))
	defer srv.Close()
	s, err := memstore.New()
	if err != nil {
		b.Fatal(err)
	}
	exec, err := idem.New(s)
	if err != nil {
		b.Fatal(err)
	}
	p, err := consumer.New(exec, consumer.WithGatheredHandlers())
	if err != nil {
		b.Fatal(err)
	}
	h := &sidecar.Handler{URL: srv.URL, Batch: true}
	hdr := http.Header{sidecar.HeaderBroker: {"redis-stream"}, sidecar.HeaderTopic: {"t"}, "Content-Type": {"application/json"}}
	body := []byte(`{"amount":1}`)
	// A context that can be done, as an adapter's: each handler runs on a
	// goroutine of its own.
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	msgs := make([]consumer.Message, 100)
	b.ReportAllocs()
	cpu := processCPU()
	for n := 0; b.Loop(); n++ {
		for i := range msgs {
			msgs[i] = consumer.Message{Key: strconv.Itoa(n) + "-" + strconv.Itoa(i), Deliveries: 1, ID: strconv.Itoa(i)}
		}
		for i, r := range p.Process(ctx, msgs, func(ctx context.Context, i int) error {
			return h.Call(ctx, sidecar.Delivery{Body: body, Header: hdr})
		}) {
			if r.Action != consumer.Ack {
				b.Fatalf("message %d: %v %v", i, r.Action, r.Err)
			}
		}
	}
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*len(msgs)), "ns/msg")
	// The process's CPU time (the handler's included) moves less than the
	// wall time on a machine that others share.
	b.ReportMetric(float64((processCPU()-cpu).Nanoseconds())/float64(b.N*len(msgs)), "cpu-ns/msg")
}

// processCPU returns the user and system CPU time of this process.
func processCPU() time.Duration {
	var ru syscall.Rusage
	_ = syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
