package idemgrpc_test

import (
	"context"
	"errors"
	"net"
	"strconv"
	"strings"
	"sync"
	"testing"

	"github.com/idemgo/idem"
	"github.com/idemgo/idem/idemgrpc"
	"github.com/idemgo/idem/memstore"
	"github.com/idemgo/idem/storekit"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/wrapperspb"
)

// The test service: idemgrpc.test.Payments, described by hand (no
// generated code), with wrapperspb messages, which are registered types.
const (
	service   = "idemgrpc.test.Payments"
	charge    = "/" + service + "/Charge"
	uncovered = "/" + service + "/Quote"
	streamM   = "/" + service + "/Stream"
)

type payments interface {
	Charge(ctx context.Context, in *wrapperspb.StringValue) (*wrapperspb.StringValue, error)
}

func unaryHandler(full string) func(srv any, ctx context.Context, dec func(any) error, icpt grpc.UnaryServerInterceptor) (any, error) {
	return func(srv any, ctx context.Context, dec func(any) error, icpt grpc.UnaryServerInterceptor) (any, error) {
		in := new(wrapperspb.StringValue)
		if err := dec(in); err != nil {
			return nil, err
		}
		h := func(ctx context.Context, req any) (any, error) {
			return srv.(payments).Charge(ctx, req.(*wrapperspb.StringValue))
		}
		if icpt == nil {
			return h(ctx, in)
		}
		return icpt(ctx, in, &grpc.UnaryServerInfo{Server: srv, FullMethod: full}, h)
	}
}

var serviceDesc = grpc.ServiceDesc{
	ServiceName: service,
	HandlerType: (*payments)(nil),
	Methods: []grpc.MethodDesc{
		{MethodName: "Charge", Handler: unaryHandler(charge)},
		{MethodName: "Quote", Handler: unaryHandler(uncovered)},
	},
	Streams: []grpc.StreamDesc{{StreamName: "Stream", ServerStreams: true, ClientStreams: true,
		Handler: func(srv any, ss grpc.ServerStream) error { return nil }}},
}

// impl is the service: Charge counts its runs per key and answers by the
// request: "fail:CODE" fails with that code, "block" waits for release,
// anything else is charged, with a header and a trailer.
type impl struct {
	mu      sync.Mutex
	runs    map[string]int
	fences  []int64
	release chan struct{}
	started chan struct{}
}

func newImpl() *impl {
	return &impl{runs: map[string]int{}, release: make(chan struct{}), started: make(chan struct{}, 100)}
}

func (s *impl) Charge(ctx context.Context, in *wrapperspb.StringValue) (*wrapperspb.StringValue, error) {
	md, _ := metadata.FromIncomingContext(ctx)
	key := strings.Join(md.Get(idemgrpc.DefaultKeyMetadata), ",")
	fence, _ := idem.FenceFrom(ctx)
	s.mu.Lock()
	s.runs[key]++
	s.fences = append(s.fences, fence)
	s.mu.Unlock()
	select {
	case s.started <- struct{}{}:
	default:
	}
	v := in.GetValue()
	if c, ok := strings.CutPrefix(v, "fail:"); ok {
		n, err := strconv.Atoi(c)
		if err != nil {
			return nil, err
		}
		return nil, status.Error(codes.Code(n), "failed as asked")
	}
	if v == "block" {
		select {
		case <-s.release:
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	}
	_ = grpc.SetHeader(ctx, metadata.Pairs("x-charge-id", "ch-"+v))
	_ = grpc.SetTrailer(ctx, metadata.Pairs("x-checksum", "sum-"+v))
	return wrapperspb.String("charged " + v), nil
}

func (s *impl) runsOf(key string) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.runs[key]
}

func (s *impl) total() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	n := 0
	for _, r := range s.runs {
		n += r
	}
	return n
}

// serve starts a gRPC server with opts and the service on a loopback TCP
// port and returns its address.
func serve(t testing.TB, svc payments, opts ...grpc.ServerOption) string {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := grpc.NewServer(opts...)
	srv.RegisterService(&serviceDesc, svc)
	go srv.Serve(lis)
	t.Cleanup(srv.Stop)
	return lis.Addr().String()
}

func dial(t testing.TB, addr string, opts ...grpc.DialOption) *grpc.ClientConn {
	t.Helper()
	cc, err := grpc.NewClient(addr, append([]grpc.DialOption{grpc.WithTransportCredentials(insecure.NewCredentials())}, opts...)...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cc.Close() })
	return cc
}

func newServer(t testing.TB, store idem.Store, opts ...idemgrpc.Option) *idemgrpc.Server {
	t.Helper()
	if store == nil {
		var err error
		if store, err = memstore.New(); err != nil {
			t.Fatal(err)
		}
	}
	exec, err := idem.New(store)
	if err != nil {
		t.Fatal(err)
	}
	s, err := idemgrpc.New(exec, append([]idemgrpc.Option{idemgrpc.WithMethods(charge)}, opts...)...)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// call makes a unary call of method with value v and key (none if empty)
// and returns the reply, the header and trailer metadata and the error.
func call(t testing.TB, cc *grpc.ClientConn, method, key, v string) (*wrapperspb.StringValue, metadata.MD, metadata.MD, error) {
	t.Helper()
	ctx := t.Context()
	if key != "" {
		ctx = metadata.AppendToOutgoingContext(ctx, idemgrpc.DefaultKeyMetadata, key)
	}
	var header, trailer metadata.MD
	out := new(wrapperspb.StringValue)
	err := cc.Invoke(ctx, method, wrapperspb.String(v), out, grpc.Header(&header), grpc.Trailer(&trailer))
	return out, header, trailer, err
}

// downStore is a store whose acquisitions fail as an unreachable one's do.
type downStore struct{ idem.Store }

func (downStore) Acquire(context.Context, string, storekit.AcquireRequest) (storekit.Acquisition, error) {
	return storekit.Acquisition{}, errors.New("connection refused")
}

func wrapString(s string) *wrapperspb.StringValue { return wrapperspb.String(s) }

func mustStore(t testing.TB) idem.Store {
	t.Helper()
	s, err := memstore.New()
	if err != nil {
		t.Fatal(err)
	}
	return s
}

func mustExec(t testing.TB) *idem.Executor {
	t.Helper()
	e, err := idem.New(mustStore(t))
	if err != nil {
		t.Fatal(err)
	}
	return e
}
