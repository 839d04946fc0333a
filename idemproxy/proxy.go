package idemproxy

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptrace"
	"net/http/httputil"
	"net/url"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/idemgo/idem"
	"github.com/idemgo/idem/adapterkit"
	"github.com/idemgo/idem/idemhttp"
	"github.com/idemgo/idem/idemhttp/httpkit"
	"github.com/idemgo/idem/internal/httpsyntax"
	"github.com/idemgo/idem/keysource"
	"github.com/idemgo/idem/storekit"
)

// Defaults of the Proxy's fields: what their zero value stands for.
const (
	// DefaultFenceHeader is the request field that tells the upstream the
	// request's fencing token.
	DefaultFenceHeader = "Idempotency-Fence"
	// DefaultUpstreamTimeout bounds the wait for the upstream's response
	// header.
	DefaultUpstreamTimeout = 30 * time.Second
	// DefaultBodyTimeout bounds the time a request's body takes to arrive.
	DefaultBodyTimeout = 30 * time.Second
	// DefaultWriteTimeout bounds the time a client takes to receive a
	// response.
	DefaultWriteTimeout = time.Minute
	// DefaultMaxConcurrent bounds the requests handled at once.
	DefaultMaxConcurrent = 1024
	// DefaultMaxBodyMemory bounds the memory of the request bodies held at
	// once. With it and the other defaults, 1,000 slow uploads hold the
	// proxy under 150 MB (RELIABILITY.md, "slow uploads").
	DefaultMaxBodyMemory = 32 << 20
)

// Proxy is an idempotent reverse proxy: a request whose method it covers
// (POST and PATCH by default) and that carries an Idempotency-Key runs at
// most once per key on the upstream; the upstream's response is stored
// before the client gets it, and a retry with the same key gets it again
// with Idempotent-Replayed: true. Other requests pass through.
//
// Set Target and Executor; every other field's zero value is the default
// stated in its comment, so that &Proxy{Target: u, Executor: exec} is a
// safe proxy. The fields must not change once the proxy served a request
// or Init was called. A Proxy is safe for concurrent use, and must not be
// copied after first use.
type Proxy struct {
	// Target is the URL of the upstream, http or https with a host. Each
	// request goes to its scheme and host, with its path joined to
	// Target's (httputil.ProxyRequest.SetURL). Required.
	Target *url.URL

	// Executor runs the covered requests. Its store holds the records;
	// its lease is how long a request holds its key before another may
	// take it over (extended while the upstream works); its retention how
	// long responses are replayed. Required.
	Executor *idem.Executor

	// Transport makes the upstream calls. nil: a transport like
	// http.DefaultTransport that keeps up to 1024 idle connections to the
	// upstream and waits UpstreamTimeout for a response header.
	Transport http.RoundTripper

	// UpstreamH2C makes the default transport (Transport nil) speak HTTP/2
	// without TLS to an http Target (h2c with prior knowledge), for an
	// upstream that serves HTTP/2 only, such as a gRPC server. An https
	// Target gets HTTP/2 when the upstream offers it (ALPN) whatever this
	// says. The default is false: HTTP/1.1 to an http Target.
	UpstreamH2C bool

	// UpstreamTimeout bounds the wait for the upstream's response header
	// when Transport is nil: then 504, and the key is left to its lease,
	// since the upstream may have acted. 0: DefaultUpstreamTimeout (30s);
	// negative: no bound. A Transport of your own has its own timeouts.
	UpstreamTimeout time.Duration

	// Rewrite, if set, changes each outgoing request further (a field, a
	// trace context), after the proxy set its URL and X-Forwarded fields
	// and before it removes what only the proxy may tell the upstream (the
	// fence, the key of a body-less request, Expect). nil: nothing more.
	Rewrite func(*httputil.ProxyRequest)

	// Methods are the request methods made idempotent, compared ignoring
	// case; requests with other methods pass through, and if they carry
	// an Idempotency-Key their response gets Idempotency-Key-Ignored:
	// true. Empty: POST and PATCH.
	Methods []string

	// KeySource is where a covered request's key is: a header field or a
	// member of a JSON body (package keysource; for example json:/id for
	// Stripe's events). A key from the body is scoped by method, path and
	// ScopeHeader like any other; a body that is not JSON or lacks the
	// member gets the 400 of a missing key (or passes through with
	// KeyOptional). The zero Source: header:Idempotency-Key.
	KeySource keysource.Source

	// Fingerprint is what of a covered request's body its fingerprint
	// covers, beside the method, path and query: all of it, none, or some
	// members of a JSON body (package keysource). The zero Fingerprint:
	// the whole body.
	Fingerprint keysource.Fingerprint

	// Verifier, if set, checks each covered request (its header and
	// body) before its key is looked up: one it rejects gets 401
	// (idemhttp.TypeSignatureInvalid) and touches no record, so that a
	// forged webhook delivery carrying a real delivery's id cannot take
	// that id's key (package webhook has the providers' verifiers). nil:
	// no check.
	Verifier idemhttp.Verifier

	// Routes give some method and path prefixes settings of their own
	// (key source, fingerprint, methods, policy, lease, wait, verifier);
	// the other requests get the fields above. Routes may not overlap.
	// Empty: one set of settings for every request.
	Routes []Route

	// KeyOptional passes a covered request without an Idempotency-Key
	// through, unprotected. false (the default): it gets 400.
	KeyOptional bool

	// ScopeHeader scopes keys by the value of this request field (hashed),
	// for example Authorization, so that one client never gets another's
	// response; a covered request without the field gets 400 unless
	// AllowMissingScope. "" (the default): keys are scoped by method and
	// path only.
	ScopeHeader string

	// AllowMissingScope serves the covered requests that lack ScopeHeader
	// in one shared scope (anonymous clients can then get each other's
	// responses). false (the default): 400.
	AllowMissingScope bool

	// FenceHeader is the request field that tells the upstream the
	// request's fencing token (see idem.FenceFrom). A client's own field
	// of that name, also spelt with _ for -, is always removed, so that a
	// client cannot forge a fence. "": DefaultFenceHeader.
	FenceHeader string

	// DisableFence sends the upstream no fence and leaves a client's own
	// FenceHeader field as it is. false (the default): the fence is sent.
	DisableFence bool

	// MaxBodySize is the largest body of a covered request, in bytes;
	// a larger one gets 413. 0: idemhttp.DefaultMaxBodySize (1 MiB).
	MaxBodySize int64

	// MaxResponseSize is the largest response body stored, in bytes; a
	// larger one is sent once, then its key is FAILED and retries get
	// 422. It limits storing only: a response stored under a larger value
	// is replayed as long as the Executor reads it (idem.WithMaxResultSize
	// bounds what it reads, the response's fields included). 0: the
	// Executor's maximum result size (adapterkit.DefaultMaxResultSize, 1 MiB, unless
	// set).
	MaxResponseSize int

	// MaxBodyMemory bounds the memory of the covered requests' bodies
	// held at once, beyond the first 16 KiB of each; a body that would go
	// over it gets 503 with Retry-After. 0: DefaultMaxBodyMemory (32 MiB);
	// negative: no bound.
	MaxBodyMemory int64

	// MaxConcurrent bounds the requests handled at once; more get 503 with
	// Retry-After. 0: DefaultMaxConcurrent (1024); negative: no bound.
	MaxConcurrent int

	// BodyTimeout bounds the time a request's body takes to arrive, from
	// its header: then 408, or for a request passed through, an upstream
	// request cut off. It sets the connection's read deadline
	// (http.ResponseController), which net/http's servers take.
	// 0: DefaultBodyTimeout (30s); negative: no bound.
	BodyTimeout time.Duration

	// WriteTimeout bounds the time a client takes to receive a response,
	// from its header: then its connection is closed (the response was
	// stored before it was sent, so a retry gets it). text/event-stream
	// responses have no bound. 0: DefaultWriteTimeout (1m); negative: no
	// bound.
	WriteTimeout time.Duration

	// Wait makes a retry whose key is in progress wait up to Wait for the
	// first request to end, and get its response, instead of 409. 0 (the
	// default): 409 at once.
	Wait time.Duration

	// Policy decides which of the upstream's answers are stored and which
	// release the key. nil: idemhttp.DefaultPolicy (all but 408, 409,
	// 425, 429 and 503 are stored). When the upstream did not answer, the
	// proxy decides (see UpstreamFailure).
	Policy idemhttp.Policy

	// FailOpen forwards covered requests unprotected when the store cannot
	// be reached. false (the default): they get 503 with Retry-After.
	FailOpen bool

	// StreamAll sends every response as the upstream sends it, end
	// included, and stores it afterwards, so that a client may be told a
	// success that was not recorded. false (the default): a response is
	// stored before it is sent; text/event-stream responses and bodies
	// over MaxResponseSize stream, all but their end, which waits until
	// their record is written (or the connection is aborted).
	StreamAll bool

	// ErrorHandler writes the proxy's error responses (400, 409, 413, 422,
	// 502, 503, 504, ...). nil: idemhttp.WriteProblem, RFC 9457 problem
	// details. idemhttp.WriteStripeError and TemplateErrorHandler write
	// other shapes.
	ErrorHandler idemhttp.ErrorHandler

	// ProblemTypeBase is the base of the type URIs of error bodies, an
	// absolute URI (see idemhttp.WithProblemTypeBase).
	// "": idemhttp.DefaultProblemTypeBase.
	ProblemTypeBase string

	// Logger gets what an operator should see: upstream calls that
	// failed, store errors, responses not stored. Raw keys are never
	// logged. nil: slog.Default().
	Logger *slog.Logger

	// Observer is told about every request once it was handled, for
	// metrics and tracing. nil: none.
	Observer Observer

	once sync.Once
	gw   *gateway
	err  error

	inFlight atomic.Int64
	draining atomic.Bool
	idleMu   sync.Mutex
	idle     chan struct{} // a request ended while draining
}

// gateway is what Init builds from the Proxy's fields.
type gateway struct {
	target         *url.URL
	userRewrite    func(*httputil.ProxyRequest)
	rp             *httputil.ReverseProxy
	mw             *idemhttp.Middleware
	protected      http.Handler    // the middleware around forward
	covered        map[string]bool // by the Proxy's fields or a route
	defaultCovered map[string]bool // by the Proxy's fields
	routes         []*routeGW
	lease          time.Duration
	log            *slog.Logger
	observer       Observer

	fenceHeader  string // canonical; "": off
	writeTimeout time.Duration
	bodyTimeout  time.Duration
	maxActive    int64
}

// Init checks the fields (Check, and that Target and Executor are set) and
// builds the proxy. ServeHTTP calls it on first use; call it before
// serving to learn of a bad field at start. It returns a *FieldError for a
// field that holds an invalid value, and the same error on every later
// call.
func (p *Proxy) Init() error {
	p.once.Do(func() { p.gw, p.err = p.build() })
	return p.err
}

// orDefault returns v, or def for 0, or 0 (no bound) for a negative v.
func orDefault[T int | int64 | time.Duration](v, def T) T {
	switch {
	case v == 0:
		return def
	case v < 0:
		return 0
	}
	return v
}

// Check reports the first field that holds a value the proxy cannot use,
// as a *FieldError, without building anything, so that a configuration
// can be checked before its Executor exists: Target and Executor are
// checked when set, and their absence is left to Init. Init calls it.
func (p *Proxy) Check() error {
	switch {
	case p.Target != nil && (p.Target.Scheme != "http" && p.Target.Scheme != "https" || p.Target.Host == ""):
		return &FieldError{"Target", "want an http:// or https:// URL with a host"}
	case p.ScopeHeader != "" && !httpsyntax.IsToken(p.ScopeHeader):
		return &FieldError{"ScopeHeader", fmt.Sprintf("invalid header name %q", p.ScopeHeader)}
	case p.FenceHeader != "" && !httpsyntax.IsToken(p.FenceHeader):
		return &FieldError{"FenceHeader", fmt.Sprintf("invalid header name %q", p.FenceHeader)}
	case p.MaxBodySize < 0:
		return &FieldError{"MaxBodySize", fmt.Sprintf("%d is negative", p.MaxBodySize)}
	case p.MaxResponseSize < 0:
		return &FieldError{"MaxResponseSize", fmt.Sprintf("%d is negative", p.MaxResponseSize)}
	case p.Wait < 0:
		return &FieldError{"Wait", fmt.Sprintf("%v is negative", p.Wait)}
	}
	for _, m := range p.Methods {
		if !httpsyntax.IsToken(m) {
			return &FieldError{"Methods", fmt.Sprintf("invalid method %q", m)}
		}
	}
	if err := CheckRoutes(p.Routes, p.Methods); err != nil {
		return &FieldError{"Routes", err.Error()}
	}
	if p.ProblemTypeBase != "" {
		if u, err := url.Parse(p.ProblemTypeBase); err != nil || u.Scheme == "" {
			return &FieldError{"ProblemTypeBase", fmt.Sprintf("%q is not an absolute URI", p.ProblemTypeBase)}
		}
	}
	return nil
}

func (p *Proxy) build() (*gateway, error) {
	switch {
	case p.Target == nil:
		return nil, &FieldError{"Target", "nil: the upstream's URL is required"}
	case p.Executor == nil:
		return nil, &FieldError{"Executor", "nil: an Executor is required"}
	}
	if err := p.Check(); err != nil {
		return nil, err
	}
	g := &gateway{
		target:       p.Target,
		userRewrite:  p.Rewrite,
		covered:      make(map[string]bool),
		lease:        adapterkit.Lease(p.Executor),
		log:          p.Logger,
		observer:     p.Observer,
		writeTimeout: orDefault(p.WriteTimeout, DefaultWriteTimeout),
		bodyTimeout:  orDefault(p.BodyTimeout, DefaultBodyTimeout),
		maxActive:    int64(orDefault(p.MaxConcurrent, DefaultMaxConcurrent)),
	}
	if g.log == nil {
		g.log = slog.Default()
	}
	if !p.DisableFence {
		g.fenceHeader = http.CanonicalHeaderKey(orString(p.FenceHeader, DefaultFenceHeader))
	}
	methods := p.Methods
	if len(methods) == 0 {
		methods = []string{http.MethodPost, http.MethodPatch}
	}
	g.defaultCovered = make(map[string]bool)
	for _, m := range methods {
		g.covered[strings.ToUpper(m)] = true
		g.defaultCovered[strings.ToUpper(m)] = true
	}
	mw, err := idemhttp.New(p.Executor, p.middlewareOptions(g, methods)...)
	if err != nil {
		return nil, fmt.Errorf("idemproxy: %w", err)
	}
	g.mw = mw
	if err := p.buildRoutes(g); err != nil {
		return nil, err
	}
	transport := p.Transport
	if transport == nil {
		transport = newTransport(orDefault(p.UpstreamTimeout, DefaultUpstreamTimeout), p.UpstreamH2C)
	}
	g.rp = &httputil.ReverseProxy{
		Rewrite:        g.rewrite,
		ModifyResponse: modifyResponse,
		Transport:      transport,
		BufferPool:     copyBuffers{},
		ErrorHandler:   g.upstreamError,
		ErrorLog:       slog.NewLogLogger(g.log.Handler(), slog.LevelWarn),
	}
	g.protected = mw.Handler(http.HandlerFunc(g.forward))
	return g, nil
}

// orString returns s, or def when s is empty.
func orString(s, def string) string {
	if s == "" {
		return def
	}
	return s
}

// middlewareOptions returns the options of the idempotency middleware.
func (p *Proxy) middlewareOptions(g *gateway, methods []string) []idemhttp.Option {
	base := p.Policy
	if base == nil {
		base = idemhttp.DefaultPolicy
	}
	opts := []idemhttp.Option{
		idemhttp.WithMethods(methods...),
		idemhttp.WithKeyRequired(!p.KeyOptional),
		idemhttp.WithWait(p.Wait),
		idemhttp.WithFailOpen(p.FailOpen),
		idemhttp.WithLogger(g.log),
		idemhttp.WithHook(g.hook),
		idemhttp.WithPolicy(policy(base)),
		// ReverseProxy flushes every response of unknown length
		// (chunked): only text/event-stream and bodies over the stored
		// limit stream; the rest is stored before it is sent.
		httpkit.StreamOnFlush(false),
		httpkit.StreamAll(p.StreamAll),
		idemhttp.WithFingerprint(p.Fingerprint),
	}
	if p.Verifier != nil {
		opts = append(opts, idemhttp.WithVerifier(p.Verifier))
	}
	if !p.KeySource.IsZero() {
		opts = append(opts, idemhttp.WithKeySource(p.KeySource))
	}
	if p.MaxBodySize > 0 {
		opts = append(opts, idemhttp.WithMaxBodySize(p.MaxBodySize))
	}
	if p.MaxResponseSize > 0 {
		opts = append(opts, idemhttp.WithMaxResponseSize(p.MaxResponseSize))
	}
	if n := orDefault(p.MaxBodyMemory, DefaultMaxBodyMemory); n > 0 {
		opts = append(opts, idemhttp.WithMaxBufferedBodies(n))
	}
	if p.ErrorHandler != nil {
		opts = append(opts, idemhttp.WithErrorHandler(p.ErrorHandler))
	}
	if p.ProblemTypeBase != "" {
		opts = append(opts, idemhttp.WithProblemTypeBase(p.ProblemTypeBase))
	}
	if p.ScopeHeader != "" {
		name := http.CanonicalHeaderKey(p.ScopeHeader)
		opts = append(opts, idemhttp.WithPrincipal(func(r *http.Request) string {
			if v := r.Header[name]; len(v) > 0 {
				return v[0]
			}
			return ""
		}), httpkit.EmptyPrincipal(p.AllowMissingScope))
	}
	return opts
}

// newTransport returns the default transport: timeout bounds the wait for
// a response header (0: none); h2c makes it speak HTTP/2 without TLS.
func newTransport(timeout time.Duration, h2c bool) *http.Transport {
	t := &http.Transport{
		Proxy:                 http.ProxyFromEnvironment,
		DialContext:           (&net.Dialer{Timeout: 10 * time.Second, KeepAlive: 30 * time.Second}).DialContext,
		ForceAttemptHTTP2:     true,
		MaxIdleConns:          1024,
		MaxIdleConnsPerHost:   1024, // the default of 2 would open a connection per request under load
		IdleConnTimeout:       90 * time.Second,
		TLSHandshakeTimeout:   10 * time.Second,
		ResponseHeaderTimeout: timeout,
		ExpectContinueTimeout: time.Second,
	}
	if h2c {
		t.Protocols = new(http.Protocols)
		t.Protocols.SetUnencryptedHTTP2(true)
		t.Protocols.SetHTTP2(true) // an https Target still works
	}
	return t
}

// ServeHTTP handles one request: a covered one through the idempotency
// layer to the upstream, another straight to the upstream. If Init fails,
// it answers 500 and logs why.
func (p *Proxy) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	n := p.inFlight.Add(1)
	defer p.ended()
	if err := p.Init(); err != nil {
		log := p.Logger
		if log == nil {
			log = slog.Default()
		}
		log.Error("idemproxy: the proxy cannot serve", "error", err)
		http.Error(w, http.StatusText(http.StatusInternalServerError), http.StatusInternalServerError)
		return
	}
	g := p.gw
	if g.maxActive > 0 && n > g.maxActive {
		g.busy(w, r)
		return
	}
	if g.bodyTimeout > 0 && r.Body != nil && r.Body != http.NoBody {
		// The deadline is the connection's: it would also end the read
		// that the server's own goroutine makes once the body is in, and
		// that read failing cancels the request's context. So it is lifted
		// as soon as the body ends (deadlineBody). A body that did not end
		// keeps it: after the handler, what is left of the body is read
		// before the answer goes (drain), and that must not wait for ever.
		rc := http.NewResponseController(w)
		deadline := time.Now().Add(g.bodyTimeout)
		if rc.SetReadDeadline(deadline) == nil {
			db := &deadlineBody{ReadCloser: r.Body, rc: rc, deadline: deadline}
			r.Body = db
			defer db.drain()
		}
	}
	if g.writeTimeout > 0 {
		w = &deadlineWriter{ResponseWriter: w, d: g.writeTimeout}
	}
	g.serve(w, r)
}

// covers reports whether the Proxy's fields or a route cover method,
// compared ignoring case as the middleware does.
func (g *gateway) covers(method string) bool {
	return g.covered[method] || g.covered[strings.ToUpper(method)]
}

// defaultCovers reports whether the Proxy's own fields cover method.
func (g *gateway) defaultCovers(method string) bool {
	return g.defaultCovered[method] || g.defaultCovered[strings.ToUpper(method)]
}

func (g *gateway) serve(w http.ResponseWriter, r *http.Request) {
	protected, covered := g.protected, g.defaultCovers(r.Method)
	if rt := g.route(r); rt != nil {
		protected, covered = rt.protected, true
	}
	if !covered {
		// Through the middleware, which passes the request on to forward
		// and marks the response if it carries a key.
		pw := &passWriter{ResponseWriter: w}
		start := time.Now()
		defer func() {
			g.observe(r, Event{Kind: KindPassthrough, Event: idemhttp.Event{Status: pw.status, Duration: time.Since(start)}, UpstreamFailure: pw.failure})
		}()
		protected.ServeHTTP(pw, r)
		return
	}
	x := &exchange{parent: r.Context()}
	x.trace.WroteHeaders = x.wroteHeaders
	r = r.WithContext(httptrace.WithClientTrace(x, &x.trace))
	protected.ServeHTTP(w, r)
	if x.broke {
		// The client got a truncated response: abort the connection so
		// that it does not take it for a whole one (as ReverseProxy does).
		panic(http.ErrAbortHandler)
	}
}

// forward runs the reverse proxy for a request the middleware let through.
func (g *gateway) forward(w http.ResponseWriter, r *http.Request) {
	x := exchangeFrom(r.Context())
	if x == nil { // a request the middleware does not cover: w is serve's passWriter
		g.rp.ServeHTTP(w, r)
		return
	}
	x.w.ResponseWriter = w
	start := time.Now()
	defer func() {
		x.upstreamTime = time.Since(start)
		if v := recover(); v != nil {
			if v != http.ErrAbortHandler {
				panic(v)
			}
			// Reading the upstream's response failed after its header
			// was sent on: it acted, and what it answered is lost.
			x.broke = true
		}
	}()
	g.rp.ServeHTTP(&x.w, r)
}

// hook is the middleware's Hook: it tells the Observer about a covered
// request.
func (g *gateway) hook(r *http.Request, ev idemhttp.Event) {
	out := Event{Kind: KindCovered, Event: ev}
	if x := exchangeFrom(r.Context()); x != nil {
		out.Upstream, out.UpstreamFailure = x.upstreamTime, x.failure
	}
	g.observe(r, out)
}

func (g *gateway) observe(r *http.Request, ev Event) {
	if g.observer != nil {
		g.observer(r, ev)
	}
}

// busy answers a request over MaxConcurrent.
func (g *gateway) busy(w http.ResponseWriter, r *http.Request) {
	w.Header().Set("Retry-After", "1")
	g.mw.WriteError(w, r, &idemhttp.Problem{
		Type:       idemhttp.TypeServerBusy,
		Title:      "Server busy",
		Status:     http.StatusServiceUnavailable,
		Detail:     "The proxy handles as many requests as it may at once. The request was not processed; retry with the same idempotency key after the time given by Retry-After.",
		RetryAfter: time.Second,
	})
	g.observe(r, Event{Kind: KindBusy, Event: idemhttp.Event{Status: http.StatusServiceUnavailable}})
}

// InFlight returns the number of requests being handled.
func (p *Proxy) InFlight() int { return int(p.inFlight.Load()) }

// ended counts a request out, and wakes Drain when it was the last.
func (p *Proxy) ended() {
	if p.inFlight.Add(-1) == 0 && p.draining.Load() {
		select {
		case p.idleChan() <- struct{}{}:
		default:
		}
	}
}

func (p *Proxy) idleChan() chan struct{} {
	p.idleMu.Lock()
	defer p.idleMu.Unlock()
	if p.idle == nil {
		p.idle = make(chan struct{}, 1)
	}
	return p.idle
}

// Drain marks the proxy as shutting down, so that Ready returns
// ErrDraining from then on, and waits until no request is being handled,
// or until ctx is done (then it returns ctx's error). It does not refuse
// requests: stop the server from taking new ones (http.Server.Shutdown).
// A handler may outlive its connection, which Server.Close or a timed-out
// Shutdown cut off: it goes on reading the upstream's response to store
// it (or its key's failure), and Drain waits for it. Close the store
// once Drain returned nil.
func (p *Proxy) Drain(ctx context.Context) error {
	p.draining.Store(true)
	idle := p.idleChan()
	for p.inFlight.Load() > 0 {
		select {
		case <-idle:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	return nil
}

// readyProbeKey is the store key Ready reads: no request's key (those are
// digests under the store's prefix).
const readyProbeKey = "idem-readyz-probe"

// healthReporter is a store that reports what the last check of its
// server found (redisstore.Store.Health, with WithServerCheck).
type healthReporter interface{ Health() error }

// Ready reports whether the proxy should be sent requests, for a
// readiness probe: nil when its store answers a read (of a key no request
// uses) and, if the store reports its health (a Health() error method, as
// redisstore's with WithServerCheck; found through storekit.StoreAs), its
// last check found it fit. It returns ErrDraining once Drain was called,
// the error of Init, an error wrapping the store's when the read failed,
// or the store's health finding as it is. Bound its time with ctx. A
// liveness probe should not call it: while the store is down the process
// is alive, and a restart would not help.
func (p *Proxy) Ready(ctx context.Context) error {
	if p.draining.Load() {
		return ErrDraining
	}
	if err := p.Init(); err != nil {
		return err
	}
	store := adapterkit.Store(p.Executor)
	if _, err := store.Get(ctx, readyProbeKey); err != nil && !errors.Is(err, storekit.ErrNotFound) {
		return fmt.Errorf("store: %w", err)
	}
	if h, ok := storekit.StoreAs[healthReporter](store); ok {
		return h.Health()
	}
	return nil
}
