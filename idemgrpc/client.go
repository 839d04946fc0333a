package idemgrpc

import (
	"context"
	"crypto/rand"
	"encoding/base64"

	"google.golang.org/grpc"
	"google.golang.org/grpc/metadata"
)

type keyContext struct{}

// WithKey returns a context whose unary calls, through the interceptor of
// UnaryClientInterceptor, carry key as their idempotency key instead of a
// generated one: for a caller that keeps the key of an operation across
// its own retries (or across restarts).
func WithKey(ctx context.Context, key string) context.Context {
	return context.WithValue(ctx, keyContext{}, key)
}

// ClientOption configures UnaryClientInterceptor.
type ClientOption func(*client)

type client struct {
	keyName string
	covered func(fullMethod string) bool
}

// WithClientKeyMetadata sets the metadata key (lower case) that carries the
// idempotency key. The default is DefaultKeyMetadata.
func WithClientKeyMetadata(name string) ClientOption {
	return func(c *client) { c.keyName = name }
}

// WithClientMethodFunc sets the methods whose calls get a key. The default
// is every unary method (a server that does not cover a method ignores the
// key).
func WithClientMethodFunc(covered func(fullMethod string) bool) ClientOption {
	return func(c *client) { c.covered = covered }
}

// UnaryClientInterceptor returns an interceptor that gives every unary call
// one idempotency key, in its outgoing metadata: the key of WithKey, else
// the one the metadata already carries, else a new random one (128 bits).
// The key is set once per logical call, so the retries of the call carry
// the same key: those of the gRPC retry policy (the service config's
// retryPolicy, made below the interceptors) and those of an interceptor
// that retries, such as go-grpc-middleware's retry interceptor, provided
// this interceptor comes before it in the chain
// (grpc.WithChainUnaryInterceptor(idemgrpc.UnaryClientInterceptor(),
// retry.UnaryClientInterceptor(…))): an interceptor after it would run once
// per attempt.
func UnaryClientInterceptor(opts ...ClientOption) grpc.UnaryClientInterceptor {
	c := &client{keyName: DefaultKeyMetadata}
	for _, o := range opts {
		o(c)
	}
	return func(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
		if c.covered == nil || c.covered(method) {
			ctx = c.withKey(ctx)
		}
		return invoker(ctx, method, req, reply, cc, opts...)
	}
}

func (c *client) withKey(ctx context.Context) context.Context {
	key, _ := ctx.Value(keyContext{}).(string)
	md, _ := metadata.FromOutgoingContext(ctx)
	if have := md.Get(c.keyName); len(have) > 0 {
		if key == "" || have[0] == key {
			return ctx
		}
		md = md.Copy()
		md.Set(c.keyName, key)
		return metadata.NewOutgoingContext(ctx, md)
	}
	if key == "" {
		key = NewKey()
	}
	return metadata.AppendToOutgoingContext(ctx, c.keyName, key)
}

// NewKey returns a new random idempotency key: 128 bits, base64url.
func NewKey() string {
	var b [16]byte
	_, _ = rand.Read(b[:])
	return base64.RawURLEncoding.EncodeToString(b[:])
}
