package idemgrpc_test

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/grpc-ecosystem/go-grpc-middleware/v2/interceptors/retry"
	"github.com/idemgo/idem/idemgrpc"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
)

// retryConfig is a service config whose retry policy retries Unavailable.
const retryConfig = `{"methodConfig":[{"name":[{"service":"` + service + `"}],
  "retryPolicy":{"maxAttempts":4,"initialBackoff":"0.01s","maxBackoff":"0.05s","backoffMultiplier":2,"retryableStatusCodes":["UNAVAILABLE"]}}]}`

// loseFirst is a server interceptor, outside idem's, that runs the first
// attempt of every key and then loses its response: the client gets
// Unavailable, as when a connection breaks after the handler ran.
type loseFirst struct {
	mu       sync.Mutex
	seen     map[string]bool
	attempts int
}

func (l *loseFirst) intercept(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
	md, _ := metadata.FromIncomingContext(ctx)
	key := fmt.Sprint(md.Get(idemgrpc.DefaultKeyMetadata))
	l.mu.Lock()
	l.attempts++
	first := !l.seen[key]
	l.seen[key] = true
	l.mu.Unlock()
	if !first {
		return handler(ctx, req)
	}
	_, _ = handler(grpc.NewContextWithServerTransportStream(ctx, discard{}), req)
	return nil, status.Error(codes.Unavailable, "the response was lost")
}

// discard swallows the metadata of a lost response.
type discard struct{}

func (discard) Method() string                  { return charge }
func (discard) SetHeader(metadata.MD) error     { return nil }
func (discard) SendHeader(metadata.MD) error    { return nil }
func (discard) SetTrailer(md metadata.MD) error { return nil }

// TestClientRetries: the client interceptor gives a call one key for all
// its attempts, under the gRPC retry policy and under go-grpc-middleware's
// retry interceptor; every first response is lost, the retry gets the
// replay, and each call's handler ran once. The controls: without idem on
// the server every call runs twice; with the retry interceptor before
// idem's in the chain, every attempt gets a key of its own, runs, and is
// lost: the call fails after its 4 attempts ran the handler 4 times.
func TestClientRetries(t *testing.T) {
	const calls = 20
	middlewareRetry := retry.UnaryClientInterceptor(retry.WithMax(4), retry.WithCodes(codes.Unavailable),
		retry.WithBackoff(retry.BackoffLinear(10*time.Millisecond)))
	for _, tc := range []struct {
		name     string
		idem     bool
		dialOpts []grpc.DialOption
		runs     int // per call
	}{
		{"retry policy", true, []grpc.DialOption{grpc.WithDefaultServiceConfig(retryConfig), grpc.WithUnaryInterceptor(idemgrpc.UnaryClientInterceptor())}, 1},
		{"go-grpc-middleware retry", true, []grpc.DialOption{grpc.WithDisableRetry(), grpc.WithChainUnaryInterceptor(idemgrpc.UnaryClientInterceptor(), middlewareRetry)}, 1},
		{"control: retry policy, no idem on the server", false, []grpc.DialOption{grpc.WithDefaultServiceConfig(retryConfig), grpc.WithUnaryInterceptor(idemgrpc.UnaryClientInterceptor())}, 2},
	} {
		t.Run(tc.name, func(t *testing.T) {
			svc := newImpl()
			lose := &loseFirst{seen: map[string]bool{}}
			chain := []grpc.UnaryServerInterceptor{lose.intercept}
			if tc.idem {
				chain = append(chain, newServer(t, nil).UnaryServerInterceptor())
			}
			cc := dial(t, serve(t, svc, grpc.ChainUnaryInterceptor(chain...)), tc.dialOpts...)
			for i := range calls {
				out := wrapString("")
				if err := cc.Invoke(t.Context(), charge, wrapString(fmt.Sprint(i)), out); err != nil {
					t.Fatalf("call %d: %v", i, err)
				}
				if want := fmt.Sprint("charged ", i); out.GetValue() != want {
					t.Fatalf("call %d: got %q, want %q", i, out.GetValue(), want)
				}
			}
			if got := svc.total(); got != calls*tc.runs {
				t.Errorf("handler ran %d times for %d calls, want %d", got, calls, calls*tc.runs)
			}
			if lose.attempts < 2*calls {
				t.Errorf("%d attempts for %d calls: the retries did not happen", lose.attempts, calls)
			}
		})
	}
}

func TestClientRetriesWrongOrder(t *testing.T) {
	svc := newImpl()
	lose := &loseFirst{seen: map[string]bool{}}
	cc := dial(t, serve(t, svc, grpc.ChainUnaryInterceptor(lose.intercept, newServer(t, nil).UnaryServerInterceptor())),
		grpc.WithDisableRetry(), grpc.WithChainUnaryInterceptor(
			retry.UnaryClientInterceptor(retry.WithMax(4), retry.WithCodes(codes.Unavailable), retry.WithBackoff(retry.BackoffLinear(10*time.Millisecond))),
			idemgrpc.UnaryClientInterceptor()))
	err := cc.Invoke(t.Context(), charge, wrapString("a"), wrapString(""))
	if status.Code(err) != codes.Unavailable || svc.total() != 4 {
		t.Errorf("got %v after %d runs; want Unavailable after 4 runs (a key per attempt)", err, svc.total())
	}
}

// TestWithKey: a key from the context is the call's key; one already in
// the outgoing metadata is kept.
func TestWithKey(t *testing.T) {
	svc := newImpl()
	cc := dial(t, serve(t, svc, grpc.UnaryInterceptor(newServer(t, nil).UnaryServerInterceptor())),
		grpc.WithUnaryInterceptor(idemgrpc.UnaryClientInterceptor()))
	for range 2 {
		if err := cc.Invoke(idemgrpc.WithKey(t.Context(), "order-17"), charge, wrapString("a"), wrapString("")); err != nil {
			t.Fatal(err)
		}
		ctx := metadata.AppendToOutgoingContext(t.Context(), idemgrpc.DefaultKeyMetadata, "order-18")
		if err := cc.Invoke(ctx, charge, wrapString("a"), wrapString("")); err != nil {
			t.Fatal(err)
		}
	}
	if a, b := svc.runsOf("order-17"), svc.runsOf("order-18"); a != 1 || b != 1 {
		t.Errorf("runs: order-17 %d, order-18 %d; want 1 and 1", a, b)
	}
}
