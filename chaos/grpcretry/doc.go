// Package grpcretry is a reliability scenario of gRPC: a grpc-go client
// with a retry policy (the service config's retryPolicy, on Unavailable)
// calls a grpc-go server through a TCP proxy that resets the connection
// in place of 30% of the server's writes that carry responses
// (chaostest.ResetProxy; a reset loses every response in flight on the
// connection): the server ran the calls, the client gets Unavailable and
// retries each with the same idempotency key (the idemgrpc client
// interceptor). With the idemgrpc server interceptor, and with
// `idem proxy --h2c --upstream-h2c` in front of a server without it, no
// key runs twice; the control, a server without either, runs keys twice.
//
//	make chaos RUN=TestGRPCRetries
//	make chaos-long RUN=TestGRPCRetries   # 5,000 calls
package grpcretry
