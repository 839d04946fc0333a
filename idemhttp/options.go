package idemhttp

import (
	"log/slog"
	"net/http"
	"time"

	"github.com/idemgo/idem/keysource"
)

// Defaults of the options.
const (
	// ReplayedHeader is added, with the value "true", to replayed
	// responses.
	ReplayedHeader = "Idempotent-Replayed"
	// IgnoredHeader is added, with the value "true", to the response to a
	// request that carries the key field but whose method the middleware
	// does not cover (see WithMethods): the request was passed to the
	// handler without protection, and a retry may run it again.
	IgnoredHeader = "Idempotency-Key-Ignored"
	// DefaultMaxBodySize is the largest request body read: 1 MiB.
	DefaultMaxBodySize = 1 << 20
)

// defaultRetryAfter is the Retry-After of 503 responses when the store is
// unreachable or the server is busy (WithRetryAfter).
const defaultRetryAfter = time.Second

// Option configures a Middleware.
type Option func(*Middleware)

// WithHeader sets the name of the field that carries the key. The default
// is keysource.DefaultHeader, "Idempotency-Key". It is WithKeySource with the source
// header:name.
func WithHeader(name string) Option {
	return func(m *Middleware) { m.header, m.bodyKey, m.zeroSource = name, keysource.Source{}, false }
}

// WithKeySource sets where the key is: a header field (header:NAME, as
// WithHeader) or a member of a JSON body (json:POINTER, for example
// json:/id for a Stripe event); see package keysource. A key taken from
// the body is scoped as any other (method, route, principal). A request
// whose body is not JSON or lacks the member, or holds null there, is
// answered as one without a key (400, TypeKeyMissing, or passed through
// with WithKeyRequired(false)); one whose member is not a string or a
// number, or is empty or longer than storekit.MaxKeyLen bytes, gets 400
// (TypeKeyInvalid). The body is read (up to WithMaxBodySize) before the
// key is known. The default is header:Idempotency-Key.
func WithKeySource(s keysource.Source) Option {
	return func(m *Middleware) {
		m.zeroSource = s.IsZero()
		if s.Header() != "" {
			m.header, m.bodyKey = s.Header(), keysource.Source{}
			return
		}
		m.bodyKey = s
	}
}

// WithFingerprint sets what of the body the fingerprint covers (package
// keysource): all of it as sent (body, the default), none of it (none),
// or only some members of a JSON body in canonical JSON
// (json:POINTER,...), so that a retry that differs outside them is not a
// mismatch while one that differs inside them is (422). The method, path,
// query and WithFingerprintHeaders are covered whatever f says. A body
// that is not JSON is fingerprinted whole under json:.... With a
// Fingerprint other than body, WithCanonicalJSON has no effect. The
// default is the zero Fingerprint, body.
func WithFingerprint(f keysource.Fingerprint) Option {
	return func(m *Middleware) { m.fp = f }
}

// Verifier checks that a request was sent by whom it says, from its
// header fields (header returns a field's values, as http.Header.Values)
// and its body, and returns an error if not. webhook.Verifier is one.
// It must be safe for concurrent use.
type Verifier interface {
	Verify(header func(name string) []string, body []byte) error
}

// WithVerifier makes the middleware check each covered request with v
// once its body is read and before its key is looked up in the store: a
// request that v rejects is answered with 401 (TypeSignatureInvalid),
// and neither the handler nor the store sees it. Use it for webhook
// receivers (package webhook): a forged request that carries a real
// delivery's id must not take that id's key, or the real delivery would
// be replayed the forged request's answer. A request without a key that
// WithKeyRequired(false) passes through is not checked. The default is
// none.
func WithVerifier(v Verifier) Option {
	return func(m *Middleware) { m.verifier, m.verifierSet = v, true }
}

// WithKeyRequired sets whether requests that the middleware covers must carry
// a key. A request without one is answered with 400 (TypeKeyMissing) when the
// key is required, and passed to the handler without protection otherwise.
// The default is true.
func WithKeyRequired(required bool) Option {
	return func(m *Middleware) { m.required = required }
}

// WithMethods sets the request methods the middleware covers; requests with
// other methods pass through to the handler without protection, and if they
// carry the key field their response gets IgnoredHeader, so that the client
// can tell that the key was not used. Methods are compared ignoring case
// ("post" is POST; the handler then sees the method as given here). The
// default is POST and PATCH (PUT and DELETE are idempotent by definition,
// but may be added).
func WithMethods(methods ...string) Option {
	return func(m *Middleware) { m.methods = append([]string(nil), methods...) }
}

// WithPrincipal scopes keys by the principal that principal returns for a
// request, for example the authenticated user or API key taken from the
// request's context, so that one client can never replay another client's
// response: two principals that send the same key get two executions. The
// principal is hashed (SHA-256) into the key's scope; its raw value is
// neither stored nor logged. An empty string means that the request has no
// principal: it is answered with 400 (TypePrincipalMissing) and the handler
// does not run, since requests without a principal would share one scope and
// replay each other's responses; httpkit.EmptyPrincipal(true) lets them. principal
// must be safe for concurrent use. The default is no principal: keys are
// scoped by method and route only.
func WithPrincipal(principal func(r *http.Request) string) Option {
	return func(m *Middleware) { m.principal = principal; m.principalSet = true }
}

// WithRoute sets how the route part of a key's scope is found. The default
// is the ServeMux pattern that matched the request (Request.Pattern) when it
// is set, and the request's URL path otherwise. Request.Pattern is set only
// once ServeMux has routed the request: wrap the handlers registered on the
// mux, not the mux, or set a route function (for example one that returns
// chi's route pattern). The scope is always prefixed with the method. route
// must be safe for concurrent use.
func WithRoute(route func(r *http.Request) string) Option {
	return func(m *Middleware) { m.route = route; m.routeSet = true }
}

// WithFingerprintHeaders adds the named request fields to the fingerprint, so
// that a retry with the same key and body but another value of one of them
// is a mismatch (422). The method, path, query and body are always part of
// it. The default is none.
func WithFingerprintHeaders(names ...string) Option {
	return func(m *Middleware) { m.fpHeaders = append([]string(nil), names...) }
}

// WithCanonicalJSON makes the fingerprint cover the body in a canonical JSON
// form when the body is one JSON value, so that a retry whose body differs
// only in member order or whitespace is not a mismatch. Numbers are
// compared as written, and of duplicate members the last counts. Bodies that
// are not JSON are fingerprinted as they are. The handler always sees the
// body as sent. The default is false: the body's bytes count.
func WithCanonicalJSON(enabled bool) Option {
	return func(m *Middleware) { m.canonicalJSON = enabled }
}

// WithMaxBodySize sets the largest request body, in bytes. The middleware
// reads the body before the handler runs (to fingerprint it); a larger one
// is answered with 413 (TypeBodyTooLarge) and the handler does not run. The
// default is DefaultMaxBodySize (1 MiB).
func WithMaxBodySize(n int64) Option {
	return func(m *Middleware) { m.maxBody = n }
}

// WithMaxBufferedBodies bounds the memory of the request bodies that the
// middleware holds at once, n bytes in all, so that many large or slow
// uploads cannot exhaust it. The middleware reads each body before the
// handler runs (to fingerprint it) and keeps it until the handler returns;
// its buffer grows with the bytes that arrive, not with the length the
// request announces. The first 16 KiB of each body are not counted, so
// that small requests are always served; a request whose body would take
// the total over n is answered with 503 (TypeServerBusy) and Retry-After
// (WithRetryAfter), and the handler does not run. The default is no bound:
// the server's own limits (connections, timeouts) apply.
func WithMaxBufferedBodies(n int64) Option {
	return func(m *Middleware) { m.bodies = &bodyBudget{max: n} }
}

// WithMaxResponseSize sets the largest response body, in bytes, that is
// stored. A larger response is still sent to the client in full, but it
// cannot be replayed: the key becomes FAILED (the handler ran; running it
// again could repeat its effect) and a retry gets 422 (TypeKeyFailed). The
// same happens when the encoded response is over the Executor's own limit
// (idem.WithMaxResultSize). This limit is checked while the response is
// written, so that a large streamed response is not held in memory. The
// default is the Executor's maximum result size (adapterkit.MaxResultSize; 1 MiB
// unless configured).
func WithMaxResponseSize(n int) Option {
	return func(m *Middleware) { m.maxResponse = n }
}

// WithWait makes a request whose key is in progress wait, up to d in total,
// for the first request to finish, and then get its replayed response (or
// run the handler itself if the first request released the key) instead of
// an immediate 409. It is woken by the store's notification when the store
// implements storekit.Watcher (memstore and redisstore do), so that waiting does
// not poll the store. A request still waiting after d gets 409. The wait
// is the Executor's (idem.WaitFor), counted from the request's start. The
// default is the Executor's own (idem.WithWait; no waiting unless set).
func WithWait(d time.Duration) Option {
	return func(m *Middleware) { m.wait, m.waitSet = d, true }
}

// WithPolicy sets which responses are stored and which release the key. It
// may decide per route from the request. The default is DefaultPolicy;
// ReleaseServerErrors also releases on every 5xx; StoreSuccessOnly stores
// 2xx responses only (see its risk).
func WithPolicy(p Policy) Option {
	return func(m *Middleware) { m.policy = p }
}

// WithDenyHeaders sets the response fields that are never stored or
// replayed, in addition to the hop-by-hop fields (Connection and the fields
// it names, Keep-Alive, Proxy-Authenticate, Proxy-Authorization, TE,
// Trailer, Transfer-Encoding, Upgrade), which never are. It replaces the
// default, Set-Cookie, so that a session cookie set for the first request is
// not handed out again; call it with no names to store every field.
func WithDenyHeaders(names ...string) Option {
	return func(m *Middleware) {
		m.deny = make(map[string]bool, len(names))
		for _, n := range names {
			m.deny[http.CanonicalHeaderKey(n)] = true
		}
	}
}

// WithFailOpen sets what happens when the store cannot be reached. Failing
// closed (false) answers 503 (TypeStoreUnavailable) with Retry-After, so that
// no request runs unprotected. Failing open (true) runs the handler without
// protection — a retry may then run it twice — and reports
// OutcomeFailedOpen to the hooks and the logger. The default is false.
func WithFailOpen(open bool) Option {
	return func(m *Middleware) { m.failOpen = open }
}

// WithRetryAfter sets the Retry-After of 503 responses sent when the store
// cannot be reached. It is sent in whole seconds, rounded up. The default is
// 1s.
func WithRetryAfter(d time.Duration) Option {
	return func(m *Middleware) { m.retryAfter = d }
}

// WithLogger sets a logger for events that need an operator's attention:
// store errors, running unprotected (fail open), responses that could not be
// stored. Raw keys are never logged; the store key (a digest) is. The
// default is nil: nothing is logged.
func WithLogger(l *slog.Logger) Option {
	return func(m *Middleware) { m.logger = l }
}

// WithHook adds a hook, called once for every request that the middleware
// covers with the outcome and its duration; use it for metrics and tracing.
// Hooks run in the order they were added. The default is none.
func WithHook(h Hook) Option {
	return func(m *Middleware) { m.hooks = append(m.hooks, h) }
}

// WithErrorHandler sets how error responses (400, 408, 409, 413, 422, 500,
// 503) are written. The default is WriteProblem, which writes RFC 9457
// problem details as application/problem+json. WriteStripeError writes
// Stripe's shape, with Stripe-Should-Retry; TemplateErrorHandler any JSON
// shape.
func WithErrorHandler(h ErrorHandler) Option {
	return func(m *Middleware) { m.errorHandler = h }
}

// WithProblemTypeBase sets the base of the type URIs of the problems the
// middleware writes: each type is base followed by the kind's name, for
// example base + "key-mismatch" for TypeKeyMismatch (see Problem.Code for
// the name in a program). Use it to point clients at a page of your own
// documentation ("https://docs.example.com/errors#"). base must be an
// absolute URI. The default is DefaultProblemTypeBase, "urn:idem:problem:",
// which the repository's docs/problems.md documents.
func WithProblemTypeBase(base string) Option {
	return func(m *Middleware) { m.typeBase = base }
}
