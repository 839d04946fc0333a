// Package idemhttp is net/http middleware that makes handlers safe to retry
// with the Idempotency-Key request field
// (draft-ietf-httpapi-idempotency-key-header), the way Stripe's API is: a
// request retried with the same key gets the first response again instead
// of running the handler twice.
//
//	exec, _ := idem.New(store)
//	mw, err := idemhttp.New(exec, idemhttp.WithPrincipal(userID))
//	if err != nil { ... }
//	mux.Handle("POST /payments", mw.Handler(createPayment))
//
// It works with net/http, chi, gorilla/mux, and the net/http adapters of
// echo and gin: anything that takes an http.Handler.
//
// # What happens to a request
//
// Requests whose method is not covered (by default only POST and PATCH are)
// pass through without protection; if one carries an Idempotency-Key, its
// response gets Idempotency-Key-Ignored: true (IgnoredHeader), so that the
// key is never ignored silently. Methods are compared ignoring case: "post"
// is POST. For the others:
//
//   - The key is taken from the Idempotency-Key field (see ParseKey). A
//     missing key (when required, the default), a malformed one or a
//     repeated field is answered with 400 (TypeKeyMissing, TypeKeyInvalid).
//   - With WithPrincipal, a request without a principal (the function
//     returns "") is answered with 400 (TypePrincipalMissing), unless
//     httpkit.EmptyPrincipal(true) lets such requests share one scope.
//   - The body is read, up to a limit (413, TypeBodyTooLarge, before the
//     handler runs; 408, TypeBodyTimeout, if the connection's read deadline
//     passes first; 503, TypeServerBusy, if the bodies held in memory reached
//     WithMaxBufferedBodies), and the request's fingerprint is computed as it is
//     read: SHA-256 over the method, path, query, selected fields and body
//     (optionally in a canonical JSON form). The handler still sees the
//     whole body.
//   - The key is acquired from the store. Its scope is the method and the
//     route (the ServeMux pattern, or the URL path) and, with WithPrincipal,
//     the principal, so that a client can never replay another client's
//     response. The same key on another method or route is another key: it
//     runs on its own, it is not a mismatch. Paths are compared as the
//     server decoded them (Request.URL.Path), byte for byte: /orders and
//     /orders/ are two routes, and so are /Orders and /orders; use
//     ServeMux patterns or WithRoute to group paths. The query is not part
//     of the scope but of the fingerprint.
//   - A key that is new (or was released) runs the handler. Its response is
//     recorded and, when the handler returns, stored, or the key is
//     released, as the Policy says: by default everything is stored except
//     408, 409, 425, 429 and 503, which say the request was not processed.
//     A response is sent to the client only once it is stored (see "Record
//     before success" below), except a stream.
//     A 500 is stored, since it may follow a side effect. A Policy may also
//     say AbandonKey when the outcome is unknown (a proxy whose upstream
//     timed out): nothing is stored and the key stays in progress until its
//     lease expires.
//   - A completed key replays the stored status, fields, body and
//     trailers, byte for byte, with Idempotent-Replayed: true added.
//   - A key in progress is answered with 409 (TypeInProgress) and a
//     Retry-After estimated from how long requests take: a moving average
//     of the route's recent execution times (of all routes, for a route
//     with none yet; a second before any has finished), at least a second
//     and never more than the lease left.
//     With WithWait, the request waits for the first one to finish instead
//     and replays its response.
//   - A key used before with another fingerprint: 422 (TypeKeyMismatch).
//   - A FAILED key: 422 (TypeKeyFailed). This happens when the first
//     response was over the stored-size limit (WithMaxResponseSize): it was
//     sent to the first client in full, but it cannot be replayed, and
//     running the handler again could repeat its effect. It also happens
//     when the Executor's maximum of attempts is reached.
//   - An unreachable store: 503 with Retry-After (TypeStoreUnavailable), or,
//     with WithFailOpen, the handler runs without protection.
//   - A handler whose response could not be stored: 503 with Retry-After
//     (TypeOutcomeUnknown), never the handler's response; for a stream,
//     an aborted response (see "Record before success").
//
// Error responses are RFC 9457 problem details (application/problem+json)
// unless WithErrorHandler says otherwise: WriteStripeError answers in
// Stripe's shape with Stripe-Should-Retry, for clients that read every JSON
// body as an API object, and TemplateErrorHandler in any JSON shape. Hooks (WithHook) see every outcome
// with its duration, for metrics and tracing.
//
// # Fields that are not stored
//
// Hop-by-hop fields (Connection and the fields it names, Keep-Alive,
// Proxy-Authenticate, Proxy-Authorization, TE, Trailer, Transfer-Encoding,
// Upgrade) and the deny-list (WithDenyHeaders, by default Set-Cookie) are
// sent to the first client but not stored or replayed. Trailers (the
// fields the Trailer field announced, and those named with
// http.TrailerPrefix) are stored and replayed as trailers: the replay
// announces them as the first response did, and on HTTP/1.1 it sends the
// body in chunks.
// Fields that net/http adds itself (Date, and Content-Length or
// Content-Type when the handler did not set them) are added again by
// net/http on replay. A handler's own Idempotent-Replayed field is removed
// from its response (the field is the middleware's: on a response that ran
// the handler it would tell the client of a replay).
//
// # The handler
//
// The middleware guarantees that one execution starts per key while the
// store holds its record; exactly-once effects also need the side effect to
// check the fencing token, or to be idempotent itself. The handler's request
// context carries the attempt's lease: pass idem.FenceFrom(r.Context()) to
// side effects that can reject stale writers. The context is cancelled if
// the lease is lost; the Executor extends the lease while the handler runs. If the handler panics, the key
// is released and the panic goes on. If it hijacks the connection, the key
// is released.
//
// A handler whose effect is on data in the store's Redis attaches it with
// idem.SetEffect(r.Context(), effect) (an effect registered on the store
// with redisstore.WithEffect): the effect is then applied in the same
// atomic call as the completion that stores the response, once per key
// (TestHandlerEffect). An effect that fails before its first write stores
// nothing: the key is released, or failed per the Executor's failure
// policy; one that fails after it wrote ends the key FAILED
// (idem.ErrEffectPartial), so that a retry gets that failure rather than a
// second run.
//
// The response is stored after the handler returns, with a context that
// does not end when the client goes away.
//
// # Record before success
//
// A client is never told a success that was not recorded. The middleware
// holds the response back (status, fields and body, up to the stored-size
// limit, in memory) until the handler returns and the response is stored;
// only then does its status line reach the client. If it cannot be stored
// — the store refuses or does not answer the completion, which the Executor
// repeats for up to one lease while its outcome is unknown, or the lease
// was lost to a takeover — the client gets 503 with Retry-After
// (TypeOutcomeUnknown: the request may have taken effect; retry with the
// same key), an ERROR line is logged and hooks see OutcomeNotRecorded. The
// key is neither stored nor released: it stays IN_PROGRESS until its lease
// ends, so a retry before then gets 409, and a retry after it runs the
// handler again (the client was told the outcome is unknown).
//
// Streams are sent as they are written: a text/event-stream response, a
// response whose handler flushes it (unless httpkit.StreamOnFlush(false)), and
// a body over the stored-size limit (from the write that crosses it). A
// stream is recorded after the handler returns (stored, or for a body over
// the limit its key marked FAILED), and its end is withheld until then:
// net/http writes the end of a body of unknown length (the terminating
// chunk, or HTTP/2's END_STREAM) only when the handler returns, and the
// middleware holds back the last byte of a body of declared length. If
// the record cannot be written, the response is aborted (the middleware
// panics with http.ErrAbortHandler: net/http closes an HTTP/1.x connection
// without the end, and resets an HTTP/2 stream), so that the client sees
// an incomplete response, never a whole one that was not recorded; an
// ERROR line is logged and hooks see OutcomeNotRecorded. A handler
// wrapped by a middleware that recovers panics must let that one go on,
// as net/http/httputil.ReverseProxy's aborts require already.
// httpkit.StreamAll makes every response a stream written through whole, end
// included: its client may be told a success that was not recorded. A
// hijacked response and 101 Switching Protocols pass through too and
// release the key. Holding a response back costs the time of the completion before the
// first byte (BENCHMARKS.md, "Record before success"), and memory up to the limit per
// request, as recording it did already.
//
// # Effects in the handler's own database
//
// A handler whose effect is a database transaction registers a Recorder
// (SetRecorder): the middleware hands it the response to store, and it
// commits the effect and the response together (and may answer with a
// response recorded earlier, which is replayed); a response that is not
// stored is discarded, rolling the effect back. The Postgres commit gate
// (github.com/idemgo/idem/postgres/pggate, Gate.HTTP) is one.
//
// # Content negotiation
//
// A stored response is replayed as it was stored, whatever the retry's
// Accept-Encoding or Accept fields say: a retry is the same request, but a
// client library may negotiate differently on its second try. A handler
// (or a compressing middleware inside this one) whose response depends on
// those fields should either give covered requests one form, or add the
// fields to the fingerprint (WithFingerprintHeaders("Accept-Encoding")),
// so that a retry that negotiates otherwise gets 422 rather than a body it
// cannot decode. The idem proxy stores the identity form: it does not pass
// the client's Accept-Encoding on with covered requests, so its transport
// asks the upstream for gzip itself and decodes it.
//
// Stored responses are one opaque blob in a versioned binary encoding; the
// Executor compresses it above a threshold (idem.WithCompressAbove) and can
// encrypt it (idem.WithEncryption).
package idemhttp
