package idemhttp

import "net/http"

// Decision is what a Policy decides for a response.
type Decision uint8

const (
	// StoreResponse stores the response: a retry with the same key gets it
	// replayed and the handler does not run again.
	StoreResponse Decision = iota
	// ReleaseKey stores nothing and releases the key: a retry with the same
	// key runs the handler again.
	ReleaseKey
	// AbandonKey stores nothing and leaves the key IN_PROGRESS until its
	// lease expires (see idem.Attempt.Abandon): until then a retry with the
	// same key gets 409 (or waits, with WithWait), and after that it runs
	// the handler again. Use it when the outcome is unknown, for example
	// when a proxy's upstream timed out after it received the request:
	// releasing could run the operation twice at the same time, and storing
	// would replay a response that does not say what happened.
	AbandonKey
)

// Policy decides, from the request and the status of the handler's
// response, whether the response is stored, the key released or the key
// abandoned to its lease. r is the
// request as the middleware received it: its Pattern, URL or Context may be
// used to decide per route. A Policy must be safe for concurrent use.
type Policy func(r *http.Request, status int) Decision

// DefaultPolicy stores every response except those whose status says that
// the request was not processed and may be retried: 408 Request Timeout, 409
// Conflict, 425 Too Early, 429 Too Many Requests and 503 Service
// Unavailable. Other 5xx responses are stored, because a server error may
// follow a side effect that a retry would repeat (Stripe's API reasons the
// same way).
func DefaultPolicy(_ *http.Request, status int) Decision {
	switch status {
	case http.StatusRequestTimeout, http.StatusConflict, http.StatusTooEarly,
		http.StatusTooManyRequests, http.StatusServiceUnavailable:
		return ReleaseKey
	}
	return StoreResponse
}

// ReleaseServerErrors is DefaultPolicy, and in addition releases the key on
// every 5xx response. Use it for handlers that do not leave side effects
// behind when they fail (for example because they run in one database
// transaction).
func ReleaseServerErrors(r *http.Request, status int) Decision {
	if status >= 500 && status <= 599 {
		return ReleaseKey
	}
	return DefaultPolicy(r, status)
}

// StoreSuccessOnly stores 2xx responses only, and releases the key on
// every other status, so that a retry runs the handler again: the choice of
// many idempotency middlewares. Its risk is a duplicate effect: a handler
// that acted and then answered 4xx or 5xx (a charge made, then a 500 from a
// later step; a 402 after a hold on the card) runs again on the retry. Use
// it only for handlers whose non-2xx responses leave nothing behind, for
// example because they run in one database transaction and validate before
// they write.
func StoreSuccessOnly(_ *http.Request, status int) Decision {
	if status >= 200 && status <= 299 {
		return StoreResponse
	}
	return ReleaseKey
}
