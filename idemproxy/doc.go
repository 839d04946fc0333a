// Package idemproxy is an idempotent reverse proxy: put it in front of an
// HTTP API that is not idempotent, and a POST or PATCH request that
// carries an Idempotency-Key runs on the API at most once per key; a retry
// gets the first response again, with Idempotent-Replayed: true. It is
// what the idem binary's `idem proxy` serves, as a library: a Proxy is
// configured by its fields, as net/http/httputil.ReverseProxy is, and
// every field's zero value is the binary's default.
//
//	store, _ := redisstore.New(redis.NewClient(&redis.Options{Addr: "127.0.0.1:6379"}))
//	exec, err := idem.New(store)
//	if err != nil { … }
//	upstream, _ := url.Parse("http://127.0.0.1:9000")
//	p := &idemproxy.Proxy{Target: upstream, Executor: exec}
//	if err := p.Init(); err != nil { … } // a bad field, reported at start
//	srv := &http.Server{Addr: ":8080", Handler: p}
//	go srv.ListenAndServe()
//
// # What a request meets
//
// A covered request (Proxy.Methods) goes through the idempotency layer of
// package idemhttp (key, fingerprint of method, path, query and body,
// acquire) and then through an httputil.ReverseProxy to the upstream. The
// upstream's response is stored before the client gets it; if it cannot
// be stored, the client gets 503 (outcome unknown: retry with the same
// key). What became of the upstream call decides the key's fate:
//
//   - the upstream answered: Proxy.Policy decides (by default every status
//     is stored except 408, 409, 425, 429 and 503, which release the key);
//   - the request never reached the upstream: 502, the key is released;
//   - the request was sent and no response came (504 after
//     Proxy.UpstreamTimeout, 502 for a broken connection), or the response
//     broke off: the upstream may have acted, so the key stays in progress
//     until its lease ends.
//
// The upstream gets the request's fencing token in Proxy.FenceHeader
// (Idempotency-Fence): an integer that grows with every acquisition of a
// key, so that an upstream which refuses a write with a fence not above
// the last one applies each request's effect once, even after a takeover.
// A client that goes away does not cancel the upstream call: its response
// is stored for the client's retry.
//
// Other requests pass through to the upstream untouched.
//
// # Keys from anywhere, webhooks, routes
//
// The key is the Idempotency-Key field unless KeySource names another
// field or a member of a JSON body (package keysource); Fingerprint says
// what of the body tells a retry from another request. Verifier checks a
// request's signature before its key is looked up (package webhook has
// GitHub's, Stripe's, Shopify's and Standard Webhooks'): a forged
// delivery that carries a real delivery's id gets 401 and touches no
// record. Routes give method and path prefixes settings of their own, for
// a proxy in front of several senders. docs/webhooks.md shows the binary's
// flags for each provider.
//
// # Bounds
//
// By default a covered body may be 1 MiB (MaxBodySize), and take 30s to
// arrive (BodyTimeout); the bodies held at once may take 32 MiB
// (MaxBodyMemory); 1024 requests are handled at once (MaxConcurrent); a
// client has a minute to receive a response (WriteTimeout); the upstream
// has 30s to answer (UpstreamTimeout). A negative value lifts a bound.
//
// # Operations
//
// Ready is the readiness check: the store answers a read, its own health
// check (redisstore's WithServerCheck) finds it fit, and the proxy is not
// draining. A liveness check needs nothing of the proxy: the process
// answers. Drain is for shutdown: it marks the proxy not ready and waits
// for the requests in flight, also those whose connection the server
// already closed, which go on storing what the upstream answered. Then
// close the store:
//
//	go func() { drained <- p.Drain(ctx) }() // Ready fails from now on
//	_ = srv.Shutdown(ctx)                   // no new requests; those in flight end
//	<-drained
//
// Observer is told about every request once handled (Event): the
// idempotency layer's outcome, the upstream's time and failure.
// prometheusidem.ProxyMetrics records them as Prometheus metrics and
// otelidem.ProxyTracer as OpenTelemetry spans; pass the Executor an
// observer of its own (idem.WithObserver) for its outcomes.
package idemproxy
