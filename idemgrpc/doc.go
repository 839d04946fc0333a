// Package idemgrpc makes unary gRPC methods idempotent: a server
// interceptor runs a call's handler at most once per idempotency key and
// replays its outcome to the retries, and a client interceptor gives each
// call one key that all its retries carry.
//
//	exec, _ := idem.New(store)
//	idemSrv, _ := idemgrpc.New(exec, idemgrpc.WithMethods("/payments.v1.Payments/Charge"))
//	srv := grpc.NewServer(grpc.ChainUnaryInterceptor(idemSrv.UnaryServerInterceptor()),
//		grpc.ChainStreamInterceptor(idemSrv.StreamServerInterceptor()))
//
//	cc, _ := grpc.NewClient(addr, creds, grpc.WithUnaryInterceptor(idemgrpc.UnaryClientInterceptor()))
//
// # Server
//
// A Server covers the methods of WithMethods and WithMethodFunc, and no
// method by default. For a call of a covered method it reads the key from
// the idempotency-key metadata (WithKeyMetadata), scopes it by the full
// method name and the principal (WithPrincipal), and fingerprints the call
// with the full method name and the deterministic protobuf encoding of the
// request (requests and responses must be protobuf messages of generated
// types). Then, with idem.Executor.Begin:
//
//   - a new key runs the handler with a context that carries the lease
//     (idem.FenceFrom); its response, or its error's status, is stored with
//     the header and trailer metadata the handler set, or the key is
//     released or abandoned, as the Policy says (DefaultPolicy: Unavailable,
//     ResourceExhausted and Aborted release, Canceled and DeadlineExceeded
//     abandon to the lease, every other outcome is stored);
//   - a key already answered gets the stored response or status, the
//     stored header and trailer metadata, and idempotent-replayed: true in
//     the header metadata; the handler does not run;
//   - a key in progress waits up to WithWait (DefaultWait, and never past
//     the call's deadline) for the first call to end, woken by the store's
//     notifications (idem.WaitFor), and then gets its replay or runs.
//
// The statuses the Server answers itself carry a google.rpc.ErrorInfo in
// ErrorDomain with a Reason* constant:
//
//   - in progress after the wait: Aborted, with a RetryInfo (the lease
//     left);
//   - key reused with another request: FailedPrecondition, with a
//     PreconditionFailure naming the metadata key. Not InvalidArgument:
//     the request is valid on its own, and is refused because of the
//     state of the key (what FailedPrecondition means); a client must not
//     retry it unchanged, which both codes say, but it may send it with a
//     new key;
//   - a key whose call ran but whose outcome cannot be replayed (a response
//     over the size limit, attempts exhausted): FailedPrecondition;
//   - no key, several, or an invalid one: InvalidArgument, with a
//     BadRequest;
//   - the store unreachable: Unavailable with a RetryInfo (fail closed),
//     or the handler runs unprotected with WithFailOpen;
//   - the outcome unknown (it ran, and could not be recorded; the lease
//     was lost): Unavailable with a RetryInfo of one lease;
//   - a stored outcome that cannot be decoded: Internal.
//
// # Client
//
// UnaryClientInterceptor sets the key once per logical call, so the
// retries of the gRPC retry policy (made below the interceptors) carry it,
// and so do those of go-grpc-middleware's retry interceptor when it comes
// after this one in the chain. WithKey sets the key of a call.
//
// # Streams
//
// Streams are not covered: StreamServerInterceptor refuses, with
// Unimplemented, a stream of a covered method that carries a key. A
// replayed stream has no well-defined meaning: a stream's outcome is the
// sequence of messages both sides sent, interleaved, and a retry sends its
// own messages again; storing and replaying the server's half would answer
// messages the retry may not send. For a client stream that ends in one
// response, make the operation a unary method (the client sends the whole
// request), or let the stream upload to a staging area and commit with a
// unary call that carries the key.
package idemgrpc
