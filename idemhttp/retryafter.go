package idemhttp

import (
	"errors"
	"sync"
	"time"

	"github.com/idemgo/idem"
)

// The Retry-After of a 409 (a request with the same key is in progress) is
// estimated from how long requests take: the whole lease left is a poor
// hint (30 s for an operation that takes 2), and clients that honour it wait
// far longer than needed. The middleware keeps a moving average of the
// execution times (handler and storing) per route, and of all routes
// together for a route it has not seen finish yet. The hint is that
// average, at least a second (Retry-After counts whole seconds) and never
// more than the lease left, after which the key can be taken over anyway.
// Before anything has finished the hint is a second (initialRetryAfter),
// not the lease left: clients that honour Retry-After (the openai client
// does) would otherwise wait the whole lease for operations that take a
// second or two; it then grows with the durations observed.

// maxEstimatedRoutes bounds the routes whose execution times are kept;
// when it is reached, one route is forgotten for each new one. Routes taken
// from URL paths (no ServeMux pattern, no WithRoute) can be many.
const maxEstimatedRoutes = 4096

// initialRetryAfter is the Retry-After of a 409 before any execution has
// finished.
const initialRetryAfter = time.Second

// ewmaWeight is the weight of a new sample in the moving averages: about
// the last ten executions count.
const ewmaWeight = 0.2

// durations is the moving average of execution times, per route and
// overall. The zero value is ready; it is safe for concurrent use.
type durations struct {
	mu     sync.Mutex
	routes map[string]time.Duration
	all    time.Duration
}

func ewma(avg, d time.Duration) time.Duration {
	if avg == 0 {
		return d
	}
	return avg + time.Duration(ewmaWeight*float64(d-avg))
}

// observe records that an execution on route took d.
func (e *durations) observe(route string, d time.Duration) {
	if d <= 0 {
		d = 1
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.routes == nil {
		e.routes = make(map[string]time.Duration)
	}
	avg, ok := e.routes[route]
	if !ok && len(e.routes) >= maxEstimatedRoutes {
		for k := range e.routes { // an arbitrary one
			delete(e.routes, k)
			break
		}
	}
	e.routes[route] = ewma(avg, d)
	e.all = ewma(e.all, d)
}

// retryAfter returns the Retry-After for a request on route whose key is in
// progress with leaseLeft: the route's average execution time (the overall
// one if the route has none yet, initialRetryAfter if nothing finished
// yet), at least a second and at most leaseLeft (unless that is under a
// second).
func (e *durations) retryAfter(route string, leaseLeft time.Duration) time.Duration {
	e.mu.Lock()
	est, ok := e.routes[route]
	if !ok {
		est = e.all
	}
	e.mu.Unlock()
	if est == 0 {
		est = initialRetryAfter
	}
	return max(min(est, leaseLeft), time.Second)
}

// estimateRetry returns err with the Retry-After of an in-progress key
// estimated for route (see durations.retryAfter); other errors as they are.
func (m *Middleware) estimateRetry(route string, err error) error {
	ip, ok := errors.AsType[*idem.InProgressError](err)
	if !ok {
		return err
	}
	return &idem.InProgressError{RetryAfter: m.durations.retryAfter(route, ip.RetryAfter)}
}

// routeOf returns the route part of a key's scope: the scope without the
// principal, so that the execution times of all clients count together.
func (m *Middleware) routeOf(scope string) string {
	if m.principal != nil && len(scope) > principalLen {
		return scope[:len(scope)-principalLen]
	}
	return scope
}
