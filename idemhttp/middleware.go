package idemhttp

import (
	"bytes"
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"net/http"
	"net/url"
	"os"
	"slices"
	"strings"
	"time"

	"github.com/idemgo/idem"
	"github.com/idemgo/idem/adapterkit"
	"github.com/idemgo/idem/internal/httpsyntax"
	"github.com/idemgo/idem/keysource"
	"github.com/idemgo/idem/observe"
)

// ErrHandlerPanicked is wrapped by Event.Err when the handler panicked; the
// key was released and the panic goes on.
var ErrHandlerPanicked = errors.New("idemhttp: handler panicked")

// ErrHijacked is wrapped by Event.Err when the handler hijacked the
// connection or answered 101 Switching Protocols; the key was released.
var ErrHijacked = errors.New("idemhttp: handler hijacked the connection")

// Middleware makes handlers (by default those of POST and PATCH requests)
// safe to retry with the Idempotency-Key field; see the package
// documentation. Create it with New. It is safe for concurrent use, and one
// Middleware may wrap many handlers.
type Middleware struct {
	exec *idem.Executor

	header         string           // the key's field, unless bodyKey is set
	bodyKey        keysource.Source // a source in the body, or zero
	zeroSource     bool             // WithKeySource was given the zero Source
	fp             keysource.Fingerprint
	verifier       Verifier
	verifierSet    bool
	required       bool
	methods        []string
	principal      func(*http.Request) string
	principalSet   bool
	emptyPrincipal bool
	bodies         *bodyBudget // nil: no bound
	durations      durations   // for the Retry-After of 409
	route          func(*http.Request) string
	routeSet       bool
	fpHeaders      []string
	canonicalJSON  bool
	maxBody        int64
	maxResponse    int
	wait           time.Duration
	waitSet        bool // WithWait was given
	policy         Policy
	deny           map[string]bool
	failOpen       bool
	streamOnFlush  bool
	streamAll      bool
	retryAfter     time.Duration
	logger         *slog.Logger
	hooks          []Hook
	errorHandler   ErrorHandler
	typeBase       string
}

// New returns a Middleware that runs requests through exec. It returns an
// error wrapping idem.ErrInvalid for a nil executor or an invalid option.
func New(exec *idem.Executor, opts ...Option) (*Middleware, error) {
	if exec == nil {
		return nil, fmt.Errorf("%w: idemhttp: nil executor", idem.ErrInvalid)
	}
	m := &Middleware{
		exec:          exec,
		header:        keysource.DefaultHeader,
		required:      true,
		methods:       []string{http.MethodPost, http.MethodPatch},
		maxBody:       DefaultMaxBodySize,
		maxResponse:   adapterkit.MaxResultSize(exec),
		policy:        DefaultPolicy,
		deny:          map[string]bool{"Set-Cookie": true},
		retryAfter:    defaultRetryAfter,
		streamOnFlush: true,
		errorHandler:  WriteProblem,
		typeBase:      DefaultProblemTypeBase,
	}
	for _, o := range opts {
		if o == nil {
			return nil, invalidf("nil option")
		}
		o(m)
	}
	if m.zeroSource {
		return nil, invalidf("zero key source")
	}
	if !httpsyntax.IsToken(m.header) {
		return nil, invalidf("invalid header name %q", m.header)
	}
	m.header = http.CanonicalHeaderKey(m.header)
	if len(m.methods) == 0 {
		return nil, invalidf("no methods")
	}
	for _, meth := range m.methods {
		if !httpsyntax.IsToken(meth) { // a method is a token, as a field name
			return nil, invalidf("invalid method %q", meth)
		}
	}
	for i, name := range m.fpHeaders {
		if !httpsyntax.IsToken(name) {
			return nil, invalidf("invalid fingerprint header name %q", name)
		}
		m.fpHeaders[i] = http.CanonicalHeaderKey(name)
	}
	for _, h := range m.hooks {
		if h == nil {
			return nil, invalidf("nil hook")
		}
	}
	switch {
	case m.principalSet && m.principal == nil:
		return nil, invalidf("nil principal function")
	case m.verifierSet && m.verifier == nil:
		return nil, invalidf("nil verifier")
	case m.routeSet && m.route == nil:
		return nil, invalidf("nil route function")
	case m.bodies != nil && m.bodies.max <= 0:
		return nil, invalidf("max buffered bodies %d is not positive", m.bodies.max)
	case m.maxBody <= 0:
		return nil, invalidf("max body size %d is not positive", m.maxBody)
	case m.maxResponse <= 0:
		return nil, invalidf("max response size %d is not positive", m.maxResponse)
	case m.wait < 0:
		return nil, invalidf("wait %v is negative", m.wait)
	case m.retryAfter <= 0:
		return nil, invalidf("retry-after %v is not positive", m.retryAfter)
	case m.policy == nil:
		return nil, invalidf("nil policy")
	case m.errorHandler == nil:
		return nil, invalidf("nil error handler")
	}
	if u, err := url.Parse(m.typeBase); err != nil || u.Scheme == "" {
		return nil, invalidf("problem type base %q is not an absolute URI", m.typeBase)
	}
	return m, nil
}

func invalidf(format string, args ...any) error {
	return fmt.Errorf("%w: idemhttp: "+format, append([]any{idem.ErrInvalid}, args...)...)
}

// Handler returns a handler that runs next at most once per key for the
// requests the middleware covers, and passes other requests to next
// untouched. It panics if next is nil, as http.Handle does.
//
// next runs with a request whose body was read already (it sees all of it)
// and whose context carries the attempt's lease: see idem.FenceFrom. The
// context is cancelled if the lease is lost.
func (m *Middleware) Handler(next http.Handler) http.Handler {
	if next == nil {
		panic("idemhttp: nil handler")
	}
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		method, ok := m.covered(r.Method)
		if !ok {
			if m.bodyKey.IsZero() && len(r.Header[m.header]) > 0 {
				// Say so, rather than let the client believe the request
				// is protected.
				w.Header().Set(IgnoredHeader, "true")
			}
			next.ServeHTTP(w, r)
			return
		}
		if method != r.Method {
			// "post" is POST: one scope, one fingerprint, and the handler
			// sees the method as configured.
			r = r.WithContext(r.Context())
			r.Method = method
		}
		m.serve(w, r, next)
	})
}

// covered returns the configured spelling of method if the middleware
// covers it. Methods are compared ignoring case: net/http accepts "post",
// and servers behind a proxy often take it for POST.
func (m *Middleware) covered(method string) (string, bool) {
	for _, c := range m.methods {
		if c == method || strings.EqualFold(c, method) {
			return c, true
		}
	}
	return "", false
}

func (m *Middleware) serve(w http.ResponseWriter, r *http.Request, next http.Handler) {
	start := time.Now()
	var id string
	if m.bodyKey.IsZero() {
		var ok bool
		if id, ok = m.headerKey(w, r, start, next); !ok {
			return
		}
	}

	var principal string
	if m.principal != nil {
		if principal = m.principal(r); principal == "" && !m.emptyPrincipal {
			m.problem(w, r, start, OutcomeRejected, &Problem{
				Type:   TypePrincipalMissing,
				Title:  "Client not identified",
				Status: http.StatusBadRequest,
				Detail: "Idempotency keys are kept per client, and this request does not say which client sent it (for example, it lacks its credentials).",
			})
			return
		}
	}

	body, fp, err := m.fingerprint(r)
	if err != nil {
		if errors.Is(err, errServerBusy) {
			w.Header().Set("Retry-After", retryAfterSeconds(m.retryAfter))
			m.log(r, slog.LevelWarn, "idemhttp: request bodies use all the memory allowed", nil, "")
			m.problem(w, r, start, OutcomeRejected, &Problem{
				Type:       TypeServerBusy,
				Title:      "Server busy",
				Status:     http.StatusServiceUnavailable,
				Detail:     "The server holds as many request bodies as it may. The request was not processed; retry with the same idempotency key after the time given by Retry-After.",
				RetryAfter: m.retryAfter,
				Err:        err,
			})
			return
		}
		if errors.Is(err, os.ErrDeadlineExceeded) {
			m.problem(w, r, start, OutcomeRejected, &Problem{
				Type:   TypeBodyTimeout,
				Title:  "Request body too slow",
				Status: http.StatusRequestTimeout,
				Detail: "The request body did not arrive in time. The request was not processed; retry with the same idempotency key.",
				Err:    err,
			})
			return
		}
		var mbe *http.MaxBytesError
		if errors.Is(err, errBodyTooLarge) || errors.As(err, &mbe) {
			m.problem(w, r, start, OutcomeRejected, &Problem{
				Type:   TypeBodyTooLarge,
				Title:  "Request body too large",
				Status: http.StatusRequestEntityTooLarge,
				Detail: fmt.Sprintf("The request body is over the limit of %d bytes.", m.maxBody),
				Err:    err,
			})
			return
		}
		m.problem(w, r, start, OutcomeRejected, &Problem{
			Type:   TypeBodyUnreadable,
			Title:  "Request body unreadable",
			Status: http.StatusBadRequest,
			Detail: "The request body could not be read.",
			Err:    err,
		})
		return
	}

	defer m.bodies.release(cap(body))

	if m.verifier != nil {
		if err := m.verifier.Verify(r.Header.Values, body); err != nil {
			m.problem(w, r, start, OutcomeRejected, &Problem{
				Type:   TypeSignatureInvalid,
				Title:  "Signature invalid",
				Status: http.StatusUnauthorized,
				Detail: "The request's signature is missing, wrong or too old; it was not processed.",
				Err:    err,
			})
			return
		}
	}
	if !m.bodyKey.IsZero() {
		var ok bool
		if id, ok = m.keyFromBody(w, r, start, body, next); !ok {
			return
		}
	}

	key := idem.Key{Scope: m.scopeOf(r, principal), ID: id, Kind: "http"}
	var ctx context.Context
	var a *idem.Attempt
	if m.waitSet {
		// The wait is counted from the request's start; the Executor's
		// waiting loop (idem.WaitFor) does the rest.
		ctx, a, err = m.exec.Begin(r.Context(), key, fp, idem.WaitFor(max(m.wait-time.Since(start), 0)))
	} else {
		ctx, a, err = m.exec.Begin(r.Context(), key, fp)
	}
	route := m.routeOf(key.Scope)
	switch {
	case err != nil:
		m.fail(w, r, start, m.estimateRetry(route, err), body, next)
	case a.Replayed():
		m.replay(w, r, start, a.Value())
	default:
		began := time.Now()
		m.execute(w, r, start, ctx, a, body, next)
		m.durations.observe(route, time.Since(began))
	}
}

// headerKey returns the key of a request whose key is in a header field,
// or answers the request (an error, or next without a key) and returns
// false.
func (m *Middleware) headerKey(w http.ResponseWriter, r *http.Request, start time.Time, next http.Handler) (string, bool) {
	vals := r.Header[m.header]
	if len(vals) == 0 {
		if !m.required {
			next.ServeHTTP(w, r)
			m.emit(r, Event{Outcome: OutcomeNoKey, Duration: time.Since(start)})
			return "", false
		}
		m.problem(w, r, start, OutcomeRejected, &Problem{
			Type:   TypeKeyMissing,
			Title:  "Idempotency key missing",
			Status: http.StatusBadRequest,
			Detail: fmt.Sprintf("%s requests to this resource need an %s header field.", r.Method, m.header),
		})
		return "", false
	}
	if len(vals) > 1 {
		m.problem(w, r, start, OutcomeRejected, &Problem{
			Type:   TypeKeyInvalid,
			Title:  "Invalid idempotency key",
			Status: http.StatusBadRequest,
			Detail: fmt.Sprintf("The %s header field appears %d times; send it once.", m.header, len(vals)),
		})
		return "", false
	}
	id, err := ParseKey(vals[0])
	if err != nil {
		m.problem(w, r, start, OutcomeRejected, &Problem{
			Type:   TypeKeyInvalid,
			Title:  "Invalid idempotency key",
			Status: http.StatusBadRequest,
			Detail: fmt.Sprintf("The %s header field is invalid: %s.", m.header, strings.TrimPrefix(err.Error(), ErrInvalidKey.Error()+": ")),
			Err:    err,
		})
		return "", false
	}
	return id, true
}

// keyFromBody returns the key of a request whose key is in its body, or
// answers the request (an error, or next without a key) and returns false.
func (m *Middleware) keyFromBody(w http.ResponseWriter, r *http.Request, start time.Time, body []byte, next http.Handler) (string, bool) {
	id, err := m.bodyKey.Key(nil, body)
	switch {
	case err == nil:
		return id, true
	case errors.Is(err, keysource.ErrNoKey) && !m.required:
		r2 := r.WithContext(r.Context())
		r2.Body = newBodyReader(body)
		next.ServeHTTP(w, r2)
		m.emit(r, Event{Outcome: OutcomeNoKey, Duration: time.Since(start)})
	case errors.Is(err, keysource.ErrNoKey):
		m.problem(w, r, start, OutcomeRejected, &Problem{
			Type:   TypeKeyMissing,
			Title:  "Idempotency key missing",
			Status: http.StatusBadRequest,
			Detail: fmt.Sprintf("%s requests to this resource need a JSON body with the idempotency key at %s: %s.", r.Method, strings.TrimPrefix(m.bodyKey.String(), "json:"), keyErrorText(err)),
			Err:    err,
		})
	default:
		m.problem(w, r, start, OutcomeRejected, &Problem{
			Type:   TypeKeyInvalid,
			Title:  "Invalid idempotency key",
			Status: http.StatusBadRequest,
			Detail: fmt.Sprintf("The idempotency key of the body is invalid: %s.", keyErrorText(err)),
			Err:    err,
		})
	}
	return "", false
}

// keyErrorText is the text of an error of keysource without its prefix.
func keyErrorText(err error) string {
	s := err.Error()
	for _, e := range []error{keysource.ErrNoKey, keysource.ErrInvalidKey} {
		s = strings.TrimPrefix(s, e.Error()+": ")
	}
	return s
}

// scope returns the scope of the request's key: the method, the route and,
// with a principal function, the SHA-256 of the principal. The principal's
// digest has a fixed length and comes last, so no two (route, principal)
// pairs share a scope.
func (m *Middleware) scope(r *http.Request) string {
	var principal string
	if m.principal != nil {
		principal = m.principal(r)
	}
	return m.scopeOf(r, principal)
}

// scopeOf is scope with the principal that the principal function returned
// for r.
func (m *Middleware) scopeOf(r *http.Request, principal string) string {
	var route string
	var kind byte
	switch {
	case m.route != nil:
		kind, route = 'r', m.route(r)
	case r.Pattern != "":
		kind, route = 'p', r.Pattern
	default:
		kind, route = 'u', r.URL.Path
	}
	var stack [256]byte
	b := appendScope(stack[:0], r.Method, kind, route)
	if m.principal != nil {
		b = appendPrincipal(b, principal)
	}
	return string(b)
}

// appendScope appends the method and route part of a scope: kind says
// where the route comes from ('r' a route function, 'p' a ServeMux
// pattern, 'u' the URL path).
func appendScope(b []byte, method string, kind byte, route string) []byte {
	b = append(b, method...)
	b = append(b, ' ', kind, ':')
	return append(b, route...)
}

// appendPrincipal appends the principal part of a scope.
// principalLen is the length of the principal part of a scope.
const principalLen = 1 + sha256.Size

func appendPrincipal(b []byte, principal string) []byte {
	sum := sha256.Sum256([]byte(principal))
	b = append(b, 0)
	return append(b, sum[:]...)
}

// PathKey returns the key under which a Middleware keeps the record of a
// request whose Idempotency-Key is id (as ParseKey returns it), when the
// scope's route is the URL path: the middleware has no route function
// (WithRoute) and no ServeMux pattern routed the request, as for the
// requests of a reverse proxy. It is for a middleware without WithPrincipal;
// see PrincipalPathKey. The key's Digest is the store key. Tools use it to
// find a request's record (the idem binary's get and rm commands).
func PathKey(method, path, id string) idem.Key {
	return idem.Key{Scope: string(appendScope(nil, method, 'u', path)), ID: id}
}

// PrincipalPathKey is PathKey for a Middleware with a principal function
// (WithPrincipal): principal is what that function returns for the request.
func PrincipalPathKey(method, path, principal, id string) idem.Key {
	return idem.Key{Scope: string(appendPrincipal(appendScope(nil, method, 'u', path), principal)), ID: id}
}

// fail answers a request for which Begin failed.
func (m *Middleware) fail(w http.ResponseWriter, r *http.Request, start time.Time, err error, body []byte, next http.Handler) {
	if ip, ok := errors.AsType[*idem.InProgressError](err); ok {
		w.Header().Set("Retry-After", retryAfterSeconds(ip.RetryAfter))
		m.problem(w, r, start, OutcomeConflict, &Problem{
			Type:       TypeInProgress,
			Title:      "Request in progress",
			Status:     http.StatusConflict,
			Detail:     "A request with the same idempotency key is being processed. Retry after the time given by Retry-After.",
			RetryAfter: ip.RetryAfter,
			Err:        err,
		})
		return
	}
	switch {
	case errors.Is(err, idem.ErrMismatch):
		m.problem(w, r, start, OutcomeMismatch, &Problem{
			Type:   TypeKeyMismatch,
			Title:  "Idempotency key reused",
			Status: http.StatusUnprocessableEntity,
			Detail: "The idempotency key was already used for a different request (method, path, query or body). Use a new key for a new request.",
			Err:    err,
		})
	case errors.Is(err, idem.ErrFailed):
		m.problem(w, r, start, OutcomeFailed, &Problem{
			Type:   TypeKeyFailed,
			Title:  "Idempotent request failed",
			Status: http.StatusUnprocessableEntity,
			Detail: "A request with this idempotency key was processed, but its response cannot be replayed. Do not retry with this key.",
			Err:    err,
		})
	case errors.Is(err, idem.ErrCorruptResult):
		m.log(r, slog.LevelError, "idemhttp: stored response cannot be decoded", err, "")
		m.problem(w, r, start, OutcomeStoreError, &Problem{
			Type:   TypeStoredResponseCorrupt,
			Title:  "Stored response unreadable",
			Status: http.StatusInternalServerError,
			Detail: "The stored response for this idempotency key cannot be read.",
			Err:    err,
		})
	case errors.Is(err, idem.ErrInvalid):
		m.log(r, slog.LevelError, "idemhttp: input rejected", err, "")
		m.problem(w, r, start, OutcomeStoreError, &Problem{
			Type:   TypeInternal,
			Title:  "Internal error",
			Status: http.StatusInternalServerError,
			Err:    err,
		})
	case m.failOpen && r.Context().Err() == nil:
		m.log(r, slog.LevelWarn, "idemhttp: store unavailable, running the handler without idempotency protection", err, "")
		r2 := r.WithContext(r.Context())
		r2.Body = newBodyReader(body)
		next.ServeHTTP(w, r2)
		m.emit(r, Event{Outcome: OutcomeFailedOpen, Duration: time.Since(start), Err: err})
	default:
		if r.Context().Err() == nil {
			m.log(r, slog.LevelWarn, "idemhttp: store unavailable", err, "")
		}
		w.Header().Set("Retry-After", retryAfterSeconds(m.retryAfter))
		m.problem(w, r, start, OutcomeStoreError, &Problem{
			Type:       TypeStoreUnavailable,
			Title:      "Idempotency store unavailable",
			Status:     http.StatusServiceUnavailable,
			Detail:     "The request could not be checked for duplicates, so it was not processed. Retry with the same idempotency key.",
			RetryAfter: m.retryAfter,
			Err:        err,
		})
	}
}

// replay writes a stored response.
func (m *Middleware) replay(w http.ResponseWriter, r *http.Request, start time.Time, blob []byte) {
	h := w.Header()
	res, err := decodeResponse(blob, h)
	if err != nil {
		m.fail(w, r, start, err, nil, nil)
		return
	}
	h.Set(ReplayedHeader, "true")
	if res.trailer != nil {
		startTrailers(h, res.trailer)
	}
	w.WriteHeader(res.status)
	if len(res.body) > 0 {
		_, _ = w.Write(res.body)
	}
	// net/http sends the announced trailers, with the values the map has
	// when the handler returns.
	for k, vs := range res.trailer {
		if !strings.HasPrefix(k, http.TrailerPrefix) {
			h[k] = vs
		}
	}
	m.emit(r, Event{Outcome: OutcomeReplayed, Status: res.status, Duration: time.Since(start)})
}

// startTrailers prepares h, before the header is written, for the replay
// of trailer: the names that were announced when the response was stored
// (those without http.TrailerPrefix) go into the Trailer field, and the
// others are set as they are, with http.TrailerPrefix. Either way
// net/http sends them after the body, as trailers, and does not send the
// body with a Content-Length (which would leave no room for them) on
// HTTP/1.1.
func startTrailers(h, trailer http.Header) {
	var names []string
	for k, vs := range trailer {
		if strings.HasPrefix(k, http.TrailerPrefix) {
			h[k] = vs
		} else {
			names = append(names, k)
		}
	}
	if len(names) > 0 {
		slices.Sort(names)
		h["Trailer"] = []string{strings.Join(names, ", ")}
	}
}

// execute runs next with the key held, then stores the response or
// releases the key. A response that is held back (see captureWriter) is
// sent only once that is done, so that a client is never told a success
// that was not recorded.
func (m *Middleware) execute(w http.ResponseWriter, r *http.Request, start time.Time, ctx context.Context, a *idem.Attempt, body []byte, next http.Handler) {
	// One allocation for the writer and the body.
	x := &struct {
		cw   captureWriter
		body bodyReader
		rctx recorderCtx
	}{cw: captureWriter{w: w, m: m}}
	cw := &x.cw
	x.body.Reset(body)
	x.rctx.Context = ctx
	r2 := r.WithContext(&x.rctx)
	r2.Body = &x.body
	// The fields set before the handler ran (by outer middleware), for an
	// error response that replaces the handler's.
	var before http.Header
	if h := w.Header(); len(h) > 0 {
		before = h.Clone()
	}
	// The store calls after the handler must not fail because the client
	// went away, or the key would stay IN_PROGRESS until its lease expires.
	// They are bounded by the store client's own timeouts.
	sctx := context.WithoutCancel(r.Context())
	done := false
	defer func() {
		if done {
			return
		}
		// The handler panicked (or called runtime.Goexit): release the key
		// and let the panic go on, with its stack, to net/http, which
		// aborts the response (see http.ErrAbortHandler). A held response
		// is dropped.
		discard(sctx, &x.rctx)
		err := a.Release(sctx)
		m.log(r, slog.LevelWarn, "idemhttp: handler panicked; key released", err, a.Key())
		m.emit(r, Event{Outcome: OutcomeReleased, Status: cw.status, Duration: time.Since(start), Err: errors.Join(ErrHandlerPanicked, err)})
	}()
	next.ServeHTTP(cw, r2)
	done = true

	status := cw.finish()
	if cw.hijacked || status < 200 {
		discard(sctx, &x.rctx)
		// A hijacked connection, or 101 Switching Protocols: what was sent
		// is unknown, and cannot be replayed.
		err := errors.Join(ErrHijacked, a.Release(sctx))
		m.emit(r, Event{Outcome: OutcomeReleased, Status: status, Duration: time.Since(start), Err: err})
		return
	}
	decision := m.policy(r, status)
	rec := x.rctx.rec
	// Over the Executor's limit, the response cannot be stored either.
	tooLarge := cw.overflow || len(cw.buf) > adapterkit.MaxResultSize(m.exec)
	if rec != nil && (tooLarge || decision != StoreResponse) {
		discard(sctx, &x.rctx) // the response is not stored: neither is the effect
		rec = nil
	}
	var err error
	switch {
	case decision == ReleaseKey:
		if err = a.Release(sctx); err != nil {
			m.log(r, slog.LevelError, "idemhttp: releasing the key", err, a.Key())
		}
		cw.end()
		m.emit(r, Event{Outcome: OutcomeReleased, Status: status, Duration: time.Since(start), Err: err})
		return
	case decision == AbandonKey:
		err = a.Abandon(sctx, observe.Abandoned)
		m.log(r, slog.LevelWarn, "idemhttp: outcome unknown; the key stays in progress until its lease expires", err, a.Key())
		cw.end()
		m.emit(r, Event{Outcome: OutcomeAbandoned, Status: status, Duration: time.Since(start), Err: err})
		return
	case tooLarge:
		// The handler ran: the key is FAILED, so that a retry does not
		// run it again, and the client gets the response once.
		err = fmt.Errorf("%w: response body over %d bytes", idem.ErrResultTooLarge, m.maxResponse)
		if !cw.overflow {
			err = fmt.Errorf("%w: response of %d bytes as stored, over the limit of %d", idem.ErrResultTooLarge, len(cw.buf), adapterkit.MaxResultSize(m.exec))
		}
		a.SetLastTry() // FAILED whatever the failure policy
		if ferr := a.Fail(sctx, err); ferr != nil {
			err = errors.Join(err, ferr)
			if !cw.sent {
				m.notRecorded(w, r, start, a, before, status, err)
				return
			}
			if !m.streamAll {
				m.cutOff(r, start, a, status, "idemhttp: response over the size limit, and the key could not be marked FAILED; the connection is aborted before the end of the response, and the key stays in progress until its lease ends", err)
			}
			m.log(r, slog.LevelError, "idemhttp: response over the size limit, and the key could not be marked FAILED; the key stays in progress until its lease ends", err, a.Key())
			break
		}
		m.log(r, slog.LevelWarn, "idemhttp: response not stored; the key is FAILED", err, a.Key())
		cw.end()
	case rec != nil:
		m.record(w, r, start, a, rec, cw, before, status)
		return
	case cw.sent:
		// A stream: the client has all of it but its end.
		if err = a.Commit(sctx, cw.buf); err != nil {
			if !m.streamAll {
				m.cutOff(r, start, a, status, "idemhttp: streamed response not recorded; the connection is aborted before the end of the response, and the key stays in progress until its lease ends", err)
			}
			m.log(r, slog.LevelError, "idemhttp: streamed response not recorded; the client got it whole (httpkit.StreamAll), and the key stays in progress until its lease ends", err, a.Key())
			break
		}
		cw.end()
	default:
		if err = a.Commit(sctx, cw.buf); err != nil {
			m.notRecorded(w, r, start, a, before, status, err)
			return
		}
		cw.end()
	}
	m.emit(r, Event{Outcome: OutcomeExecuted, Status: status, Duration: time.Since(start), Err: err})
}

// cutOff ends a stream whose record could not be written: its client has
// the status and all of the body but its end, which it must not get, or
// it would take the response for a whole one while a retry runs the
// handler again. It logs msg and err at ERROR, reports OutcomeNotRecorded
// and aborts the response by panicking with http.ErrAbortHandler:
// net/http then closes an HTTP/1.x connection without the terminating
// chunk (or the withheld last byte of a body of declared length), and
// resets an HTTP/2 stream (RST_STREAM), so that the client sees an
// incomplete response.
func (m *Middleware) cutOff(r *http.Request, start time.Time, a *idem.Attempt, status int, msg string, err error) {
	m.log(r, slog.LevelError, msg, err, a.Key())
	m.emit(r, Event{Outcome: OutcomeNotRecorded, Status: status, Duration: time.Since(start), Err: err})
	panic(http.ErrAbortHandler)
}

// discard rolls back the effect of a request's recorder, if it has one.
func discard(ctx context.Context, c *recorderCtx) {
	if c.rec != nil {
		c.rec.Discard(ctx)
		c.rec = nil
	}
}

// record stores the response of a handler that set a Recorder: the
// recorder commits its effect with the response and ends the attempt; the
// client then gets the response, or the one an earlier run recorded.
func (m *Middleware) record(w http.ResponseWriter, r *http.Request, start time.Time, a *idem.Attempt, rec Recorder, cw *captureWriter, before http.Header, status int) {
	stored, err := rec.Record(context.WithoutCancel(r.Context()), cw.buf)
	switch {
	case err != nil:
		if cw.sent && !m.streamAll {
			m.cutOff(r, start, a, status, "idemhttp: streamed response not recorded; the connection is aborted before the end of the response", err)
		}
		if cw.sent {
			m.log(r, slog.LevelError, "idemhttp: streamed response not recorded; the client got it whole (httpkit.StreamAll)", err, a.Key())
			m.emit(r, Event{Outcome: OutcomeExecuted, Status: status, Duration: time.Since(start), Err: err})
			return
		}
		m.notRecorded(w, r, start, a, before, status, err)
	case stored != nil && cw.sent:
		if !m.streamAll {
			m.cutOff(r, start, a, status, "idemhttp: a streamed response was rolled back, another run's response was recorded first; the connection is aborted before the end of the response, so that a retry gets the recorded one", errStreamRolledBack)
		}
		m.log(r, slog.LevelError, "idemhttp: a streamed response was rolled back: another run's response was recorded first", nil, a.Key())
		m.emit(r, Event{Outcome: OutcomeReplayed, Status: status, Duration: time.Since(start)})
	case stored != nil:
		// Another run's effect committed first: this one was rolled back,
		// and the client gets that run's response.
		h := w.Header()
		clear(h)
		maps.Copy(h, before)
		m.replay(w, r, start, stored)
	default:
		cw.end()
		m.emit(r, Event{Outcome: OutcomeExecuted, Status: status, Duration: time.Since(start)})
	}
}

// errStreamRolledBack is the Event.Err of a stream whose Recorder rolled
// it back because another run's response was recorded first.
var errStreamRolledBack = errors.New("idemhttp: streamed response rolled back: another run's response was recorded first")

// notRecorded answers a request whose handler ran but whose response could
// not be stored (Commit failed after repeating the completion while the
// store allowed): the client is told that the outcome is unknown instead of
// getting the response, and the key is left IN_PROGRESS until its lease
// ends, so that a retry before then gets 409 and not a second run.
func (m *Middleware) notRecorded(w http.ResponseWriter, r *http.Request, start time.Time, a *idem.Attempt, before http.Header, status int, err error) {
	m.log(r, slog.LevelError, "idemhttp: response not recorded; the client is told the outcome is unknown", errors.Join(fmt.Errorf("handler answered %d", status), err), a.Key())
	h := w.Header()
	clear(h)
	maps.Copy(h, before)
	retry := max(time.Until(a.LeaseDeadline()), time.Second)
	h.Set("Retry-After", retryAfterSeconds(retry))
	m.WriteError(w, r, &Problem{
		Type:       TypeOutcomeUnknown,
		Title:      "Outcome unknown",
		Status:     http.StatusServiceUnavailable,
		Detail:     "The request was processed, but its response could not be recorded, so it may have taken effect. Retry with the same idempotency key after the time given by Retry-After: the retry gets the response if it was recorded by then, or runs the request again if not.",
		RetryAfter: retry,
		Err:        err,
	})
	m.emit(r, Event{Outcome: OutcomeNotRecorded, Status: http.StatusServiceUnavailable, Duration: time.Since(start), Err: err})
}

// WriteError writes the error response p as the middleware writes its
// own: with its error handler (WithErrorHandler), and with the problem
// type base it was given (WithProblemTypeBase) in place of
// DefaultProblemTypeBase in p.Type. It is for a handler, or a proxy, that
// answers errors of its own in the same shape; it may change p.
func (m *Middleware) WriteError(w http.ResponseWriter, r *http.Request, p *Problem) {
	p.Type = rebase(p.Type, m.typeBase)
	m.errorHandler(w, r, p)
}

// problem writes an error response through the error handler and reports
// the outcome.
func (m *Middleware) problem(w http.ResponseWriter, r *http.Request, start time.Time, o Outcome, p *Problem) {
	m.WriteError(w, r, p)
	m.emit(r, Event{Outcome: o, Status: p.Status, Duration: time.Since(start), Err: p.Err})
}

func (m *Middleware) emit(r *http.Request, e Event) {
	for _, h := range m.hooks {
		h(r, e)
	}
}

func (m *Middleware) log(r *http.Request, level slog.Level, msg string, err error, storeKey string) {
	if m.logger == nil || !m.logger.Enabled(r.Context(), level) {
		return
	}
	attrs := []slog.Attr{slog.String("method", r.Method), slog.String("path", r.URL.Path)}
	if storeKey != "" {
		attrs = append(attrs, slog.String("store_key", storeKey))
	}
	if err != nil {
		attrs = append(attrs, slog.Any("error", err))
	}
	m.logger.LogAttrs(context.WithoutCancel(r.Context()), level, msg, attrs...)
}

// bodyReader is the request body the handler reads: the bytes the middleware
// read already.
type bodyReader struct{ bytes.Reader }

func newBodyReader(b []byte) *bodyReader {
	br := &bodyReader{}
	br.Reset(b)
	return br
}

func (*bodyReader) Close() error { return nil }
