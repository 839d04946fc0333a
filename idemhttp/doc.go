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
//     WithEmptyPrincipal(true) lets such requests share one scope.
//   - The body is read, up to a limit (413, TypeBodyTooLarge, before the
//     handler runs), and the request's fingerprint is computed as it is
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
//     sent to the client as it is written, streaming and flushing included,
//     and recorded; when the handler returns it is stored, or the key is
//     released, as the Policy says: by default everything is stored except
//     408, 409, 425, 429 and 503, which say the request was not processed.
//     A 500 is stored, since it may follow a side effect. A Policy may also
//     say AbandonKey when the outcome is unknown (a proxy whose upstream
//     timed out): nothing is stored and the key stays in progress until its
//     lease expires.
//   - A completed key replays the stored status, fields and body, byte for
//     byte, with Idempotent-Replayed: true added.
//   - A key in progress is answered with 409 (TypeInProgress) and a
//     Retry-After from the lease left, or, with WithWait, waits for the
//     first request to finish and replays its response.
//   - A key used before with another fingerprint: 422 (TypeKeyMismatch).
//   - A FAILED key: 422 (TypeKeyFailed). This happens when the first
//     response was over the stored-size limit (WithMaxResponseSize): it was
//     sent to the first client in full, but it cannot be replayed, and
//     running the handler again could repeat its effect. It also happens
//     when the Executor's maximum of attempts is reached.
//   - An unreachable store: 503 with Retry-After (TypeStoreUnavailable), or,
//     with WithFailOpen, the handler runs without protection.
//
// Error responses are RFC 9457 problem details (application/problem+json)
// unless WithErrorHandler says otherwise. Hooks (WithHook) see every outcome
// with its duration, for metrics and tracing.
//
// # Fields that are not stored
//
// Hop-by-hop fields (Connection and the fields it names, Keep-Alive,
// Proxy-Authenticate, Proxy-Authorization, TE, Trailer, Transfer-Encoding,
// Upgrade), trailers, and the deny-list (WithDenyHeaders, by default
// Set-Cookie) are sent to the first client but not stored or replayed.
// Fields that net/http adds itself (Date, and Content-Length or
// Content-Type when the handler did not set them) are added again by
// net/http on replay.
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
// (TestHandlerEffect). An effect that fails stores nothing: the key is
// released, or failed per the Executor's failure policy.
//
// The response is stored after the handler returns, before net/http
// finishes the response, with a context that does not end when the client
// goes away. If storing fails, the key stays IN_PROGRESS until its lease
// expires (retries get 409), and a retry after that runs the handler again.
// A streamed or hijacked response may reach the client before it is stored
// or the key released; a retry in that window gets 409.
//
// Stored responses are one opaque blob in a versioned binary encoding; the
// Executor compresses it above a threshold (idem.WithCompressAbove) and can
// encrypt it (idem.WithEncryption).
package idemhttp
