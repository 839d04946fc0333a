// Package webhook checks the signatures of webhook deliveries from GitHub,
// Stripe, Shopify and Standard Webhooks senders (Svix and others), and
// says where each provider puts the delivery's id, so that a receiver
// behind idemhttp or idemproxy runs each delivery once and a forged
// request never reaches the store.
//
// Why the order matters: a deduplicating layer that takes the key before
// it checks the signature lets a forged request that carries a real
// delivery id (ids are not secret: they appear in logs and dashboards)
// take that key first. If the receiver answers it 401 and the answer is
// stored, the real delivery gets the stored 401 replayed and is never
// processed. A Verifier checks the signature before any store call
// (idemhttp.WithVerifier, idemproxy.Proxy.Verifier): a forged request
// gets 401 and touches no record.
//
//	v, err := webhook.New(webhook.Stripe, [][]byte{secret})
//	if err != nil { … }
//	src, _ := webhook.KeySource(webhook.Stripe) // json:/id
//	mw, err := idemhttp.New(exec, idemhttp.WithVerifier(v), idemhttp.WithKeySource(src))
//
// The providers sign as follows (Sign makes the same fields, for tests):
//
//   - github: X-Hub-Signature-256 is "sha256=" and the hex HMAC-SHA256
//     of the body; the key is X-GitHub-Delivery.
//   - stripe: Stripe-Signature is "t=UNIX,v1=HEX[,v1=HEX...]", HEX the
//     HMAC-SHA256 of "UNIX.body"; the timestamp must be within the
//     tolerance (5 minutes by default) of the clock; the key is the
//     event's id, json:/id.
//   - shopify: X-Shopify-Hmac-Sha256 is the base64 HMAC-SHA256 of the
//     body; the key is X-Shopify-Webhook-Id.
//   - standard-webhooks: webhook-signature is a space-separated list of
//     "v1,BASE64" signatures, BASE64 the HMAC-SHA256 of "id.timestamp.body"
//     under the secret "whsec_BASE64KEY" decoded; webhook-timestamp must be
//     within the tolerance; the key is webhook-id.
//
// Several secrets may be given, for a rotation: a signature that matches
// any of them is accepted. Comparisons take constant time.
package webhook
