package idemhttp

import (
	"encoding/json"
	"net/http"
	"strconv"
	"strings"
	"time"
)

// DefaultProblemTypeBase is the default base of the problem types: each
// type is the base followed by the kind's name (TypeKeyMismatch is
// "urn:idem:problem:key-mismatch"). A URN names the kind without pointing
// at a page; the kinds are documented in the repository's
// docs/problems.md. WithProblemTypeBase sets another base, for example a
// page of the API's own documentation.
const DefaultProblemTypeBase = "urn:idem:problem:"

// The problem types of the error responses the middleware writes (RFC 9457),
// under DefaultProblemTypeBase. Problem.Type holds one of them, under the
// base the middleware was given (WithProblemTypeBase); Problem.Code names
// the kind whatever the base.
const (
	// TypeKeyMissing: 400. The key is required (see WithKeyRequired) and the
	// request has no Idempotency-Key field.
	TypeKeyMissing = DefaultProblemTypeBase + "key-missing"
	// TypeKeyInvalid: 400. The Idempotency-Key field is malformed (see
	// ParseKey) or appears more than once.
	TypeKeyInvalid = DefaultProblemTypeBase + "key-invalid"
	// TypePrincipalMissing: 400. The middleware scopes keys by principal
	// (WithPrincipal) and the request has none (an empty principal), so
	// its key cannot be kept apart from other clients' (see
	// httpkit.EmptyPrincipal). The handler did not run.
	TypePrincipalMissing = DefaultProblemTypeBase + "principal-missing"
	// TypeSignatureInvalid: 401. The middleware checks the requests'
	// signatures (WithVerifier) and this one's is missing, wrong or
	// stale. The request did not run and no record was read or written,
	// so a forged request that carries a real delivery's key cannot
	// change what that delivery gets.
	TypeSignatureInvalid = DefaultProblemTypeBase + "signature-invalid"
	// TypeKeyMismatch: 422. The key was already used with a request that
	// has another fingerprint (method, path, selected fields or body).
	TypeKeyMismatch = DefaultProblemTypeBase + "key-mismatch"
	// TypeInProgress: 409, with Retry-After (estimated from the route's
	// recent execution times, between 1s and the lease left). A request
	// with the same key is still being processed.
	TypeInProgress = DefaultProblemTypeBase + "in-progress"
	// TypeKeyFailed: 422. The key is FAILED: the first request ran but its
	// response could not be stored (it was over the size limit), or the
	// executor's maximum of attempts was reached. The response cannot be
	// replayed; the client should not retry with this key. 422 rather than
	// a 5xx because clients retry 5xx with the same key, which would only
	// get this answer again until the record expires.
	TypeKeyFailed = DefaultProblemTypeBase + "key-failed"
	// TypeBodyTooLarge: 413. The request body is over the limit (see
	// WithMaxBodySize). The handler did not run.
	TypeBodyTooLarge = DefaultProblemTypeBase + "body-too-large"
	// TypeBodyTimeout: 408. The request body did not arrive before the
	// connection's read deadline (the server's ReadTimeout, or a deadline
	// set with http.ResponseController, as the idem proxy's --body-timeout
	// does). The handler did not run.
	TypeBodyTimeout = DefaultProblemTypeBase + "body-timeout"
	// TypeServerBusy: 503, with Retry-After. The request bodies held in
	// memory reached their bound (WithMaxBufferedBodies), or, in the idem
	// proxy, so did the requests in flight (--max-concurrent). The handler
	// did not run.
	TypeServerBusy = DefaultProblemTypeBase + "server-busy"
	// TypeBodyUnreadable: 400. Reading the request body failed.
	TypeBodyUnreadable = DefaultProblemTypeBase + "body-unreadable"
	// TypeStoreUnavailable: 503, with Retry-After. The store could not be
	// reached and the middleware fails closed (the default; see
	// WithFailOpen).
	TypeStoreUnavailable = DefaultProblemTypeBase + "store-unavailable"
	// TypeStoredResponseCorrupt: 500. The stored response could not be
	// decoded (it was written by an incompatible version or sealed with
	// another key).
	TypeStoredResponseCorrupt = DefaultProblemTypeBase + "stored-response-corrupt"
	// TypeOutcomeUnknown: 503, with Retry-After. The handler ran, but its
	// response could not be stored (the store refused or did not answer
	// the completion, or the lease was lost), so the client is not told
	// the handler's answer: the request may have taken effect. Retry with
	// the same key after Retry-After: the key stays in progress until then,
	// and the retry gets the response if it was stored after all, or runs
	// the request again if not. 503 rather than 500 because it tells
	// clients, and idempotency layers in front of this one (whose default
	// policies release the key on 503), to retry.
	TypeOutcomeUnknown = DefaultProblemTypeBase + "outcome-unknown"
	// TypeInternal: 500. An unexpected error, for example a store that
	// rejected the middleware's input.
	TypeInternal = DefaultProblemTypeBase + "internal"
)

// Problem is an error response, rendered by default as an RFC 9457 problem
// details object with the media type application/problem+json.
type Problem struct {
	// Type is a URI that identifies the kind of problem: one of the Type
	// constants, with the base the middleware was given in place of
	// DefaultProblemTypeBase (WithProblemTypeBase), or a type of the
	// caller's own ("about:blank" for a plain HTTP error).
	Type string `json:"type"`
	// Title is a short summary of the kind of problem; it is the same for
	// every occurrence of Type.
	Title string `json:"title"`
	// Status is the HTTP status code.
	Status int `json:"status"`
	// Detail explains this occurrence to the client.
	Detail string `json:"detail,omitempty"`

	// RetryAfter is set for 409 and 503 responses; the middleware has set
	// the Retry-After field from it already.
	RetryAfter time.Duration `json:"-"`
	// Err is the underlying error, if any, for logging. It is not sent to
	// the client.
	Err error `json:"-"`
}

// ErrorHandler writes an error response for p. The Retry-After field, when
// p.RetryAfter is set, is already in w.Header().
type ErrorHandler func(w http.ResponseWriter, r *http.Request, p *Problem)

// WriteProblem is the default ErrorHandler: it writes p as JSON with the
// media type application/problem+json and status p.Status.
func WriteProblem(w http.ResponseWriter, r *http.Request, p *Problem) {
	body, err := json.Marshal(p)
	if err != nil { // cannot happen for strings and an int
		body = []byte(`{"type":"about:blank","status":` + strconv.Itoa(p.Status) + `}`)
	}
	writeJSON(w, "application/problem+json", p.Status, body)
}

// retryAfterSeconds renders d as the delay-seconds of Retry-After: whole
// seconds, rounded up, at least 1.
func retryAfterSeconds(d time.Duration) string {
	s := (d + time.Second - 1) / time.Second
	return strconv.FormatInt(max(int64(s), 1), 10)
}

// problemNames are the names of this package's problem kinds, the part of
// a Type constant after DefaultProblemTypeBase.
var problemNames = []string{
	"key-missing",
	"key-invalid",
	"principal-missing",
	"signature-invalid",
	"key-mismatch",
	"in-progress",
	"key-failed",
	"body-too-large",
	"body-timeout",
	"server-busy",
	"body-unreadable",
	"store-unavailable",
	"stored-response-corrupt",
	"outcome-unknown",
	"internal",
}

// problemName returns the name of the kind of problem that type t names
// under any base: "key-mismatch" for TypeKeyMismatch, and "" for a type
// that is not one of this package's.
func problemName(t string) string {
	for _, name := range problemNames {
		if rest, ok := strings.CutSuffix(t, name); ok && rest != "" && !isNameByte(rest[len(rest)-1]) {
			return name
		}
	}
	return ""
}

// isNameByte reports whether c may be part of a kind's name.
func isNameByte(c byte) bool { return c >= 'a' && c <= 'z' || c >= '0' && c <= '9' || c == '-' }

// rebase returns type t under base when t is one of this package's types
// (under DefaultProblemTypeBase), and t otherwise.
func rebase(t, base string) string {
	if base == DefaultProblemTypeBase {
		return t
	}
	if name, ok := strings.CutPrefix(t, DefaultProblemTypeBase); ok && problemName(t) == name {
		return base + name
	}
	return t
}
