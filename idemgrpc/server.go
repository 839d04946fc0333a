package idemgrpc

import (
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"strings"
	"sync"
	"time"

	"github.com/idemgo/idem"
	"github.com/idemgo/idem/adapterkit"
	"github.com/idemgo/idem/observe"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/protoadapt"
	"google.golang.org/protobuf/types/known/durationpb"
)

// Reasons of the google.rpc.ErrorInfo detail of the statuses a Server
// answers itself, in the domain ErrorDomain.
const (
	ErrorDomain          = "idem"
	ReasonInProgress     = "IDEMPOTENCY_KEY_IN_PROGRESS"
	ReasonReused         = "IDEMPOTENCY_KEY_REUSED"
	ReasonFailed         = "IDEMPOTENCY_KEY_FAILED"
	ReasonMissing        = "IDEMPOTENCY_KEY_MISSING"
	ReasonInvalid        = "IDEMPOTENCY_KEY_INVALID"
	ReasonOutcomeUnknown = "IDEMPOTENCY_OUTCOME_UNKNOWN"
	ReasonStore          = "IDEMPOTENCY_STORE_UNAVAILABLE"
	ReasonCorrupt        = "IDEMPOTENCY_RECORD_CORRUPT"
)

// Server makes the covered unary methods of a gRPC server idempotent: its
// UnaryServerInterceptor runs a call's handler at most once per key (the
// idempotency-key metadata) and replays its outcome to the retries. It is
// safe for concurrent use.
type Server struct {
	exec        *idem.Executor
	methods     map[string]bool
	methodFunc  func(fullMethod string) bool
	keyName     string
	keyOptional bool
	principal   func(ctx context.Context) (string, error)
	policy      Policy
	wait        time.Duration
	waitOpt     idem.CallOption // idem.WaitFor(wait), made once
	failOpen    bool
}

// New returns a Server that runs calls through exec. It returns an error
// wrapping idem.ErrInvalid for a nil Executor or an invalid option.
func New(exec *idem.Executor, opts ...Option) (*Server, error) {
	if exec == nil {
		return nil, fmt.Errorf("%w: idemgrpc: nil executor", idem.ErrInvalid)
	}
	s := &Server{exec: exec, keyName: DefaultKeyMetadata, policy: DefaultPolicy, wait: DefaultWait}
	for _, o := range opts {
		o(s)
	}
	s.keyName = strings.ToLower(s.keyName) // as metadata keys arrive
	s.waitOpt = idem.WaitFor(s.wait)
	switch {
	case s.keyName == "":
		return nil, fmt.Errorf("%w: idemgrpc: empty key metadata name", idem.ErrInvalid)
	case s.policy == nil:
		return nil, fmt.Errorf("%w: idemgrpc: nil policy", idem.ErrInvalid)
	case s.wait < 0:
		return nil, fmt.Errorf("%w: idemgrpc: wait %v is negative", idem.ErrInvalid, s.wait)
	}
	return s, nil
}

func (s *Server) covers(fullMethod string) bool {
	return s.methods[fullMethod] || (s.methodFunc != nil && s.methodFunc(fullMethod))
}

// UnaryServerInterceptor returns the interceptor to install with
// grpc.ChainUnaryInterceptor (or grpc.UnaryInterceptor). For a covered
// method it reads the key; a new key runs the handler with a context that
// carries the lease (idem.FenceFrom), a key already answered gets the
// stored response or status, with its header and trailer metadata and
// idempotent-replayed: true in the header (see the package documentation
// for the statuses it answers itself).
func (s *Server) UnaryServerInterceptor() grpc.UnaryServerInterceptor { return s.intercept }

// StreamServerInterceptor returns an interceptor that refuses, with
// Unimplemented, a stream of a covered method that carries an
// idempotency key: a stream's messages are not one outcome that a retry
// could be given again (see the package documentation). Other streams
// pass.
func (s *Server) StreamServerInterceptor() grpc.StreamServerInterceptor {
	return func(srv any, ss grpc.ServerStream, info *grpc.StreamServerInfo, handler grpc.StreamHandler) error {
		if s.covers(info.FullMethod) {
			if len(metadata.ValueFromIncomingContext(ss.Context(), s.keyName)) > 0 {
				return status.Errorf(codes.Unimplemented, "idemgrpc: %s is a stream: idempotency keys are supported on unary methods only", info.FullMethod)
			}
		}
		return handler(srv, ss)
	}
}

func (s *Server) intercept(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
	if !s.covers(info.FullMethod) {
		return handler(ctx, req)
	}
	// Only the key's values, not a copy of the whole metadata
	// (FromIncomingContext lowercases and copies every entry).
	ids := metadata.ValueFromIncomingContext(ctx, s.keyName)
	switch {
	case len(ids) == 0 && s.keyOptional:
		return handler(ctx, req)
	case len(ids) == 0:
		return nil, keyStatus(codes.InvalidArgument, ReasonMissing, s.keyName, "the call carries no "+s.keyName+" metadata").Err()
	case len(ids) > 1:
		return nil, keyStatus(codes.InvalidArgument, ReasonInvalid, s.keyName, "the call carries several "+s.keyName+" values").Err()
	}
	scope := info.FullMethod
	if s.principal != nil {
		p, err := s.principal(ctx)
		if err != nil {
			if st, ok := status.FromError(err); ok {
				return nil, st.Err()
			}
			return nil, status.Error(codes.Unauthenticated, err.Error())
		}
		sum := sha256.Sum256([]byte(p))
		scope += "\x00" + string(sum[:])
	}
	fp, err := fingerprint(info.FullMethod, req)
	if err != nil {
		return nil, err
	}
	key := idem.Key{Scope: scope, ID: ids[0], Kind: "grpc"}
	if err := key.Validate(); err != nil {
		return nil, keyStatus(codes.InvalidArgument, ReasonInvalid, s.keyName, err.Error()).Err()
	}
	actx, a, err := s.exec.Begin(ctx, key, fp, s.waitOpt)
	if err != nil {
		if s.failOpen && storeDown(err) {
			return handler(ctx, req)
		}
		return nil, s.statusOf(err)
	}
	if a.Replayed() {
		return replay(ctx, a.Value())
	}
	return s.run(ctx, actx, a, req, info, handler)
}

// fingerprint is SHA-256 over the full method name, a zero byte and the
// deterministic protobuf encoding of the request.
func fingerprint(fullMethod string, req any) (string, error) {
	m, ok := req.(proto.Message)
	if !ok {
		return "", status.Errorf(codes.Internal, "idemgrpc: the request of %s is a %T, not a protobuf message", fullMethod, req)
	}
	buf := getBuf()
	defer putBuf(buf)
	b := append(append((*buf)[:0], fullMethod...), 0)
	b, err := deterministic.MarshalAppend(b, m)
	if err != nil {
		return "", status.Errorf(codes.Internal, "idemgrpc: encoding the request: %v", err)
	}
	*buf = b
	sum := sha256.Sum256(b)
	return string(sum[:]), nil
}

var deterministic = proto.MarshalOptions{Deterministic: true}

// bufs holds the buffers that requests and responses are encoded into
// before they are hashed or copied into a record.
var bufs = sync.Pool{New: func() any { return new([]byte) }}

func getBuf() *[]byte { return bufs.Get().(*[]byte) }

// putBuf returns buf to the pool, unless it grew past 64 KiB: one large
// message must not keep its buffer alive in the pool.
func putBuf(buf *[]byte) {
	if cap(*buf) <= 64<<10 {
		bufs.Put(buf)
	}
}

// storeDown reports whether Begin failed because the store did not answer
// (not because of the key's state or the input).
func storeDown(err error) bool {
	for _, known := range []error{idem.ErrInProgress, idem.ErrMismatch, idem.ErrFailed, idem.ErrInvalid,
		idem.ErrCorruptResult, idem.ErrLeaseLost, context.Canceled, context.DeadlineExceeded} {
		if errors.Is(err, known) {
			return false
		}
	}
	return true
}

// run runs the handler on a new key and ends the attempt as the policy
// says.
func (s *Server) run(ctx, actx context.Context, a *idem.Attempt, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
	sctx := context.WithoutCancel(ctx)
	cs := &captureStream{inner: grpc.ServerTransportStreamFromContext(ctx)}
	ended := false
	defer func() {
		if !ended { // the handler panicked
			_ = a.Release(sctx)
		}
	}()
	resp, herr := handler(grpc.NewContextWithServerTransportStream(actx, cs), req)
	ended = true
	switch s.policy(info.FullMethod, status.Code(herr)) {
	case ReleaseKey:
		_ = a.Release(sctx)
		return resp, herr
	case AbandonKey:
		_ = a.Abandon(sctx, observe.Abandoned)
		return resp, herr
	}
	var o outcome
	o.header, o.trailer = cs.metadata()
	if herr != nil {
		o.status = status.Convert(herr).Proto()
	} else {
		m, ok := resp.(proto.Message)
		if !ok {
			// It ran; its response cannot be stored: a retry must not
			// run it again.
			a.SetLastTry() // FAILED whatever the failure policy
			_ = a.Fail(sctx, fmt.Errorf("idemgrpc: the response of %s is a %T, not a protobuf message", info.FullMethod, resp))
			return resp, herr
		}
		buf := getBuf()
		defer putBuf(buf)
		b, err := deterministic.MarshalAppend((*buf)[:0], m)
		if err != nil {
			a.SetLastTry() // FAILED whatever the failure policy
			_ = a.Fail(sctx, fmt.Errorf("idemgrpc: encoding the response: %w", err))
			return resp, herr
		}
		*buf = b
		o.typeName = string(m.ProtoReflect().Descriptor().FullName())
		o.message = b // copied by encode
	}
	blob, err := o.encode()
	if err != nil {
		a.SetLastTry() // FAILED whatever the failure policy
		_ = a.Fail(sctx, err)
		return resp, herr
	}
	switch err := a.Commit(sctx, blob); {
	case err == nil, errors.Is(err, idem.ErrResultTooLarge):
		// Too large: the key is FAILED, a retry gets FailedPrecondition;
		// this call has its answer.
		return resp, herr
	default:
		// The outcome was not recorded: the caller is not told a result
		// that a retry might not get.
		return nil, withDetails(status.New(codes.Unavailable, "idemgrpc: the call's outcome could not be recorded: "+err.Error()),
			&errdetails.ErrorInfo{Reason: ReasonOutcomeUnknown, Domain: ErrorDomain},
			&errdetails.RetryInfo{RetryDelay: durationpb.New(adapterkit.Lease(s.exec))}).Err()
	}
}

// replay answers with a stored outcome.
func replay(ctx context.Context, blob []byte) (any, error) {
	o, err := decodeOutcome(blob)
	if err != nil {
		return nil, corrupt(err)
	}
	// The decoded header is this call's own: the mark joins it there.
	if o.header == nil {
		o.header = make(metadata.MD, 1)
	}
	o.header[ReplayedMetadata] = append(o.header[ReplayedMetadata], "true")
	_ = grpc.SetHeader(ctx, o.header)
	if len(o.trailer) > 0 {
		_ = grpc.SetTrailer(ctx, o.trailer)
	}
	if o.status != nil {
		return nil, status.FromProto(o.status).Err()
	}
	m, err := o.response()
	if err != nil {
		return nil, corrupt(err)
	}
	return m, nil
}

func corrupt(err error) error {
	return withDetails(status.New(codes.Internal, err.Error()), &errdetails.ErrorInfo{Reason: ReasonCorrupt, Domain: ErrorDomain}).Err()
}

// statusOf maps an error of Begin to the status of the call.
func (s *Server) statusOf(err error) error {
	if ip, ok := errors.AsType[*idem.InProgressError](err); ok {
		return withDetails(status.New(codes.Aborted, "idemgrpc: a call with the same idempotency key is in progress; retry after the RetryInfo delay"),
			&errdetails.ErrorInfo{Reason: ReasonInProgress, Domain: ErrorDomain},
			&errdetails.RetryInfo{RetryDelay: durationpb.New(ip.RetryAfter)}).Err()
	}
	switch {
	case errors.Is(err, context.Canceled), errors.Is(err, context.DeadlineExceeded):
		return status.FromContextError(err).Err()
	case errors.Is(err, idem.ErrMismatch):
		return keyStatus(codes.FailedPrecondition, ReasonReused, s.keyName, "the idempotency key was already used for a different request; use a new key for a new request").Err()
	case errors.Is(err, idem.ErrFailed):
		return keyStatus(codes.FailedPrecondition, ReasonFailed, s.keyName, "a call with this idempotency key ran, but its outcome cannot be replayed; do not retry with this key").Err()
	case errors.Is(err, idem.ErrInvalid):
		return keyStatus(codes.InvalidArgument, ReasonInvalid, s.keyName, err.Error()).Err()
	case errors.Is(err, idem.ErrCorruptResult):
		return corrupt(err)
	case errors.Is(err, idem.ErrLeaseLost):
		return withDetails(status.New(codes.Unavailable, "idemgrpc: "+err.Error()),
			&errdetails.ErrorInfo{Reason: ReasonOutcomeUnknown, Domain: ErrorDomain},
			&errdetails.RetryInfo{RetryDelay: durationpb.New(adapterkit.Lease(s.exec))}).Err()
	}
	return withDetails(status.New(codes.Unavailable, "idemgrpc: the idempotency store is unavailable: "+err.Error()),
		&errdetails.ErrorInfo{Reason: ReasonStore, Domain: ErrorDomain},
		&errdetails.RetryInfo{RetryDelay: durationpb.New(time.Second)}).Err()
}

// keyStatus is a status about the idempotency key: an ErrorInfo, and a
// PreconditionFailure (FailedPrecondition) or a BadRequest
// (InvalidArgument) naming the metadata key.
func keyStatus(code codes.Code, reason, keyName, desc string) *status.Status {
	st := status.New(code, "idemgrpc: "+desc)
	info := &errdetails.ErrorInfo{Reason: reason, Domain: ErrorDomain}
	if code == codes.FailedPrecondition {
		return withDetails(st, info, &errdetails.PreconditionFailure{Violations: []*errdetails.PreconditionFailure_Violation{
			{Type: reason, Subject: keyName, Description: desc}}})
	}
	return withDetails(st, info, &errdetails.BadRequest{FieldViolations: []*errdetails.BadRequest_FieldViolation{
		{Field: keyName, Description: desc, Reason: reason}}})
}

func withDetails(st *status.Status, details ...protoadapt.MessageV1) *status.Status {
	if d, err := st.WithDetails(details...); err == nil {
		return d
	}
	return st
}

// captureStream records the header and trailer metadata a handler sets
// (grpc.SetHeader, grpc.SendHeader, grpc.SetTrailer), so that a replay
// sends them again, and passes them on.
type captureStream struct {
	inner   grpc.ServerTransportStream // nil when the handler is called directly
	mu      sync.Mutex
	header  metadata.MD
	trailer metadata.MD
}

func (c *captureStream) Method() string {
	if c.inner == nil {
		return ""
	}
	return c.inner.Method()
}

func (c *captureStream) SetHeader(md metadata.MD) error {
	c.mu.Lock()
	c.header = metadata.Join(c.header, md)
	c.mu.Unlock()
	if c.inner == nil {
		return nil
	}
	return c.inner.SetHeader(md)
}

func (c *captureStream) SendHeader(md metadata.MD) error {
	c.mu.Lock()
	c.header = metadata.Join(c.header, md)
	c.mu.Unlock()
	if c.inner == nil {
		return nil
	}
	return c.inner.SendHeader(md)
}

func (c *captureStream) SetTrailer(md metadata.MD) error {
	c.mu.Lock()
	c.trailer = metadata.Join(c.trailer, md)
	c.mu.Unlock()
	if c.inner == nil {
		return nil
	}
	return c.inner.SetTrailer(md)
}

func (c *captureStream) metadata() (header, trailer metadata.MD) {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.header, c.trailer
}
