// Package webhookstorm is the webhook storm of the reliability suite:
// Stripe-signed deliveries, each redelivered several times at once with a
// share of the sends cut off by a connection reset, and each preceded by
// a forged delivery (a bad signature) that carries the real delivery's
// id, through two `idem proxy --webhook stripe` processes sharing one
// redis-server, in front of a receiver that checks signatures itself and
// counts its executions.
//
// With the proxies checking signatures (a secret given), every delivery
// id executes exactly once and no key is poisoned: the forged deliveries
// get 401 from the proxy and never reach the store. The negative control
// runs the same traffic through proxies that check nothing and store the
// receiver's 401 (--store-policy default): the forged 401 is stored under
// the real id and replayed to the real delivery, which never executes.
//
//	make chaos RUN=TestWebhookStorm
//	make chaos-long RUN=TestWebhookStorm
package webhookstorm
