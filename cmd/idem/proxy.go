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
	"runtime"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"

	"github.com/idemgo/idem"
	"github.com/idemgo/idem/adapterkit"
	"github.com/idemgo/idem/cmd/idem/internal/certreload"
	"github.com/idemgo/idem/cmd/idem/internal/cli"
	"github.com/idemgo/idem/cmd/idem/internal/redact"
	"github.com/idemgo/idem/cmd/idem/internal/routesfile"
	"github.com/idemgo/idem/cmd/idem/internal/serving"
	"github.com/idemgo/idem/cmd/idem/internal/size"
	"github.com/idemgo/idem/cmd/idem/internal/tracing"
	"github.com/idemgo/idem/idemhttp"
	"github.com/idemgo/idem/idemproxy"
	"github.com/idemgo/idem/observe"
	"github.com/idemgo/idem/prometheusidem"
)

// proxyConfig is the configuration of `idem proxy`: the idemproxy.Proxy
// whose fields its flags set, and its other flags.
type proxyConfig struct {
	proxy           idemproxy.Proxy
	listen          string
	upstream        string
	store           storeFlags
	lease           time.Duration
	retention       time.Duration
	storePolicy     string
	errorBody       string
	waitSet         bool // --wait was given
	keyFromSet      bool // --key-from was given
	policySet       bool // --store-policy was given
	webhook         string
	webhookSecrets  string // --webhook-secret-file
	routesPath      string // --routes
	routes          []routesfile.Route
	adminListen     string
	logFormat       string
	logLevel        string
	shutdownTimeout time.Duration
	checkUpstream   bool
	tlsCert         string
	tlsKey          string
	h2c             bool
	tracing         tracingFlags
	defs            []cli.Def // the flag table
}

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
		flags: func(fs *cli.Set) func(context.Context, *env, []string) error {
			c := registerProxyFlags(fs)
			return func(ctx context.Context, e *env, args []string) error {
				if len(args) > 0 {
					return cli.Usagef("proxy: unexpected argument %q (boolean flags take the form --fail-open=true)", args[0])
				}
				c.waitSet, c.keyFromSet, c.policySet = fs.IsSet("wait"), fs.IsSet("key-from"), fs.IsSet("store-policy")
				return runProxy(ctx, e, c)
			}
		},
	}
}

// registerProxyFlags defines the proxy's flags on fs and returns the
// configuration they fill. The variables hold the defaults, which are
// idemproxy's own where a flag sets a field of the Proxy.
func registerProxyFlags(fs *cli.Set) *proxyConfig {
	c := &proxyConfig{
		listen:          "127.0.0.1:8080",
		lease:           adapterkit.DefaultLease,
		retention:       adapterkit.DefaultRetention,
		storePolicy:     "default",
		errorBody:       "problem",
		logFormat:       "text",
		logLevel:        "info",
		shutdownTimeout: 30 * time.Second,
		checkUpstream:   true,
	}
	p := &c.proxy
	p.Methods = []string{http.MethodPost, http.MethodPatch}
	p.MaxBodySize, p.MaxResponseSize, p.MaxBodyMemory = idemhttp.DefaultMaxBodySize, adapterkit.DefaultMaxResultSize, idemproxy.DefaultMaxBodyMemory
	p.ProblemTypeBase, p.FenceHeader = idemhttp.DefaultProblemTypeBase, idemproxy.DefaultFenceHeader
	p.BodyTimeout, p.UpstreamTimeout, p.WriteTimeout = idemproxy.DefaultBodyTimeout, idemproxy.DefaultUpstreamTimeout, idemproxy.DefaultWriteTimeout
	p.MaxConcurrent = idemproxy.DefaultMaxConcurrent
	c.defs = append(append([]cli.Def{
		{Name: "listen", Placeholder: "ADDR", Value: cli.String(&c.listen), Usage: "address the proxy serves on"},
		{Name: "upstream", Placeholder: "URL", Value: cli.String(&c.upstream), Secret: cli.URLSecret, Field: "Target", Usage: "URL of the API behind the proxy, e.g. http://127.0.0.1:9000; required"},
	}, c.store.flags()...), []cli.Def{
		{Name: "methods", Placeholder: "LIST", Value: cli.List(&p.Methods, true), Field: "Methods", Usage: "request methods made idempotent; others pass through"},
		{Name: "require-key", Value: cli.Not(&p.KeyOptional), Usage: "answer 400 to a covered request without its key (=false: pass it through unprotected)"},
		{Name: "key-from", Placeholder: "SOURCE", Value: cli.KeySource(&p.KeySource), Field: "KeySource", Usage: "where a covered request's key is: header:NAME, or json:POINTER for a member of a JSON body (an RFC 6901 JSON Pointer, e.g. json:/id); a body that is not JSON or lacks the member gets the 400 of a missing key"},
		{Name: "webhook", Placeholder: "PROVIDER", Value: cli.String(&c.webhook), Usage: "receive webhooks from github, stripe, shopify or standard-webhooks: the key is the provider's delivery id (--key-from overrides it), the signature is checked before the key is taken when a secret is given (IDEM_WEBHOOK_SECRET or --webhook-secret-file; a bad one gets 401 and touches no record), --wait defaults to --lease, and without a secret only 2xx answers are stored (see docs/webhooks.md)"},
		{Name: "webhook-secret-file", Placeholder: "FILE", Value: cli.String(&c.webhookSecrets), Usage: "file of the --webhook secrets, one per line (several during a rotation); the environment variable IDEM_WEBHOOK_SECRET may hold them instead, one per line"},
		{Name: "routes", Placeholder: "FILE", Value: cli.String(&c.routesPath), Usage: "YAML or JSON file of routes: a method and path prefix each, with its own key_from, fingerprint, methods, store_policy, lease, wait and webhook; the other flags are the default route (see docs/webhooks.md)"},
		{Name: "fingerprint", Placeholder: "SPEC", Value: cli.Fingerprint(&p.Fingerprint), Field: "Fingerprint", Usage: "what of a covered request's body tells a retry from another request with the same key (422): body, none, or json:POINTER,POINTER... (only those members, in canonical JSON); the method, path and query always count"},
		{Name: "lease", Placeholder: "DURATION", Value: cli.Duration(&c.lease), Usage: "how long a request holds its key before another may take it over; extended while the upstream works"},
		{Name: "retention", Placeholder: "DURATION", Value: cli.Duration(&c.retention), Usage: "how long responses are kept and replayed"},
		{Name: "max-body", Placeholder: "SIZE", Value: cli.Size(&p.MaxBodySize), Field: "MaxBodySize", Usage: "largest request body (larger: 413), e.g. 1MiB, 512KiB, 1048576"},
		{Name: "max-response", Placeholder: "SIZE", Value: cli.Size(&p.MaxResponseSize), Field: "MaxResponseSize", Usage: "largest response body stored (larger: sent once, then the key is FAILED and retries get 422); it limits storing only: responses stored under a larger value stay replayable"},
		{Name: "scope-header", Placeholder: "NAME", Value: cli.String(&p.ScopeHeader), Field: "ScopeHeader", Usage: "scope keys by the value of this request header (hashed), e.g. Authorization; a covered request without it gets 400"},
		{Name: "allow-missing-scope", Value: cli.Bool(&p.AllowMissingScope), Usage: "with --scope-header, serve covered requests without the header in one shared scope (anonymous clients can then get each other's responses) instead of 400"},
		{Name: "store-policy", Placeholder: "NAME", Value: cli.String(&c.storePolicy), Usage: "which upstream answers are stored: default (all but 408, 409, 425, 429, 503), release-5xx (also retry every 5xx), only-2xx (retry every non-2xx: a retry after a 4xx or 5xx that followed a side effect repeats it)"},
		{Name: "fence-header", Placeholder: "NAME", Value: cli.OrOff(&p.FenceHeader, &p.DisableFence), Field: "FenceHeader", Usage: "request header that tells the upstream the request's fencing token; a client's own is removed (empty: off)"},
		{Name: "error-body", Placeholder: "SHAPE", Value: cli.String(&c.errorBody), Usage: "shape of error bodies: problem (RFC 9457 application/problem+json), stripe (Stripe's preset: {\"error\":{...}} with Stripe-Should-Retry, 400 for a key reused with other parameters, and --wait of --lease by default, for Stripe's SDKs), a JSON template, or @FILE holding one (placeholders {{type}} {{code}} {{title}} {{detail}} {{status}} {{retry}})"},
		{Name: "problem-type-base", Placeholder: "URI", Value: cli.String(&p.ProblemTypeBase), Field: "ProblemTypeBase", Usage: "base of the type URIs of error bodies: each is the base followed by the kind's name (key-mismatch, in-progress, ...; see docs/problems.md), e.g. https://docs.example.com/errors#"},
		{Name: "wait", Placeholder: "DURATION", Value: cli.Duration(&p.Wait), Field: "Wait", Usage: "how long a retry waits for the first request to finish before 409 (0: answer 409 at once; with --error-body stripe the default is --lease)"},
	}...)
	c.defs = append(append(append(c.defs, c.store.waitFlags()...), c.store.proxyFlags()...), []cli.Def{
		{Name: "fail-open", Value: cli.Bool(&p.FailOpen), Usage: "when the store is unreachable, forward requests unprotected instead of answering 503"},
		{Name: "body-timeout", Placeholder: "DURATION", Value: cli.Bound(&p.BodyTimeout), Usage: "how long a request's body may take to arrive, from its header (then 408, or a cut-off upstream request if not covered; 0: no limit)"},
		{Name: "max-concurrent", Placeholder: "N", Value: cli.BoundInt(&p.MaxConcurrent), Usage: "requests handled at once; more get 503 with Retry-After (0: no limit)"},
		{Name: "max-body-memory", Placeholder: "SIZE", Value: cli.Size(&p.MaxBodyMemory), Usage: "memory for the bodies of covered requests held at once, beyond the first 16KiB of each (a body that would go over it: 503 with Retry-After)"},
		{Name: "upstream-timeout", Placeholder: "DURATION", Value: cli.Bound(&p.UpstreamTimeout), Usage: "how long to wait for the upstream's response header (0: no limit); then 504"},
		{Name: "shutdown-timeout", Placeholder: "DURATION", Value: cli.Duration(&c.shutdownTimeout), Usage: "how long a shutdown waits for requests in flight before it closes their connections"},
		{Name: "write-timeout", Placeholder: "DURATION", Value: cli.Bound(&p.WriteTimeout), Usage: "how long a client may take to receive a response, from its first byte (0: no limit; text/event-stream responses have none)"},
		{Name: "stream-all", Value: cli.Bool(&p.StreamAll), Usage: "send every response as the upstream sends it, end included, and store it afterwards (a client may then be told a success that was not recorded)"},
		{Name: "admin-listen", Placeholder: "ADDR", Value: cli.String(&c.adminListen), Usage: "address for /metrics, /healthz and /readyz (empty: off)"},
		{Name: "log-format", Placeholder: "FORMAT", Value: cli.String(&c.logFormat), Usage: "log format: text or json"},
		{Name: "log-level", Placeholder: "LEVEL", Value: cli.String(&c.logLevel), Usage: "log level: debug, info, warn or error"},
		{Name: "check-upstream", Value: cli.Bool(&c.checkUpstream), Usage: "refuse to start when the upstream does not accept TCP connections"},
		{Name: "tls-cert", Placeholder: "FILE", Value: cli.String(&c.tlsCert), Usage: "serve HTTPS (TLS 1.2 or later, HTTP/2 and HTTP/1.1) with this PEM certificate chain, with --tls-key; both are read again on SIGHUP and when they change"},
		{Name: "tls-key", Placeholder: "FILE", Value: cli.String(&c.tlsKey), Usage: "the PEM private key of --tls-cert"},
		{Name: "h2c", Value: cli.Bool(&c.h2c), Usage: "also serve HTTP/2 without TLS (h2c with prior knowledge, as gRPC clients without TLS send) beside HTTP/1.1"},
		{Name: "upstream-h2c", Value: cli.Bool(&p.UpstreamH2C), Field: "UpstreamH2C", Usage: "speak HTTP/2 without TLS (h2c) to an http upstream, such as a gRPC server; an https upstream gets HTTP/2 when it offers it"},
	}...)
	c.defs = append(c.defs, c.tracing.flags()...)
	fs.Define(c.defs...)
	return c
}

// maxResponseLimit is the largest --max-response. Stored responses are
// read with room for it and their head whatever --max-response says now
// (readLimit), so that lowering the flag never makes records written
// before unreadable: the limit applies when storing only.
const (
	maxResponseLimit = 1 << 30
	readLimit        = maxResponseLimit + 1<<20
)

// validate checks the configuration without I/O, and sets the Proxy's
// Target.
func (c *proxyConfig) validate() error {
	if c.upstream == "" {
		return cli.Usagef("proxy: --upstream is required (the URL of the API behind the proxy, e.g. --upstream http://127.0.0.1:9000)")
	}
	u, err := url.Parse(c.upstream)
	if err != nil {
		return cli.URLError("--upstream", c.upstream, err, "http")
	}
	c.proxy.Target = u
	if err := c.proxy.Check(); err != nil {
		return c.fieldError(err)
	}
	_, levelErr := parseLevel(c.logLevel)
	return cli.FirstError(
		c.store.validate(),
		checkAddr("--listen", c.listen),
		cli.Check((c.tlsCert == "") != (c.tlsKey == ""), "--tls-cert and --tls-key go together"),
		checkAddr("--admin-listen", c.adminListen),
		cli.Check(c.lease < time.Millisecond, "--lease %v is too short", c.lease),
		cli.Check(c.retention < c.lease, "--retention %v is shorter than --lease %v", c.retention, c.lease),
		cli.Check(c.proxy.MaxResponseSize > maxResponseLimit, "--max-response %s is over the limit of 1GiB", size.Format(int64(c.proxy.MaxResponseSize))),
		cli.Check(c.shutdownTimeout <= 0, "--shutdown-timeout must be positive"),
		cli.Check(c.logFormat != "text" && c.logFormat != "json", "invalid --log-format %q: want text or json", c.logFormat),
		cli.Check(c.policy() == nil, "invalid --store-policy %q: want default, release-5xx or only-2xx", c.storePolicy),
		cli.Check(c.proxy.ProblemTypeBase == "", "invalid --problem-type-base \"\": want an absolute URI, e.g. https://docs.example.com/errors#"),
		levelErr,
		c.tracing.validate(),
	)
}

// checkAddr checks the host:port of an address flag ("" is off).
func checkAddr(flag, addr string) error {
	if _, _, err := net.SplitHostPort(addr); addr != "" && err != nil {
		return cli.Usagef("invalid %s %q: want host:port", flag, addr)
	}
	return nil
}

// fieldError returns an error of the Proxy's Check or Init as the usage
// error of the flag that sets the field.
func (c *proxyConfig) fieldError(err error) error {
	var fe *idemproxy.FieldError
	if errors.As(err, &fe) {
		for _, d := range c.defs {
			switch {
			case d.Field != fe.Field:
			case d.Secret == cli.URLSecret:
				return cli.URLError("--"+d.Name, d.Value.String(), errors.New(fe.Reason), "http")
			default:
				return cli.Usagef("--%s: %s", d.Name, fe.Reason)
			}
		}
	}
	return cli.Usagef("%v", err)
}

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
			return nil, cli.Usagef("--error-body: cannot read the template: %v", err)
		}
		h, err := idemhttp.TemplateErrorHandler(tmpl)
		if err != nil {
			return nil, cli.Usagef("--error-body: invalid template in %s: %v", v[1:], err)
		}
		return h, nil
	case strings.HasPrefix(v, "{") || strings.HasPrefix(v, "["):
		h, err := idemhttp.TemplateErrorHandler([]byte(v))
		if err != nil {
			return nil, cli.Usagef("--error-body: invalid template: %v", err)
		}
		return h, nil
	}
	return nil, cli.Usagef("invalid --error-body %q: want problem, stripe, a JSON template or @FILE", c.errorBody)
}

// webhookSecretEnv is the environment variable that may hold the
// --webhook secrets, one per line. It is no flag's: a secret never
// appears on a command line, in the help or in a log.
const webhookSecretEnv = "IDEM_WEBHOOK_SECRET"

// setupWebhook applies --webhook to the Proxy: the provider's key source
// unless --key-from was given, its Verifier when a secret is given, and
// otherwise the only-2xx policy unless --store-policy was given, and the
// lease as the wait unless --wait was given. It
// returns whether signatures are checked.
func (c *proxyConfig) setupWebhook(getenv func(string) string) (bool, error) {
	rc, err := routesfile.Webhook{
		Provider: c.webhook, Name: "--webhook",
		SecretFile: c.webhookSecrets, SecretFileName: "--webhook-secret-file",
		SecretEnv: webhookSecretEnv, DefaultEnv: true,
		Getenv: getenv,
	}.Setup()
	if err != nil {
		return false, cli.Usagef("%v", err)
	}
	if c.webhook == "" {
		return false, nil
	}
	if !c.keyFromSet {
		c.proxy.KeySource = rc.KeySource
	}
	c.proxy.Verifier = rc.Verifier
	c.storePolicy = rc.StorePolicy(c.storePolicy, c.policySet)
	c.proxy.Wait = rc.Wait(c.proxy.Wait, c.waitSet, c.lease)
	return rc.Verifier != nil, nil
}

// waitFor returns how long a retry waits for the first request (--wait).
// With --error-body stripe the default is the lease: stripe-go never
// retries a 409 it decoded (see idemhttp.WriteStripeError), so a retry
// that its SDK sends while the first request runs must wait for its
// response; the lease bounds the wait, as the first request is taken over
// once it ends. With --webhook, setupWebhook has set the default
// (routesfile.Receiver.Wait).
func (c *proxyConfig) waitFor() time.Duration {
	if !c.waitSet && strings.TrimSpace(c.errorBody) == "stripe" {
		return c.lease
	}
	return c.proxy.Wait
}

// storePolicies are the values of --store-policy.
var storePolicies = []struct {
	name   string
	policy idemhttp.Policy
}{
	{"default", idemhttp.DefaultPolicy},
	{"release-5xx", idemhttp.ReleaseServerErrors},
	{"only-2xx", idemhttp.StoreSuccessOnly},
}

// policy returns the Policy that --store-policy names, nil if none.
func (c *proxyConfig) policy() idemhttp.Policy { return policyNamed(c.storePolicy) }

// policyNamed returns the Policy of a --store-policy value, nil if none.
func policyNamed(name string) idemhttp.Policy {
	for _, p := range storePolicies {
		if p.name == name {
			return p.policy
		}
	}
	return nil
}

func parseLevel(s string) (slog.Level, error) {
	var l slog.Level
	if err := l.UnmarshalText([]byte(s)); err != nil {
		return 0, cli.Usagef("invalid --log-level %q: want debug, info, warn or error", s)
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
		return fmt.Errorf("upstream %s is not reachable: %v (start it first, or pass --check-upstream=false)", redact.URL(u.String()), cli.Cause(err))
	}
	conn.Close()
	return nil
}

// runProxy runs `idem proxy`: build, serve until ctx is done, drain. The
// store and the tracing close in its defers, after the drain.
func runProxy(ctx context.Context, e *env, c *proxyConfig) error {
	if err := c.validate(); err != nil {
		return err
	}
	errorHandler, err := c.errorHandler()
	if err != nil {
		return err
	}
	verified, err := c.setupWebhook(e.getenv)
	if err != nil {
		return err
	}
	c.routes, err = routesfile.Load(c.routesPath, routesfile.Defaults{
		Lease: c.lease, KeyOptional: c.proxy.KeyOptional, Methods: c.proxy.Methods, Policy: policyNamed, Getenv: e.getenv,
	})
	if err != nil {
		return err
	}
	log := redact.Logger(newLogger(e, c.logFormat, c.logLevel), e.hider)
	if c.webhook != "" && !verified {
		log.Warn("--webhook without a secret: signatures are not checked, so only 2xx answers are stored (a forged delivery that carries a real delivery's id could otherwise store its answer for it); give the secret in "+webhookSecretEnv+" or --webhook-secret-file",
			"webhook", c.webhook, "store_policy", c.storePolicy)
	}
	redisLog.l.Store(log)
	if c.checkUpstream {
		if err := checkReachable(ctx, c.proxy.Target); err != nil {
			return err
		}
	}
	c.store.logger = log
	st, err := c.store.open(ctx, true)
	if err != nil {
		return err
	}
	defer closeStore(st, log)
	tr, err := c.tracing.start(ctx, log, e.getenv)
	if err != nil {
		return err
	}
	defer tr.Shutdown(log)
	s, err := c.build(st, tr, errorHandler, log)
	if err != nil {
		return err
	}
	if err := s.Serve(ctx); err != nil {
		return err
	}
	s.Drain(c.shutdownTimeout)
	return nil
}

func closeStore(st *openedStore, log *slog.Logger) {
	if err := st.Close(); err != nil {
		log.Error("closing the store", "store", st.Describe, "error", err)
	}
}

// proxyServer is a built proxy: its servers, listening.
type proxyServer = serving.Server

// build makes the Executors, the Proxy, its metrics and its servers, and
// opens their listeners.
func (c *proxyConfig) build(st *openedStore, tr *tracing.Tracing, errorHandler idemhttp.ErrorHandler, log *slog.Logger) (*proxyServer, error) {
	reg, execMetrics := newRegistry(st.Store)
	if err := c.executors(tr.Store(st.Store), execMetrics.Observe); err != nil {
		return nil, err
	}
	p := &c.proxy
	p.Logger, p.ErrorHandler, p.Policy, p.Wait = log, errorHandler, c.policy(), c.waitFor()
	metrics, err := prometheusidem.NewProxyMetrics(p.InFlight)
	if err != nil {
		return nil, err
	}
	reg.MustRegister(metrics)
	p.Observer = metrics.Observe
	handler := tr.Handler(p)
	if err := p.Init(); err != nil {
		return nil, c.fieldError(err)
	}
	s := &proxyServer{Proxy: p, Log: log, Srv: &http.Server{
		Handler:           handler,
		ReadHeaderTimeout: 10 * time.Second,
		IdleTimeout:       2 * time.Minute,
		ErrorLog:          slog.NewLogLogger(log.Handler(), slog.LevelWarn),
	}}
	s.Srv.Protocols = new(http.Protocols)
	s.Srv.Protocols.SetHTTP1(true)
	s.Srv.Protocols.SetUnencryptedHTTP2(c.h2c)
	if c.tlsCert != "" {
		if s.Certs, err = certreload.New(c.tlsCert, c.tlsKey, log); err != nil {
			return nil, cli.Usagef("%v", err)
		}
		s.Srv.TLSConfig = s.Certs.Config()
		s.Srv.Protocols.SetHTTP2(true)
	}
	if err := c.openListeners(s, st, reg, tr); err != nil {
		return nil, err
	}
	return s, nil
}

// executors makes the Executors over store, each observed by observe: the
// default route's, of --lease, and one for each other lease of --routes.
// It sets them on the Proxy and on its Routes.
func (c *proxyConfig) executors(store idem.Store, observe observe.Observer) error {
	execs := make(map[time.Duration]*idem.Executor)
	executor := func(lease time.Duration) (*idem.Executor, error) {
		if execs[lease] == nil {
			e, err := idem.New(store, idem.WithLease(lease), idem.WithRetention(max(c.retention, lease)),
				idem.WithMaxResultSize(readLimit), idem.WithObserver(observe))
			if err != nil {
				return nil, err
			}
			execs[lease] = e
		}
		return execs[lease], nil
	}
	p := &c.proxy
	var err error
	if p.Executor, err = executor(c.lease); err != nil {
		return cli.Usagef("%v", err)
	}
	p.Routes = nil
	for _, lr := range c.routes {
		rt := lr.Route
		if rt.Executor, err = executor(lr.Lease); err != nil {
			return cli.Usagef("--routes: %v", err)
		}
		p.Routes = append(p.Routes, rt)
	}
	return nil
}

// openListeners opens the listeners of the built server s and its admin server
// (serving the metrics of reg), and fills what its start logs.
func (c *proxyConfig) openListeners(s *proxyServer, st *openedStore, reg *prometheus.Registry, tr *tracing.Tracing) (err error) {
	p := s.Proxy
	if s.Ln, err = net.Listen("tcp", c.listen); err != nil {
		return fmt.Errorf("cannot listen on %s: %v", c.listen, cli.Cause(err))
	}
	s.Started = []any{"listen", s.Ln.Addr().String(), "upstream", redact.URL(p.Target.String()), "store", st.Describe,
		"methods", strings.Join(p.Methods, ","), "lease", cli.FormatDuration(c.lease), "retention", cli.FormatDuration(c.retention),
		"tls", c.tlsCert != "", "h2c", c.h2c, "upstream_h2c", p.UpstreamH2C}
	if c.adminListen != "" {
		if s.AdminLn, err = net.Listen("tcp", c.adminListen); err != nil {
			s.Ln.Close()
			return fmt.Errorf("cannot listen on %s (--admin-listen): %v", c.adminListen, cli.Cause(err))
		}
		s.Admin = &http.Server{Handler: serving.AdminMux(reg, p.Ready), ReadHeaderTimeout: 10 * time.Second}
		s.Started = append(s.Started, "admin", s.AdminLn.Addr().String())
	}
	if len(c.routes) > 0 {
		s.Started = append(s.Started, "routes", len(c.routes))
	}
	if c.webhook != "" {
		s.Started = append(s.Started, "webhook", c.webhook, "key_from", p.KeySource.String(), "signatures_checked", p.Verifier != nil)
	}
	if tr != nil {
		u, _ := c.tracing.exportURL()
		s.Started = append(s.Started, "otel_endpoint", redact.URL(u))
	}
	return nil
}

// newRegistry returns the registry of /metrics with the Executor's
// outcomes (returned, for its observer), the store's gauges where it
// counts its records, the Go runtime's and the process's, and the
// binary's version.
func newRegistry(store idem.Store) (*prometheus.Registry, *prometheusidem.Metrics) {
	reg := prometheus.NewRegistry()
	exec, err := prometheusidem.New(prometheusidem.WithScopeKinds("http"))
	if err != nil {
		panic(err) // the options are fixed
	}
	build := prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "idem_build_info", Help: "The idem binary's version."}, []string{"version", "goversion"})
	build.WithLabelValues(version(), runtime.Version()).Set(1)
	reg.MustRegister(exec, build, collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	if sc, err := prometheusidem.NewStoreCollector(store); err == nil {
		reg.MustRegister(sc)
	}
	return reg, exec
}
