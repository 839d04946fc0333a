package idemgrpc_test

import (
	"context"
	"fmt"
	"net"

	"github.com/idemgo/idem"
	"github.com/idemgo/idem/idemgrpc"
	"github.com/idemgo/idem/memstore"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/metadata"
)

// Example makes a server's method idempotent and calls it twice with one
// key: the second call is the first one's replay. The health service
// stands for your own.
func Example() {
	store, _ := memstore.New() // or redisstore.New(redisClient)
	exec, _ := idem.New(store)
	idemSrv, _ := idemgrpc.New(exec, idemgrpc.WithMethods("/grpc.health.v1.Health/Check"))
	srv := grpc.NewServer(grpc.ChainUnaryInterceptor(idemSrv.UnaryServerInterceptor()),
		grpc.ChainStreamInterceptor(idemSrv.StreamServerInterceptor()))
	healthpb.RegisterHealthServer(srv, health.NewServer())
	lis, _ := net.Listen("tcp", "127.0.0.1:0")
	go srv.Serve(lis)
	defer srv.Stop()

	cc, _ := grpc.NewClient(lis.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithUnaryInterceptor(idemgrpc.UnaryClientInterceptor())) // a key per call, kept by its retries
	defer cc.Close()
	ctx := idemgrpc.WithKey(context.Background(), "order-17") // or let the interceptor make one
	client := healthpb.NewHealthClient(cc)
	_, _ = client.Check(ctx, &healthpb.HealthCheckRequest{})
	var header metadata.MD
	_, err := client.Check(ctx, &healthpb.HealthCheckRequest{}, grpc.Header(&header))
	fmt.Println(err, header.Get(idemgrpc.ReplayedMetadata))
	// Output: <nil> [true]
}
