package idemgrpc

import (
	"context"
	"time"

	"google.golang.org/grpc/codes"
)

// DefaultKeyMetadata is the metadata key that carries the idempotency key.
const DefaultKeyMetadata = "idempotency-key"

// ReplayedMetadata is the header metadata key set to "true" on a replayed
// response.
const ReplayedMetadata = "idempotent-replayed"

// DefaultWait is how long a call whose key is in progress waits for the
// first call to end, by default.
const DefaultWait = 10 * time.Second

// Decision is what a Policy decides for a handler's outcome.
type Decision uint8

const (
	// StoreResponse stores the outcome (the response, or the error's
	// status): a retry with the same key gets it replayed and the handler
	// does not run again.
	StoreResponse Decision = iota
	// ReleaseKey stores nothing and releases the key: a retry with the
	// same key runs the handler again.
	ReleaseKey
	// AbandonKey stores nothing and leaves the key in progress until its
	// lease expires (idem.Attempt.Abandon): the outcome is unknown, and
	// releasing could run the handler twice at once.
	AbandonKey
)

// Policy decides, from the full method name and the status code of the
// handler's outcome (codes.OK for a response), what becomes of the key.
// It must be safe for concurrent use.
type Policy func(fullMethod string, code codes.Code) Decision

// DefaultPolicy stores every outcome except those whose code says that the
// call was not processed and may be retried (Unavailable,
// ResourceExhausted, Aborted: the key is released) and those whose code
// says nothing of what happened (Canceled, DeadlineExceeded: the key is
// abandoned to its lease). Other errors (Internal, Unknown, …) are stored,
// because a server error may follow a side effect that a retry would
// repeat; the idemhttp package reasons the same way (idemhttp.DefaultPolicy).
func DefaultPolicy(_ string, code codes.Code) Decision {
	switch code {
	case codes.Unavailable, codes.ResourceExhausted, codes.Aborted:
		return ReleaseKey
	case codes.Canceled, codes.DeadlineExceeded:
		return AbandonKey
	}
	return StoreResponse
}

// Option configures a Server.
type Option func(*Server)

// WithMethods covers the unary methods named (full names,
// "/package.Service/Method"). A Server covers no method unless WithMethods
// or WithMethodFunc says so.
func WithMethods(fullMethods ...string) Option {
	return func(s *Server) {
		if s.methods == nil {
			s.methods = map[string]bool{}
		}
		for _, m := range fullMethods {
			s.methods[m] = true
		}
	}
}

// WithMethodFunc covers the unary methods for which covered returns true
// (in addition to those of WithMethods). It must be safe for concurrent
// use.
func WithMethodFunc(covered func(fullMethod string) bool) Option {
	return func(s *Server) { s.methodFunc = covered }
}

// WithKeyMetadata sets the metadata key (lower case) that carries the
// idempotency key. The default is DefaultKeyMetadata.
func WithKeyMetadata(name string) Option { return func(s *Server) { s.keyName = name } }

// WithKeyOptional lets a call of a covered method that carries no key run
// the handler without idempotency. By default such a call fails with
// InvalidArgument.
func WithKeyOptional(optional bool) Option { return func(s *Server) { s.keyOptional = optional } }

// WithPrincipal scopes keys by who calls: principal returns an identity
// (from the peer's certificate, from metadata …), and the same key sent by
// two principals names two records. An error from principal fails the
// call: with its own status if it has one, else Unauthenticated. The
// default is no principal: keys are scoped by method only.
func WithPrincipal(principal func(ctx context.Context) (string, error)) Option {
	return func(s *Server) { s.principal = principal }
}

// WithPolicy sets what becomes of the key after the handler returned. The
// default is DefaultPolicy.
func WithPolicy(p Policy) Option { return func(s *Server) { s.policy = p } }

// WithWait sets how long a call whose key is in progress (another call
// with the same key runs) waits for it to end, woken by the store's
// notifications (idem.WaitFor); then it gets the replay, or runs the
// handler if the first call released the key. A call still waiting after
// d, or at its own deadline, fails with Aborted and a RetryInfo. The
// default is DefaultWait; 0 fails at once.
func WithWait(d time.Duration) Option { return func(s *Server) { s.wait = d } }

// WithFailOpen makes a call run its handler without idempotency when the
// store cannot be reached (the acquire fails). By default such a call
// fails with Unavailable (fail closed), so that a handler never runs
// unprotected.
func WithFailOpen(open bool) Option { return func(s *Server) { s.failOpen = open } }
