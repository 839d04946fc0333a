package main

import (
	"context"
	"net"
	"net/http"
	"sync"
	"testing"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/wrapperspb"
)

// grpcUpstream is a gRPC server with one unary method,
// /idem.test.Payments/Charge (described by hand, with wrapperspb
// messages), that counts its runs per idempotency key, sets a header and
// a trailer, and fails with InvalidArgument for the request "bad".
type grpcUpstream struct {
	mu   sync.Mutex
	runs map[string]int
}

const grpcCharge = "/idem.test.Payments/Charge"

func (g *grpcUpstream) charge(ctx context.Context, in *wrapperspb.StringValue) (*wrapperspb.StringValue, error) {
	md, _ := metadata.FromIncomingContext(ctx)
	g.mu.Lock()
	for _, k := range md.Get("idempotency-key") {
		g.runs[k]++
	}
	g.mu.Unlock()
	if in.GetValue() == "bad" {
		return nil, status.Error(codes.InvalidArgument, "bad amount")
	}
	_ = grpc.SetTrailer(ctx, metadata.Pairs("x-checksum", "sum-"+in.GetValue()))
	return wrapperspb.String("charged " + in.GetValue()), nil
}

func (g *grpcUpstream) runsOf(key string) int {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.runs[key]
}

func startGRPCUpstream(t *testing.T) (*grpcUpstream, string) {
	t.Helper()
	g := &grpcUpstream{runs: map[string]int{}}
	srv := grpc.NewServer()
	srv.RegisterService(&grpc.ServiceDesc{
		ServiceName: "idem.test.Payments",
		HandlerType: (*any)(nil),
		Methods: []grpc.MethodDesc{{MethodName: "Charge", Handler: func(_ any, ctx context.Context, dec func(any) error, _ grpc.UnaryServerInterceptor) (any, error) {
			in := new(wrapperspb.StringValue)
			if err := dec(in); err != nil {
				return nil, err
			}
			return g.charge(ctx, in)
		}}},
	}, g)
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go srv.Serve(lis)
	t.Cleanup(srv.Stop)
	return g, lis.Addr().String()
}

// TestProxyGRPC: a grpc-go client calls a grpc-go server through `idem
// proxy --h2c --upstream-h2c` with the key in the idempotency-key
// metadata: the retry gets the replay (the response, the grpc-status and
// the server's trailers, and Idempotent-Replayed in the header metadata)
// and the server ran once; a status error is stored and replayed the same
// way. The control: without --upstream-h2c the proxy cannot reach the
// gRPC server (it speaks HTTP/2 only) and the call fails.
func TestProxyGRPC(t *testing.T) {
	t.Parallel()
	g, addr := startGRPCUpstream(t)
	p := startProxy(t, "http://"+addr, []string{"--data", t.TempDir()}, "--h2c", "--upstream-h2c")
	cc, err := grpc.NewClient(p.addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer cc.Close()
	call := func(key, v string) (string, metadata.MD, metadata.MD, error) {
		ctx := metadata.AppendToOutgoingContext(t.Context(), "idempotency-key", key)
		var header, trailer metadata.MD
		out := new(wrapperspb.StringValue)
		err := cc.Invoke(ctx, grpcCharge, wrapperspb.String(v), out, grpc.Header(&header), grpc.Trailer(&trailer))
		return out.GetValue(), header, trailer, err
	}
	v1, h1, t1, err := call("k1", "100")
	if err != nil || v1 != "charged 100" {
		t.Fatalf("first call: %q, %v", v1, err)
	}
	v2, h2, t2, err := call("k1", "100")
	if err != nil || v2 != v1 {
		t.Fatalf("retry: %q, %v; want %q", v2, err, v1)
	}
	if got := h2.Get("idempotent-replayed"); len(got) != 1 || got[0] != "true" {
		t.Errorf("retry's header idempotent-replayed: got %v (first call's: %v)", got, h1.Get("idempotent-replayed"))
	}
	if a, b := t1.Get("x-checksum"), t2.Get("x-checksum"); len(a) != 1 || len(b) != 1 || a[0] != b[0] {
		t.Errorf("trailer x-checksum: first %v, replay %v", a, b)
	}
	if n := g.runsOf("k1"); n != 1 {
		t.Errorf("the gRPC server ran %d times, want 1", n)
	}
	for range 2 {
		if _, _, _, err := call("k2", "bad"); status.Code(err) != codes.InvalidArgument || status.Convert(err).Message() != "bad amount" {
			t.Errorf("a stored error: got %v, want InvalidArgument bad amount", err)
		}
	}
	if n := g.runsOf("k2"); n != 1 {
		t.Errorf("the gRPC server ran %d times for the failing call, want 1", n)
	}

	// Control: HTTP/1.1 to the upstream, which speaks HTTP/2 only.
	p2 := startProxy(t, "http://"+addr, []string{"--data", t.TempDir()}, "--h2c")
	cc2, err := grpc.NewClient(p2.addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer cc2.Close()
	ctx := metadata.AppendToOutgoingContext(t.Context(), "idempotency-key", "k3")
	if err := cc2.Invoke(ctx, grpcCharge, wrapperspb.String("1"), new(wrapperspb.StringValue)); err == nil {
		t.Error("without --upstream-h2c: the call succeeded, want a failure")
	}
	// And without --h2c the proxy does not speak HTTP/2 without TLS.
	p3 := startProxy(t, "http://"+addr, []string{"--data", t.TempDir()}, "--upstream-h2c")
	tr := &http.Transport{Protocols: new(http.Protocols)}
	tr.Protocols.SetUnencryptedHTTP2(true)
	if res, err := (&http.Client{Transport: tr}).Get(p3.url("/")); err == nil {
		res.Body.Close()
		t.Errorf("h2c to a proxy without --h2c: got %s, want a failure", res.Status)
	}
}
