package grpcretry

import (
	"context"
	"fmt"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/idemgo/idem"
	"github.com/idemgo/idem/chaos/chaostest"
	"github.com/idemgo/idem/idemgrpc"
	"github.com/idemgo/idem/memstore"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
	"google.golang.org/protobuf/types/known/wrapperspb"
)

const (
	service = "idem.chaos.Payments"
	charge  = "/" + service + "/Charge"
	// resetP is the share of the server's responses the TCP proxy
	// replaces by a connection reset.
	resetP = 0.3
	// minBytes: the server's chunks of at least this size are responses
	// (the padded reply below); HTTP/2's own frames are smaller.
	minBytes = 100
)

const retryConfig = `{"methodConfig":[{"name":[{"service":"` + service + `"}],
  "retryPolicy":{"maxAttempts":5,"initialBackoff":"0.005s","maxBackoff":"0.05s","backoffMultiplier":2,"retryableStatusCodes":["UNAVAILABLE"]}}]}`

// server is the non-idempotent handler: it counts its runs per key.
type server struct {
	mu   sync.Mutex
	runs map[string]int
}

func (s *server) charge(ctx context.Context, in *wrapperspb.StringValue) (*wrapperspb.StringValue, error) {
	md, _ := metadata.FromIncomingContext(ctx)
	key := strings.Join(md.Get(idemgrpc.DefaultKeyMetadata), ",")
	s.mu.Lock()
	s.runs[key]++
	s.mu.Unlock()
	return wrapperspb.String("charged " + in.GetValue() + " " + strings.Repeat(".", 200)), nil
}

// serve starts the gRPC server with opts on loopback and returns it and
// its address.
func serve(t *testing.T, opts ...grpc.ServerOption) (*server, string) {
	t.Helper()
	s := &server{runs: map[string]int{}}
	srv := grpc.NewServer(opts...)
	srv.RegisterService(&grpc.ServiceDesc{
		ServiceName: service,
		HandlerType: (*any)(nil),
		Methods: []grpc.MethodDesc{{MethodName: "Charge", Handler: func(_ any, ctx context.Context, dec func(any) error, icpt grpc.UnaryServerInterceptor) (any, error) {
			in := new(wrapperspb.StringValue)
			if err := dec(in); err != nil {
				return nil, err
			}
			h := func(ctx context.Context, req any) (any, error) { return s.charge(ctx, req.(*wrapperspb.StringValue)) }
			if icpt == nil {
				return h(ctx, in)
			}
			return icpt(ctx, in, &grpc.UnaryServerInfo{FullMethod: charge}, h)
		}}},
	}, s)
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go srv.Serve(lis)
	t.Cleanup(srv.Stop)
	return s, lis.Addr().String()
}

// run makes calls calls from 16 goroutines through addr, each with a key
// of its own kept across the retries of the retry policy and, when every
// attempt failed, across the caller's own retries (idemgrpc.WithKey), and
// returns the counters.
func run(t *testing.T, addr string, calls int, srv *server) (*chaostest.Counters, int) {
	t.Helper()
	cc, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithDefaultServiceConfig(retryConfig), grpc.WithUnaryInterceptor(idemgrpc.UnaryClientInterceptor()))
	if err != nil {
		t.Fatal(err)
	}
	defer cc.Close()
	var c chaostest.Counters
	var mu sync.Mutex
	callerRetries := 0
	work := make(chan int)
	var wg sync.WaitGroup
	for range 16 {
		wg.Go(func() {
			for i := range work {
				key := fmt.Sprintf("%s-%d", t.Name(), i)
				c.Attempted.Add(1)
				for try := range 20 {
					ctx, cancel := context.WithTimeout(idemgrpc.WithKey(t.Context(), key), 10*time.Second)
					out := new(wrapperspb.StringValue)
					err := cc.Invoke(ctx, charge, wrapperspb.String(fmt.Sprint(i)), out)
					cancel()
					if err == nil && strings.HasPrefix(out.GetValue(), fmt.Sprint("charged ", i, " ")) {
						c.Acknowledged.Add(1)
						break
					}
					if try > 0 {
						mu.Lock()
						callerRetries++
						mu.Unlock()
					}
					time.Sleep(10 * time.Millisecond) // the caller's own backoff
				}
			}
		})
	}
	for i := range calls {
		work <- i
	}
	close(work)
	wg.Wait()
	srv.mu.Lock()
	defer srv.mu.Unlock()
	for i := range calls {
		n := srv.runs[fmt.Sprintf("%s-%d", t.Name(), i)]
		c.Executed.Add(int64(n))
		if n > 0 {
			c.Effects.Add(1)
		}
		if n > 1 {
			c.Duplicated.Add(int64(n - 1))
		}
		if n == 0 {
			c.Lost.Add(1)
		}
	}
	return &c, callerRetries
}

func check(t *testing.T, c *chaostest.Counters, calls int, resets int64) {
	t.Helper()
	if c.Duplicated.Load() != 0 || c.Lost.Load() != 0 || c.Acknowledged.Load() != int64(calls) {
		t.Errorf("got %d acknowledged, %d duplicated, %d lost of %d calls; want every call acknowledged, 0 duplicated, 0 lost",
			c.Acknowledged.Load(), c.Duplicated.Load(), c.Lost.Load(), calls)
	}
	// A reset loses every response in flight on the connection: fewer
	// resets than faulty calls.
	if resets < int64(calls)/50 {
		t.Errorf("only %d resets for %d calls: the fault did not happen", resets, calls)
	}
}

// TestGRPCRetries: the idemgrpc interceptor on the server.
func TestGRPCRetries(t *testing.T) {
	calls := chaostest.Size(300, 5000)
	t.Run("interceptor", func(t *testing.T) {
		store, err := memstore.New()
		if err != nil {
			t.Fatal(err)
		}
		exec, err := idem.New(store)
		if err != nil {
			t.Fatal(err)
		}
		is, err := idemgrpc.New(exec, idemgrpc.WithMethods(charge))
		if err != nil {
			t.Fatal(err)
		}
		// attempts counts the attempts of each key that reach the server.
		var mu sync.Mutex
		attempts := map[string]int{}
		count := func(ctx context.Context, req any, info *grpc.UnaryServerInfo, h grpc.UnaryHandler) (any, error) {
			md, _ := metadata.FromIncomingContext(ctx)
			mu.Lock()
			attempts[strings.Join(md.Get(idemgrpc.DefaultKeyMetadata), ",")]++
			mu.Unlock()
			return h(ctx, req)
		}
		srv, addr := serve(t, grpc.ChainUnaryInterceptor(count, is.UnaryServerInterceptor()))
		rp := chaostest.StartResetProxy(t, addr, resetP, minBytes)
		c, retries := run(t, rp.Addr(), calls, srv)
		check(t, c, calls, rp.Resets())
		retried := 0
		for _, n := range attempts {
			if n > 1 {
				retried++
			}
		}
		if retried == 0 {
			t.Errorf("no call was retried with its key: the fault did not reach the calls")
		}
		chaostest.Report(t, "gRPC retries, 30% of responses reset: idemgrpc interceptor", "make chaos RUN=TestGRPCRetries/interceptor", c,
			map[string]string{"resets": fmt.Sprint(rp.Resets()), "calls_retried": fmt.Sprint(retried), "caller_retries": fmt.Sprint(retries)})
	})
	t.Run("idem proxy --h2c", func(t *testing.T) {
		srv, addr := serve(t)
		bin := chaostest.BuildIdem(t)
		_, paddr := chaostest.StartProxy(t, bin, "--upstream", "http://"+addr, "--data", t.TempDir(),
			"--h2c", "--upstream-h2c", "--wait", "10s")
		rp := chaostest.StartResetProxy(t, paddr, resetP, minBytes)
		c, retries := run(t, rp.Addr(), calls, srv)
		check(t, c, calls, rp.Resets())
		chaostest.Report(t, "gRPC retries, 30% of responses reset: idem proxy --h2c --upstream-h2c", "make chaos RUN='TestGRPCRetries/idem_proxy'", c,
			map[string]string{"resets": fmt.Sprint(rp.Resets()), "caller_retries": fmt.Sprint(retries)})
	})
	t.Run("control: no idempotency", func(t *testing.T) {
		srv, addr := serve(t)
		rp := chaostest.StartResetProxy(t, addr, resetP, minBytes)
		n := min(calls, 500)
		c, _ := run(t, rp.Addr(), n, srv)
		if c.Duplicated.Load() == 0 {
			t.Errorf("control: no key ran twice in %d calls with %d resets; the fault does not reach the handler", n, rp.Resets())
		}
		chaostest.Report(t, "gRPC retries, 30% of responses reset: control without idempotency", "make chaos RUN='TestGRPCRetries/control'", c,
			map[string]string{"resets": fmt.Sprint(rp.Resets())})
	})
}
