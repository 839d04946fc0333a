// Package sidecar hands the messages of a consumer to an HTTP handler
// written in any language: the part of `idem consume` (`idem help consume`)
// that every broker shares. A broker adapter of package consumer runs
// Handler.Call as its handler, with the message translated into a
// Delivery; the adapter's Processor acquires the key before the call,
// completes it with the handler's response (consumer.SetResult) after a
// 2xx, and only then acknowledges the message.
//
// Each message is POSTed to Handler.URL with its body as received and the
// headers Idempotency-Key, Idempotency-Fence (the lease's fencing token:
// a handler that stores it with its effect and refuses a write whose fence
// is not above the stored one keeps out a stale owner after a takeover; a
// call whose effect committed and whose answer, or record, was lost is
// made again with a higher fence: docs/consume.md), the broker's metadata
// (Idem-Broker, Idem-Topic, Idem-Message-Id, Idem-Partition, Idem-Offset,
// Idem-Deliveries) and the message's traceparent and tracestate, if any.
// The answer decides:
//
//   - 2xx: done; the response (status, headers, body up to MaxResult) is
//     the key's stored result;
//   - 4xx other than 408, 409 and 429: a terminal failure (idem.Terminal):
//     the message is dead-lettered at once, with the status and the start
//     of the body in the dead letter's error;
//   - anything else, no answer within Timeout, a refused connection: a
//     retry (the key released, the message redelivered after the retry
//     delay, dead-lettered after the maximum of deliveries).
//
// While the handler runs, the Processor extends the lease; if the lease is
// lost anyway (the process paused past it, the store unreachable), the
// request is cancelled (its connection closed) and Handler.OnLeaseLost
// POSTs the key, the fence and the reason to LeaseLostURL, if set.
//
//	h := &sidecar.Handler{URL: "http://127.0.0.1:9000/messages"}
//	c, err := redisstream.New(rdb, "orders", "billing", "sidecar-1", exec,
//		func(ctx context.Context, m redis.XMessage) error {
//			return h.Call(ctx, sidecar.Delivery{Key: m.Values["key"].(string), Body: []byte(m.Values["payload"].(string))})
//		}, consumer.WithOnLeaseLost(h.OnLeaseLost))
package sidecar
