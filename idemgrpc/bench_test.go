package idemgrpc_test

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idemgo/idem"
	"github.com/idemgo/idem/idemgrpc"
	"github.com/idemgo/idem/idemhttp"
	"github.com/idemgo/idem/testkit/proccpu"
	"google.golang.org/grpc"
	"google.golang.org/grpc/metadata"
	"google.golang.org/protobuf/types/known/wrapperspb"
)

// benchImpl answers at once: the benchmark measures the interceptor.
type benchImpl struct{}

func (benchImpl) Charge(_ context.Context, in *wrapperspb.StringValue) (*wrapperspb.StringValue, error) {
	return wrapperspb.String("charged " + in.GetValue()), nil
}

// parallel runs b.N calls of call from conc goroutines, each with its
// own index from 1 to b.N, and reports calls/s and the process's CPU time
// per call (client, server and runtime together), cpu-µs/call. Before the
// clock starts it makes warmup calls the same way, with the indexes -1 to
// -warmup: every mode opens its connections and warms up, or else the
// first benchmark of a process (bare) pays the process's start-up.
func parallel(b *testing.B, conc int, call func(g, i int) error) {
	load(b, conc, -warmup, -1, call)
	b.ResetTimer()
	cpu0 := proccpu.Self()
	start := time.Now()
	load(b, conc, 1, b.N, call)
	b.ReportMetric(float64(b.N)/time.Since(start).Seconds(), "calls/s")
	reportCPU(b, cpu0)
}

// warmup is the number of calls parallel makes before its clock starts.
const warmup = 200

// load makes the calls of the indexes from to to from conc goroutines.
func load(b *testing.B, conc, from, to int, call func(g, i int) error) {
	var next atomic.Int64
	next.Store(int64(from - 1))
	var wg sync.WaitGroup
	for g := range conc {
		wg.Go(func() {
			for {
				i := int(next.Add(1))
				if i > to {
					return
				}
				if err := call(g, i); err != nil {
					b.Error(err)
					return
				}
			}
		})
	}
	wg.Wait()
}

// reportCPU reports the process's CPU time per b.N since cpu0 (seconds,
// proccpu.Self), cpu-µs/call: on a machine shared with other work it moves
// far less than the calls per second do. Where proccpu cannot read it,
// nothing is reported.
func reportCPU(b *testing.B, cpu0 float64) {
	if cpu1 := proccpu.Self(); cpu1 > 0 {
		b.ReportMetric((cpu1-cpu0)*1e6/float64(b.N), "cpu-µs/call")
	}
}

var benchRun atomic.Int64 // keys of one benchmark run do not meet another's

// BenchmarkUnary: a unary gRPC call over loopback TCP to a bare server
// ("bare") and to one with the idemgrpc interceptor on memstore, each call
// with a new key ("new") or a key already answered ("replay"), from 1 and
// 64 concurrent streams on one connection. make bench-grpc prints the
// ratios to bare.
func BenchmarkUnary(b *testing.B) {
	for _, conc := range []int{1, 64} {
		for _, mode := range []string{"bare", "new", "replay"} {
			b.Run(fmt.Sprintf("%s/conc=%d", mode, conc), func(b *testing.B) {
				var opts []grpc.ServerOption
				if mode != "bare" {
					opts = append(opts, grpc.UnaryInterceptor(newServer(b, nil).UnaryServerInterceptor()))
				}
				cc := dial(b, serve(b, benchImpl{}, opts...))
				run := benchRun.Add(1)
				req := wrapperspb.String("100")
				key := func(g, i int) string {
					if mode == "replay" {
						return fmt.Sprintf("r%d-g%d", run, g)
					}
					return fmt.Sprintf("r%d-%d", run, i)
				}
				invoke := func(g, i int) error {
					ctx := metadata.AppendToOutgoingContext(context.Background(), idemgrpc.DefaultKeyMetadata, key(g, i))
					return cc.Invoke(ctx, charge, req, new(wrapperspb.StringValue))
				}
				if mode == "replay" {
					for g := range conc {
						if err := invoke(g, 0); err != nil {
							b.Fatal(err)
						}
					}
				}
				parallel(b, conc, invoke)
			})
		}
	}
}

// BenchmarkHTTP: the same for idemhttp, in the same run: a POST over
// loopback to a bare handler and to one behind the idemhttp middleware on
// memstore, with a new key per request, the reference of the gRPC ratios.
func BenchmarkHTTP(b *testing.B) {
	for _, conc := range []int{1, 64} {
		for _, mode := range []string{"bare", "new"} {
			b.Run(fmt.Sprintf("%s/conc=%d", mode, conc), func(b *testing.B) {
				var h http.Handler = http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
					body, _ := io.ReadAll(r.Body)
					w.WriteHeader(http.StatusCreated)
					w.Write(append([]byte("charged "), body...))
				})
				if mode != "bare" {
					exec, err := idem.New(mustStore(b))
					if err != nil {
						b.Fatal(err)
					}
					m, err := idemhttp.New(exec)
					if err != nil {
						b.Fatal(err)
					}
					h = m.Handler(h)
				}
				lis, err := net.Listen("tcp", "127.0.0.1:0")
				if err != nil {
					b.Fatal(err)
				}
				srv := &http.Server{Handler: h}
				go srv.Serve(lis)
				b.Cleanup(func() { srv.Close() })
				client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 128}}
				url := "http://" + lis.Addr().String() + "/payments"
				run := benchRun.Add(1)
				parallel(b, conc, func(_, i int) error {
					req, _ := http.NewRequest(http.MethodPost, url, bytes.NewReader([]byte("100")))
					req.Header.Set("Idempotency-Key", "r"+strconv.FormatInt(run, 10)+"-"+strconv.Itoa(i))
					res, err := client.Do(req)
					if err != nil {
						return err
					}
					io.Copy(io.Discard, res.Body)
					res.Body.Close()
					if res.StatusCode != http.StatusCreated {
						return fmt.Errorf("status %d", res.StatusCode)
					}
					return nil
				})
			})
		}
	}
}

// BenchmarkInterceptor: the interceptor alone, in process, without a
// connection: a call's handler run directly ("bare") and through the
// interceptor on memstore with a new key ("new") or a key already answered
// ("replay"). Each call gets the incoming metadata grpc-go gives a
// handler, built in every mode alike: the differences to bare are the
// interceptor's own time and allocations per call, which the loopback
// figures of BenchmarkUnary hide in noise.
func BenchmarkInterceptor(b *testing.B) {
	info := &grpc.UnaryServerInfo{Server: benchImpl{}, FullMethod: charge}
	handler := func(ctx context.Context, req any) (any, error) {
		return benchImpl{}.Charge(ctx, req.(*wrapperspb.StringValue))
	}
	for _, mode := range []string{"bare", "new", "replay"} {
		b.Run(mode, func(b *testing.B) {
			icpt := newServer(b, nil).UnaryServerInterceptor()
			prefix := "r" + strconv.FormatInt(benchRun.Add(1), 10) + "-"
			req := wrapperspb.String("100")
			ctxOf := func(i int) context.Context {
				if mode == "replay" {
					i = 0
				}
				return incoming(prefix + strconv.Itoa(i))
			}
			if mode == "replay" {
				if _, err := icpt(ctxOf(0), req, info, handler); err != nil {
					b.Fatal(err)
				}
			}
			b.ReportAllocs()
			b.ResetTimer()
			cpu0 := proccpu.Self()
			for i := range b.N {
				var err error
				if mode == "bare" {
					_, err = handler(ctxOf(i), req)
				} else {
					_, err = icpt(ctxOf(i), req, info, handler)
				}
				if err != nil {
					b.Fatal(err)
				}
			}
			reportCPU(b, cpu0)
		})
	}
}

// incoming returns the context of a call with key as grpc-go gives it to a
// unary handler: the incoming metadata a grpc-go client sends, and a
// stream that discards the header and trailer metadata.
func incoming(key string) context.Context {
	md := metadata.Pairs(":authority", "127.0.0.1:50051", "content-type", "application/grpc",
		"user-agent", "grpc-go/1.85.0", "grpc-accept-encoding", "gzip", idemgrpc.DefaultKeyMetadata, key)
	return grpc.NewContextWithServerTransportStream(metadata.NewIncomingContext(context.Background(), md), discard{})
}
