package idemproxy

import (
	"net/http"
	"time"

	"github.com/idemgo/idem/idemhttp"
)

// Kind is what the proxy did with a request.
type Kind uint8

// The kinds of requests an Observer is told.
const (
	// KindCovered: the request's method is covered (Proxy.Methods); the
	// idempotency layer handled it, and Event.Outcome says how.
	KindCovered Kind = iota + 1
	// KindPassthrough: the method is not covered; the request went to the
	// upstream untouched.
	KindPassthrough
	// KindBusy: Proxy.MaxConcurrent requests were in flight; the request
	// was answered 503 with Retry-After and went nowhere.
	KindBusy
)

var kindNames = [...]string{"invalid", "covered", "passthrough", "busy"}

// String returns the kind's name: "covered", "passthrough", "busy", or
// "invalid".
func (k Kind) String() string {
	if int(k) < len(kindNames) {
		return kindNames[k]
	}
	return kindNames[0]
}

// UpstreamFailure is what went wrong with an upstream call that got no
// response.
type UpstreamFailure uint8

// The upstream failures, and what the proxy does with a covered request's
// key after each.
const (
	// UpstreamOK: the upstream answered, or was not called.
	UpstreamOK UpstreamFailure = iota
	// UpstreamUnreachable: nothing was sent (no connection, DNS or TLS
	// failure): 502, and the key is released.
	UpstreamUnreachable
	// UpstreamTimeout: the request was sent and no response header came
	// in time (Proxy.UpstreamTimeout): 504, and the key is left to its
	// lease, since the upstream may have acted.
	UpstreamTimeout
	// UpstreamBroken: the request was sent and the connection failed
	// before a response: 502, and the key is left to its lease.
	UpstreamBroken

	upstreamFailures // the number of values
)

var upstreamFailureNames = [upstreamFailures]string{"ok", "unreachable", "timeout", "broken"}

// String returns the failure's name: "ok", "unreachable", "timeout",
// "broken", or "invalid".
func (f UpstreamFailure) String() string {
	if f < upstreamFailures {
		return upstreamFailureNames[f]
	}
	return "invalid"
}

// Event is what an Observer is told about one request, once the proxy
// handled it.
type Event struct {
	// Kind says what the proxy did with the request.
	Kind Kind
	// Event is the idempotency layer's report of a KindCovered request:
	// its Outcome, Status, Duration and Err (see idemhttp.Event). For
	// KindPassthrough, Status and Duration are set (Status 0 when nothing
	// was written); for KindBusy, Status.
	idemhttp.Event
	// Upstream is the time of the upstream call of a covered request, its
	// response body included; 0 when the upstream was not called.
	Upstream time.Duration
	// UpstreamFailure says why the upstream call got no response, if it
	// did not.
	UpstreamFailure UpstreamFailure
}

// Observer is told about every request the proxy handled (Proxy.Observer),
// on the request's goroutine once its response was written, so it must be
// quick and safe for concurrent use. r is the request with the context the
// proxy gave it; a span that a handler around the proxy put in the
// context is in it. prometheusidem.ProxyMetrics and otelidem.ProxyTracer
// are Observers.
type Observer func(r *http.Request, ev Event)
