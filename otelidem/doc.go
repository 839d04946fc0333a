// Package otelidem traces the calls of an idem.Store with OpenTelemetry: a
// decorator starts one client span per call ("idem.acquire",
// "idem.complete", "idem.fail", "idem.extend", "idem.release", "idem.get",
// "idem.delete", and "idem.watch" on a store that watches) carrying the
// store key (a digest, never the raw idempotency key) and what the call
// found out: Acquire's outcome, the fence, the attempts, the state a Fail
// moved the record to.
//
// It is a module of its own, so that users of idem who do not trace do not
// download OpenTelemetry.
//
// Wrap the store before handing it to the Executor; the spans are children
// of the span in the context of each call:
//
//	store, _ := redisstore.New(client)
//	exec, err := idem.New(otelidem.Store(store, otelidem.WithTracerProvider(tp)))
//
// The decorated store keeps storekit.Watcher when the store has it, so that
// Executor.Await is still woken by the store's notifications.
//
// Metrics measures the Executor's outcomes with the OpenTelemetry metrics
// API: the counter idem.operations, the histograms idem.operation.duration
// and idem.operation.store.duration (seconds, bounds from 50µs) and the
// counter idem.operation.takeovers, with the attributes idem.outcome and
// idem.scope.kind (never a key). It is an observe.Observer:
//
//	m, err := otelidem.NewMetrics(otelidem.WithMeterProvider(mp))
//	exec, err := idem.New(store, idem.WithObserver(m.Observe))
//
// ProxyTracer traces an idemproxy.Proxy: a server span per request
// ("idem.proxy POST") with what the proxy did (idem.outcome), a child of
// the client's trace context, and the parent of the upstream's:
//
//	t := otelidem.NewProxyTracer(otelidem.WithTracerProvider(tp))
//	p := &idemproxy.Proxy{Target: u, Executor: exec, Rewrite: t.Rewrite, Observer: t.Observe}
//	srv := &http.Server{Handler: t.Handler(p)}
package otelidem
