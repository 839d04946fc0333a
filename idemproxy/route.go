package idemproxy

import (
	"fmt"
	"net/http"
	"strings"
	"time"

	"github.com/idemgo/idem"
	"github.com/idemgo/idem/idemhttp"
	"github.com/idemgo/idem/internal/httpsyntax"
	"github.com/idemgo/idem/keysource"
)

// Route configures the covered requests of one method and path prefix
// apart from the rest, for a proxy in front of an API with several
// senders (a webhook receiver beside an API whose clients send
// Idempotency-Key). A request whose method is one of Methods and whose
// path is PathPrefix or lies under it gets the route's settings; one
// that matches no route gets the Proxy's own fields. Routes may not
// overlap (see CheckRoutes), so at most one matches.
//
// A field left zero takes the Proxy's field of the same name (Executor,
// Methods, KeySource, Fingerprint, Policy, Wait, Verifier); a zero
// Fingerprint therefore covers what Proxy.Fingerprint covers. Each route
// bounds the memory of its bodies by MaxBodyMemory on its own.
type Route struct {
	// PathPrefix is the path the route covers, and every path under it
	// segment by segment: /hooks covers /hooks and /hooks/github, not
	// /hooksx. It starts with / and has no query, no empty, . or ..
	// segment. Required.
	PathPrefix string

	// Methods are the methods the route covers; a request with another
	// method is left to the other routes and the Proxy's fields.
	Methods []string

	// Executor runs the route's requests: another one over the same
	// store gives the route another lease or retention.
	Executor *idem.Executor

	// KeyOptional passes the route's covered requests without a key
	// through, unprotected (a body without the key member included).
	// false: the Proxy's KeyOptional.
	KeyOptional bool

	// KeySource, Fingerprint, Policy, Wait and Verifier are the Proxy's
	// fields of the same name, for this route. A negative Wait: no wait,
	// whatever the Proxy's.
	KeySource   keysource.Source
	Fingerprint keysource.Fingerprint
	Policy      idemhttp.Policy
	Wait        time.Duration
	Verifier    idemhttp.Verifier
}

// RouteError is the error CheckRoutes returns for the route at Index:
// Reason says what is wrong, and Other, when not -1, is the index of
// the route it overlaps.
type RouteError struct {
	Index, Other int
	Reason       string
}

func (e *RouteError) Error() string {
	if e.Other >= 0 {
		return fmt.Sprintf("route %d: %s (route %d)", e.Index+1, e.Reason, e.Other+1)
	}
	return fmt.Sprintf("route %d: %s", e.Index+1, e.Reason)
}

// CheckRoutes reports the first route that no request could match (a
// PathPrefix that is not a path a request can have), that has an invalid
// method, or that overlaps an earlier one: two routes overlap when they
// share a method and one's PathPrefix covers the other's, so that a
// request could match both. defaultMethods stands for a route's empty
// Methods (the Proxy's Methods, POST and PATCH when empty).
func CheckRoutes(routes []Route, defaultMethods []string) error {
	methods := make([][]string, len(routes))
	for i, rt := range routes {
		if err := checkPrefix(rt.PathPrefix); err != "" {
			return &RouteError{Index: i, Other: -1, Reason: err}
		}
		ms := rt.Methods
		if len(ms) == 0 {
			ms = defaultMethods
		}
		if len(ms) == 0 {
			ms = []string{http.MethodPost, http.MethodPatch}
		}
		for _, m := range ms {
			if !httpsyntax.IsToken(m) {
				return &RouteError{Index: i, Other: -1, Reason: fmt.Sprintf("invalid method %q", m)}
			}
			methods[i] = append(methods[i], strings.ToUpper(m))
		}
		for j := range i {
			if shareMethod(methods[i], methods[j]) && (underPrefix(rt.PathPrefix, routes[j].PathPrefix) || underPrefix(routes[j].PathPrefix, rt.PathPrefix)) {
				return &RouteError{Index: i, Other: j, Reason: fmt.Sprintf("path %s overlaps %s for the same method", rt.PathPrefix, routes[j].PathPrefix)}
			}
		}
	}
	return nil
}

// checkPrefix returns why no request path can match p, or "".
func checkPrefix(p string) string {
	switch {
	case p == "":
		return "no path"
	case p[0] != '/':
		return fmt.Sprintf("path %q does not start with /, so it matches no request", p)
	case strings.ContainsAny(p, "?#"):
		return fmt.Sprintf("path %q holds a query or a fragment, so it matches no request path", p)
	}
	for i := 0; i < len(p); i++ {
		if c := p[i]; c <= ' ' || c == 0x7f {
			return fmt.Sprintf("path %q holds a space or a control character", p)
		}
	}
	segs := strings.Split(strings.TrimSuffix(p[1:], "/"), "/")
	for _, s := range segs {
		if p == "/" {
			break
		}
		switch s {
		case "":
			return fmt.Sprintf("path %q has an empty segment (//)", p)
		case ".", "..":
			return fmt.Sprintf("path %q has a %s segment, which clients resolve before sending, so it matches no request", p, s)
		}
	}
	return ""
}

// underPrefix reports whether path is prefix or lies under it, segment
// by segment.
func underPrefix(path, prefix string) bool {
	if !strings.HasPrefix(path, prefix) {
		return false
	}
	return len(path) == len(prefix) || strings.HasSuffix(prefix, "/") || path[len(prefix)] == '/'
}

func shareMethod(a, b []string) bool {
	for _, m := range a {
		for _, n := range b {
			if m == n {
				return true
			}
		}
	}
	return false
}

// routeGW is a route built: the middleware around forward with the
// route's settings.
type routeGW struct {
	prefix    string
	covered   map[string]bool
	protected http.Handler
}

// route returns the route that r matches, or nil.
func (g *gateway) route(r *http.Request) *routeGW {
	for _, rt := range g.routes {
		if (rt.covered[r.Method] || rt.covered[strings.ToUpper(r.Method)]) && underPrefix(r.URL.Path, rt.prefix) {
			return rt
		}
	}
	return nil
}

// buildRoutes builds the Proxy's Routes.
func (p *Proxy) buildRoutes(g *gateway) error {
	for i, rt := range p.Routes {
		methods := rt.Methods
		if len(methods) == 0 {
			methods = p.Methods
		}
		if len(methods) == 0 {
			methods = []string{http.MethodPost, http.MethodPatch}
		}
		q := p.routeFields(rt)
		exec := rt.Executor
		if exec == nil {
			exec = p.Executor
		}
		mw, err := idemhttp.New(exec, q.middlewareOptions(g, methods)...)
		if err != nil {
			return fmt.Errorf("idemproxy: route %d (%s): %w", i+1, rt.PathPrefix, err)
		}
		gw := &routeGW{prefix: rt.PathPrefix, covered: make(map[string]bool), protected: mw.Handler(http.HandlerFunc(g.forward))}
		for _, m := range methods {
			gw.covered[strings.ToUpper(m)] = true
			g.covered[strings.ToUpper(m)] = true
		}
		g.routes = append(g.routes, gw)
	}
	return nil
}

// routeFields returns the Proxy's fields that middlewareOptions reads,
// with the route's in place of those it sets.
func (p *Proxy) routeFields(rt Route) *Proxy {
	q := &Proxy{
		KeySource: p.KeySource, Fingerprint: p.Fingerprint, Policy: p.Policy, Wait: p.Wait, Verifier: p.Verifier,
		KeyOptional: p.KeyOptional || rt.KeyOptional, ScopeHeader: p.ScopeHeader, AllowMissingScope: p.AllowMissingScope,
		MaxBodySize: p.MaxBodySize, MaxResponseSize: p.MaxResponseSize, MaxBodyMemory: p.MaxBodyMemory,
		FailOpen: p.FailOpen, StreamAll: p.StreamAll, ErrorHandler: p.ErrorHandler, ProblemTypeBase: p.ProblemTypeBase,
	}
	if !rt.KeySource.IsZero() {
		q.KeySource = rt.KeySource
	}
	if !rt.Fingerprint.IsBody() {
		q.Fingerprint = rt.Fingerprint
	}
	if rt.Policy != nil {
		q.Policy = rt.Policy
	}
	switch {
	case rt.Wait > 0:
		q.Wait = rt.Wait
	case rt.Wait < 0:
		q.Wait = 0
	}
	if rt.Verifier != nil {
		q.Verifier = rt.Verifier
	}
	return q
}
