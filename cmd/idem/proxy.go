package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/url"
	"os"
	"strings"
	"sync/atomic"
	"time"

	"github.com/idemgo/idem"
	"github.com/idemgo/idem/idemhttp"
	"github.com/idemgo/idem/prometheusidem"
)

// proxyConfig is the configuration of `idem proxy`.
type proxyConfig struct {
	listen          string
	upstream        string
	store           storeFlags
	methods         []string
	requireKey      bool
	lease           time.Duration
	retention       time.Duration
	maxBody         int64
	maxResponse     int64
	scopeHeader     string
	anonymousScope  bool
	storePolicy     string
	errorBody       string
	typeBase        string
	fenceHeader     string
	wait            time.Duration
	waitSet         bool // --wait was given
	failOpen        bool
	adminListen     string
	logFormat       string
	logLevel        string
	upstreamTimeout time.Duration
	bodyTimeout     time.Duration
	maxConcurrent   int
	maxBodyMemory   int64
	shutdownTimeout time.Duration
	writeTimeout    time.Duration
	streamAll       bool
	checkUpstream   bool
	tracing         tracingFlags
}

const readyProbeKey = "idem-readyz-probe"

func proxyCommand() *command {
	return &command{
		name:    "proxy",
		args:    "--upstream URL [flags]",
		summary: "run the idempotency proxy in front of an HTTP API",
		doc: `
Runs a reverse proxy in front of --upstream. A request whose method is
covered (--methods) and that carries an Idempotency-Key header runs at most
once per key: the upstream's response is stored, and a retry with the same
key gets it again with Idempotent-Replayed: true. A retry while the first
request is still running gets 409 (or waits, with --wait); the same key with
another query or body gets 422. Methods are compared ignoring case (post is
POST). Other requests pass through; if one carries an Idempotency-Key, its
response gets Idempotency-Key-Ignored: true.

Keys are scoped by method and path, and by the value of --scope-header when
it is set (for example Authorization), so that one client never gets
another's response (a covered request without that header gets 400, unless
--allow-missing-scope): the same key with another method or path is another
key, and runs again. Paths are compared byte for byte as decoded from the
request: /orders and /orders/ are two paths. Raw keys are never stored or
logged; their digests are.

If the upstream cannot be reached, the request was not sent: 502 and the key
is released. The upstream's response is stored before it is sent to the
client; if the store cannot record it, the client gets 503 with
Retry-After (outcome-unknown: it may have taken effect, retry with the
same key) and the key stays in progress until its lease ends.
text/event-stream responses and bodies over --max-response stream through,
all but their end (the terminating chunk, or the last byte of a body of
declared length), which waits until the response is stored (or, over
--max-response, its key FAILED); if that cannot be written, the proxy
aborts the connection, so that the client sees an incomplete response,
never a whole one. If the
upstream does not answer after it got the request (a
timeout: 504), the key stays in progress until its lease ends, since the
upstream may have acted. On SIGTERM or SIGINT the proxy stops accepting
connections, lets the requests in flight finish and stores their responses
(up to --shutdown-timeout); then it closes the connections of clients that
are still being sent a response, stores what the upstream answered them
(up to another --shutdown-timeout), and exits. A client that takes longer
than --write-timeout to receive a response loses its connection; the
response was stored before it was sent, so a retry gets it again.

Records are kept in the embedded store under --data, or in Redis with
--redis, --redis-cluster or --redis-sentinel (which several proxies can
share; behind Sentinels the proxy follows a failover to the new primary).
The proxy refuses to start on a Redis older than 7.0 and on one whose
maxmemory-policy is not noeviction (every other policy can evict records,
and a retried request then runs again), unless --allow-eviction is given;
where the server refuses INFO and CONFIG GET it logs one warning and starts.
It checks again every --redis-check-interval while it runs, and as soon as
Redis answers after a call could not reach it: while a check fails (CONFIG
SET maxmemory-policy allkeys-lru on the running server), /readyz answers 503
and each check logs an error that names the fix.

With --otel-endpoint the proxy sends OpenTelemetry traces over OTLP/HTTP: a
server span per request (a child of the client's W3C traceparent, if any)
and a client span per store call; the upstream gets the proxy's span as its
traceparent.

The upstream gets the request's fencing token in --fence-header (by default
Idempotency-Fence): an integer that grows with every acquisition of the key,
so a request taken over after the proxy running it died carries a larger
one. An upstream whose side effect stores the fence and refuses a write with
a smaller or equal one (UPDATE ... WHERE fence < $1) applies each request's
effect once even then. A client's own field of that name is always removed,
so it cannot forge a fence.`,
		flags: func(fs *flagSet) func(context.Context, *env, []string) error {
			c := registerProxyFlags(fs)
			return func(ctx context.Context, e *env, args []string) error {
				if len(args) > 0 {
					return usagef("proxy: unexpected argument %q (boolean flags take the form --fail-open=true)", args[0])
				}
				c.waitSet = fs.isSet("wait")
				return runProxy(ctx, e, c)
			}
		},
	}
}

// registerProxyFlags defines the proxy's flags on fs and returns the
// configuration they fill.
func registerProxyFlags(fs *flagSet) *proxyConfig {
	// The defaults of the Var flags are the values they hold when defined.
	c := &proxyConfig{
		methods:         []string{http.MethodPost, http.MethodPatch},
		lease:           idem.DefaultLease,
		retention:       idem.DefaultRetention,
		maxBody:         idemhttp.DefaultMaxBodySize,
		maxResponse:     idem.DefaultMaxResultSize,
		upstreamTimeout: 30 * time.Second,
		bodyTimeout:     defaultBodyTimeout,
		maxBodyMemory:   defaultMaxBodyMemory,
		shutdownTimeout: 30 * time.Second,
		writeTimeout:    time.Minute,
	}
	fs.String(&c.listen, "listen", "ADDR", "127.0.0.1:8080", "address the proxy serves on")
	fs.URL(&c.upstream, "upstream", "URL", "", "URL of the API behind the proxy, e.g. http://127.0.0.1:9000; required")
	c.store.register(fs)
	fs.Var(listValue{p: &c.methods, upper: true}, "methods", "LIST", "request methods made idempotent; others pass through")
	fs.Bool(&c.requireKey, "require-key", true, "answer 400 to a covered request without Idempotency-Key (=false: pass it through unprotected)")
	fs.Var(durationValue{&c.lease}, "lease", "DURATION", "how long a request holds its key before another may take it over; extended while the upstream works")
	fs.Var(durationValue{&c.retention}, "retention", "DURATION", "how long responses are kept and replayed")
	fs.Var(sizeValue{&c.maxBody}, "max-body", "SIZE", "largest request body (larger: 413), e.g. 1MiB, 512KiB, 1048576")
	fs.Var(sizeValue{&c.maxResponse}, "max-response", "SIZE", "largest response body stored (larger: sent once, then the key is FAILED and retries get 422); it limits storing only: responses stored under a larger value stay replayable")
	fs.String(&c.scopeHeader, "scope-header", "NAME", "", "scope keys by the value of this request header (hashed), e.g. Authorization; a covered request without it gets 400")
	fs.Bool(&c.anonymousScope, "allow-missing-scope", false, "with --scope-header, serve covered requests without the header in one shared scope (anonymous clients can then get each other's responses) instead of 400")
	fs.String(&c.storePolicy, "store-policy", "NAME", "default", "which upstream answers are stored: default (all but 408, 409, 425, 429, 503), release-5xx (also retry every 5xx), only-2xx (retry every non-2xx: a retry after a 4xx or 5xx that followed a side effect repeats it)")
	fs.String(&c.fenceHeader, "fence-header", "NAME", "Idempotency-Fence", "request header that tells the upstream the request's fencing token; a client's own is removed (empty: off)")
	fs.String(&c.errorBody, "error-body", "SHAPE", "problem", "shape of error bodies: problem (RFC 9457 application/problem+json), stripe (Stripe's preset: {\"error\":{...}} with Stripe-Should-Retry, 400 for a key reused with other parameters, and --wait of --lease by default, for Stripe's SDKs), a JSON template, or @FILE holding one (placeholders {{type}} {{code}} {{title}} {{detail}} {{status}} {{retry}})")
	fs.String(&c.typeBase, "problem-type-base", "URI", idemhttp.DefaultProblemTypeBase, "base of the type URIs of error bodies: each is the base followed by the kind's name (key-mismatch, in-progress, ...; see docs/problems.md), e.g. https://docs.example.com/errors#")
	fs.Var(durationValue{&c.wait}, "wait", "DURATION", "how long a retry waits for the first request to finish before 409 (0: answer 409 at once; with --error-body stripe the default is --lease)")
	c.store.registerWait(fs)
	fs.Bool(&c.store.allowEviction, "allow-eviction", false, "start on a Redis whose maxmemory-policy is not noeviction (it may evict records: retried requests then run again)")
	c.store.registerCheck(fs)
	fs.Bool(&c.failOpen, "fail-open", false, "when the store is unreachable, forward requests unprotected instead of answering 503")
	fs.Var(durationValue{&c.bodyTimeout}, "body-timeout", "DURATION", "how long a request's body may take to arrive, from its header (then 408, or a cut-off upstream request if not covered; 0: no limit)")
	fs.Int(&c.maxConcurrent, "max-concurrent", "N", defaultMaxConcurrent, "requests handled at once; more get 503 with Retry-After (0: no limit)")
	fs.Var(sizeValue{&c.maxBodyMemory}, "max-body-memory", "SIZE", "memory for the bodies of covered requests held at once, beyond the first 16KiB of each (a body that would go over it: 503 with Retry-After)")
	fs.Var(durationValue{&c.upstreamTimeout}, "upstream-timeout", "DURATION", "how long to wait for the upstream's response header (0: no limit); then 504")
	fs.Var(durationValue{&c.shutdownTimeout}, "shutdown-timeout", "DURATION", "how long a shutdown waits for requests in flight before it closes their connections")
	fs.Var(durationValue{&c.writeTimeout}, "write-timeout", "DURATION", "how long a client may take to receive a response, from its first byte (0: no limit; text/event-stream responses have none)")
	fs.Bool(&c.streamAll, "stream-all", false, "send every response as the upstream sends it, end included, and store it afterwards (a client may then be told a success that was not recorded)")
	fs.String(&c.adminListen, "admin-listen", "ADDR", "", "address for /metrics, /healthz and /readyz (empty: off)")
	fs.String(&c.logFormat, "log-format", "FORMAT", "text", "log format: text or json")
	fs.String(&c.logLevel, "log-level", "LEVEL", "info", "log level: debug, info, warn or error")
	fs.Bool(&c.checkUpstream, "check-upstream", true, "refuse to start when the upstream does not accept TCP connections")
	c.tracing.register(fs)
	return c
}

// validate checks the configuration without I/O and returns the upstream
// URL.
func (c *proxyConfig) validate() (*url.URL, error) {
	if c.upstream == "" {
		return nil, usagef("proxy: --upstream is required (the URL of the API behind the proxy, e.g. --upstream http://127.0.0.1:9000)")
	}
	u, err := url.Parse(c.upstream)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		if err == nil {
			err = errors.New("want an http:// or https:// URL with a host")
		}
		return nil, urlFlagError("--upstream", c.upstream, err, "http")
	}
	if err := c.store.validate(); err != nil {
		return nil, err
	}
	if _, _, err := net.SplitHostPort(c.listen); err != nil {
		return nil, usagef("invalid --listen %q: want host:port", c.listen)
	}
	if c.adminListen != "" {
		if _, _, err := net.SplitHostPort(c.adminListen); err != nil {
			return nil, usagef("invalid --admin-listen %q: want host:port", c.adminListen)
		}
	}
	switch {
	case c.lease < time.Millisecond:
		return nil, usagef("--lease %v is too short", c.lease)
	case c.retention < c.lease:
		return nil, usagef("--retention %v is shorter than --lease %v", c.retention, c.lease)
	case c.maxResponse > maxResponseLimit:
		return nil, usagef("--max-response %s is over the limit of 1GiB", formatSize(c.maxResponse))
	case c.maxConcurrent < 0:
		return nil, usagef("--max-concurrent %d is negative", c.maxConcurrent)
	case c.shutdownTimeout <= 0:
		return nil, usagef("--shutdown-timeout must be positive")
	case c.writeTimeout < 0:
		return nil, usagef("--write-timeout must not be negative")
	case c.logFormat != "text" && c.logFormat != "json":
		return nil, usagef("invalid --log-format %q: want text or json", c.logFormat)
	}
	if u, err := url.Parse(c.typeBase); err != nil || u.Scheme == "" {
		return nil, usagef("invalid --problem-type-base %q: want an absolute URI, e.g. https://docs.example.com/errors#", c.typeBase)
	}
	if c.policy() == nil {
		return nil, usagef("invalid --store-policy %q: want default, release-5xx or only-2xx", c.storePolicy)
	}
	if c.scopeHeader != "" && !validToken(c.scopeHeader) {
		return nil, usagef("invalid --scope-header %q: not a header name", c.scopeHeader)
	}
	if c.fenceHeader != "" && !validToken(c.fenceHeader) {
		return nil, usagef("invalid --fence-header %q: not a header name", c.fenceHeader)
	}
	for _, m := range c.methods {
		if !validToken(m) {
			return nil, usagef("invalid method %q in --methods", m)
		}
	}
	if _, err := parseLevel(c.logLevel); err != nil {
		return nil, err
	}
	if err := c.tracing.validate(); err != nil {
		return nil, err
	}
	return u, nil
}

// Defaults of the resource bounds: with them, 1,000 slow uploads hold
// the proxy under 150 MB (RELIABILITY.md, "slow uploads").
const (
	defaultBodyTimeout   = 30 * time.Second
	defaultMaxConcurrent = 1024
	defaultMaxBodyMemory = 32 << 20
)

// maxResponseLimit is the largest --max-response. Stored responses are
// read with room for it and their head whatever --max-response says now
// (readLimit), so that lowering the flag never makes records written
// before unreadable: the limit applies when storing only.
const (
	maxResponseLimit = 1 << 30
	readLimit        = maxResponseLimit + 1<<20
)

// errorHandler returns the ErrorHandler that --error-body asks for,
// reading the template file of @FILE.
func (c *proxyConfig) errorHandler() (idemhttp.ErrorHandler, error) {
	v := strings.TrimSpace(c.errorBody)
	switch {
	case v == "problem":
		return idemhttp.WriteProblem, nil
	case v == "stripe":
		return idemhttp.WriteStripeError, nil
	case strings.HasPrefix(v, "@"):
		tmpl, err := os.ReadFile(v[1:])
		if err != nil {
			return nil, usagef("--error-body: cannot read the template: %v", err)
		}
		h, err := idemhttp.TemplateErrorHandler(tmpl)
		if err != nil {
			return nil, usagef("--error-body: invalid template in %s: %v", v[1:], err)
		}
		return h, nil
	case strings.HasPrefix(v, "{") || strings.HasPrefix(v, "["):
		h, err := idemhttp.TemplateErrorHandler([]byte(v))
		if err != nil {
			return nil, usagef("--error-body: invalid template: %v", err)
		}
		return h, nil
	}
	return nil, usagef("invalid --error-body %q: want problem, stripe, a JSON template or @FILE", c.errorBody)
}

// waitFor returns how long a retry waits for the first request (--wait).
// With --error-body stripe the default is the lease: stripe-go never
// retries a 409 it decoded (see idemhttp.WriteStripeError), so a retry
// that its SDK sends while the first request runs must wait for its
// response; the lease bounds the wait, as the first request is taken over
// once it ends.
func (c *proxyConfig) waitFor() time.Duration {
	if !c.waitSet && strings.TrimSpace(c.errorBody) == "stripe" {
		return c.lease
	}
	return c.wait
}

// policy returns the Policy that --store-policy names, nil if none.
func (c *proxyConfig) policy() idemhttp.Policy {
	for _, p := range storePolicies {
		if p.name == c.storePolicy {
			return p.policy
		}
	}
	return nil
}

func validToken(s string) bool {
	if s == "" {
		return false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		if c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || strings.IndexByte("!#$%&'*+-.^_`|~", c) >= 0 {
			continue
		}
		return false
	}
	return true
}

func parseLevel(s string) (slog.Level, error) {
	var l slog.Level
	if err := l.UnmarshalText([]byte(s)); err != nil {
		return 0, usagef("invalid --log-level %q: want debug, info, warn or error", s)
	}
	return l, nil
}

func newLogger(e *env, format, level string) *slog.Logger {
	l, _ := parseLevel(level)
	opts := &slog.HandlerOptions{Level: l}
	if format == "json" {
		return slog.New(slog.NewJSONHandler(e.stderr, opts))
	}
	return slog.New(slog.NewTextHandler(e.stderr, opts))
}

// checkReachable dials the upstream's TCP address.
func checkReachable(ctx context.Context, u *url.URL) error {
	host := u.Host
	if u.Port() == "" {
		port := "80"
		if u.Scheme == "https" {
			port = "443"
		}
		host = net.JoinHostPort(u.Hostname(), port)
	}
	d := net.Dialer{Timeout: connectTimeout}
	conn, err := d.DialContext(ctx, "tcp", host)
	if err != nil {
		return fmt.Errorf("upstream %s is not reachable: %v (start it first, or pass --check-upstream=false)", redactURL(u.String()), cause(err))
	}
	conn.Close()
	return nil
}

func newTransport(timeout time.Duration) *http.Transport {
	return &http.Transport{
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
}

func runProxy(ctx context.Context, e *env, c *proxyConfig) error {
	target, err := c.validate()
	if err != nil {
		return err
	}
	errorHandler, err := c.errorHandler()
	if err != nil {
		return err
	}
	log := hidingLogger(newLogger(e, c.logFormat, c.logLevel), e.hider)
	redisLog.l.Store(log)
	if c.checkUpstream {
		if err := checkReachable(ctx, target); err != nil {
			return err
		}
	}
	c.store.logger = log
	opened, err := c.store.open(ctx, true)
	if err != nil {
		return err
	}
	storeClosed := false
	closeStore := func() {
		if !storeClosed {
			storeClosed = true
			if err := opened.close(); err != nil {
				log.Error("closing the store", "store", opened.describe, "error", err)
			}
		}
	}
	defer closeStore()

	obs := newObserver()
	store := opened.store
	var tr *tracing
	shutdownTracing := func() {}
	if c.tracing.endpoint != "" {
		tr, err = c.tracing.start(ctx, log, e.getenv)
		if err != nil {
			return err
		}
		tracingStopped := false
		stopTracing := func() {
			if !tracingStopped {
				tracingStopped = true
				if err := tr.shutdown(); err != nil {
					log.Warn("tracing: flushing the last spans failed", "error", err)
				}
			}
		}
		defer stopTracing()
		shutdownTracing = stopTracing
		obs.traced = true
		// Under the metrics decorator: the spans time the store alone.
		// Both keep idem.Watcher.
		store = tr.store(store)
	}
	exec, err := idem.New(obs.instrument(store),
		idem.WithLease(c.lease), idem.WithRetention(c.retention), idem.WithMaxResultSize(readLimit),
		idem.WithObserver(obs.exec.Observe))
	if err != nil {
		return usagef("%v", err)
	}
	// The store's gauges (records by state, memory), where it counts them.
	if sc, err := prometheusidem.NewStoreCollector(store); err == nil {
		obs.reg.MustRegister(sc)
	}
	opts := []idemhttp.Option{
		idemhttp.WithMethods(c.methods...),
		idemhttp.WithKeyRequired(c.requireKey),
		idemhttp.WithMaxBodySize(c.maxBody),
		idemhttp.WithMaxResponseSize(int(c.maxResponse)),
		idemhttp.WithMaxBufferedBodies(c.maxBodyMemory),
		idemhttp.WithWait(c.waitFor()),
		idemhttp.WithFailOpen(c.failOpen),
		idemhttp.WithLogger(log),
		idemhttp.WithHook(obs.hook),
		idemhttp.WithPolicy(proxyPolicy(c.policy())),
		idemhttp.WithErrorHandler(errorHandler),
		idemhttp.WithProblemTypeBase(c.typeBase),
		// ReverseProxy flushes every response of unknown length (chunked):
		// only text/event-stream and bodies over --max-response stream;
		// the rest is stored before it is sent.
		idemhttp.WithStreamOnFlush(false),
		idemhttp.WithStreamAll(c.streamAll),
	}
	if c.scopeHeader != "" {
		name := http.CanonicalHeaderKey(c.scopeHeader)
		opts = append(opts, idemhttp.WithPrincipal(func(r *http.Request) string {
			if v := r.Header[name]; len(v) > 0 {
				return v[0]
			}
			return ""
		}), idemhttp.WithEmptyPrincipal(c.anonymousScope))
	}
	mw, err := idemhttp.New(exec, opts...)
	if err != nil {
		return usagef("%v", err)
	}
	gw := newGateway(target, newTransport(c.upstreamTimeout), mw, c.methods, c.lease, obs, log)
	gw.tracing = tr
	gw.writeTimeout = c.writeTimeout
	gw.bodyTimeout, gw.maxActive = c.bodyTimeout, int64(c.maxConcurrent)
	if c.fenceHeader != "" {
		gw.fenceHeader = http.CanonicalHeaderKey(c.fenceHeader)
	}

	ln, err := net.Listen("tcp", c.listen)
	if err != nil {
		return fmt.Errorf("cannot listen on %s: %v", c.listen, cause(err))
	}
	srv := &http.Server{
		Handler:           gw,
		ReadHeaderTimeout: 10 * time.Second,
		IdleTimeout:       2 * time.Minute,
		ErrorLog:          slog.NewLogLogger(log.Handler(), slog.LevelWarn),
	}
	var draining atomic.Bool
	var admin *http.Server
	var adminLn net.Listener
	if c.adminListen != "" {
		adminLn, err = net.Listen("tcp", c.adminListen)
		if err != nil {
			ln.Close()
			return fmt.Errorf("cannot listen on %s (--admin-listen): %v", c.adminListen, cause(err))
		}
		admin = &http.Server{Handler: adminHandler(obs, opened, &draining), ReadHeaderTimeout: 10 * time.Second}
		go admin.Serve(adminLn)
	}

	attrs := []any{"listen", ln.Addr().String(), "upstream", redactURL(target.String()), "store", opened.describe,
		"methods", strings.Join(c.methods, ","), "lease", formatDuration(c.lease), "retention", formatDuration(c.retention)}
	if adminLn != nil {
		attrs = append(attrs, "admin", adminLn.Addr().String())
	}
	if tr != nil {
		u, _ := c.tracing.exportURL()
		attrs = append(attrs, "otel_endpoint", redactURL(u))
	}
	log.Info("idem proxy started", attrs...)

	serveErr := make(chan error, 1)
	go func() { serveErr <- srv.Serve(ln) }()
	select {
	case err := <-serveErr:
		return fmt.Errorf("serving on %s: %v", c.listen, err)
	case <-ctx.Done():
	}

	log.Info("idem proxy shutting down: finishing requests in flight", "in_flight", obs.inFlight.Load(), "timeout", formatDuration(c.shutdownTimeout))
	draining.Store(true)
	sctx, cancel := context.WithTimeout(context.Background(), c.shutdownTimeout)
	defer cancel()
	clean := true
	if err := srv.Shutdown(sctx); err != nil {
		clean = false
		// Clients still being sent a response (slow readers) lose their
		// connection. The handlers go on: a response held for storing was
		// stored already; the rest of one being streamed is read from the
		// upstream, and its key stored or failed, before the store closes.
		log.Warn("requests still in flight after the shutdown timeout; closing their connections and storing what the upstream answered",
			"in_flight", obs.inFlight.Load(), "error", err)
		srv.Close()
		if !gw.drain(c.shutdownTimeout) {
			log.Error("requests still in flight after closing their connections; their keys stay in progress until their leases end",
				"in_flight", obs.inFlight.Load())
		}
	}
	if admin != nil {
		actx, acancel := context.WithTimeout(context.Background(), time.Second)
		_ = admin.Shutdown(actx)
		acancel()
	}
	shutdownTracing()
	closeStore()
	log.Info("idem proxy stopped", "clean", clean)
	return nil
}

// adminHandler serves /metrics, /healthz (the process runs) and /readyz
// (the store answers, its last check found it fit, and the proxy is not
// shutting down).
func adminHandler(obs *observer, opened *openedStore, draining *atomic.Bool) http.Handler {
	store := opened.store
	mux := http.NewServeMux()
	mux.Handle("GET /metrics", obs.handler())
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		fmt.Fprintln(w, "ok")
	})
	mux.HandleFunc("GET /readyz", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		if draining.Load() {
			w.WriteHeader(http.StatusServiceUnavailable)
			fmt.Fprintln(w, "not ready: shutting down")
			return
		}
		ctx, cancel := context.WithTimeout(r.Context(), 2*time.Second)
		defer cancel()
		if _, err := store.Get(ctx, readyProbeKey); err != nil && !errors.Is(err, idem.ErrNotFound) {
			w.WriteHeader(http.StatusServiceUnavailable)
			fmt.Fprintf(w, "not ready: store: %v\n", err)
			return
		}
		if opened.health != nil {
			if err := opened.health(); err != nil {
				w.WriteHeader(http.StatusServiceUnavailable)
				fmt.Fprintf(w, "not ready: %v\n", storeError(err))
				return
			}
		}
		fmt.Fprintln(w, "ready")
	})
	return mux
}
