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
	"google.golang.org/grpc"
	"google.golang.org/grpc/metadata"
	"google.golang.org/protobuf/types/known/wrapperspb"
)

// benchImpl answers at once: the benchmark measures the interceptor.
type benchImpl struct{}

func (benchImpl) Charge(_ context.Context, in *wrapperspb.StringValue) (*wrapperspb.StringValue, error) {
	return wrapperspb.String("charged " + in.GetValue()), nil
}

// parallel runs b.N calls of call from conc goroutines (each its own
// index) and reports calls/s.
func parallel(b *testing.B, conc int, call func(g, i int) error) {
	var next atomic.Int64
	var wg sync.WaitGroup
	b.ResetTimer()
	start := time.Now()
	for g := range conc {
		wg.Go(func() {
			for {
				i := int(next.Add(1))
				if i > b.N {
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
	b.ReportMetric(float64(b.N)/time.Since(start).Seconds(), "calls/s")
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
