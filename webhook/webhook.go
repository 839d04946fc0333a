package webhook

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"errors"
	"fmt"
	"hash"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/idemgo/idem/keysource"
)

// The providers.
const (
	GitHub           = "github"
	Stripe           = "stripe"
	Shopify          = "shopify"
	StandardWebhooks = "standard-webhooks"
)

// Providers lists the providers New knows.
var Providers = []string{GitHub, Stripe, Shopify, StandardWebhooks}

// DefaultTolerance is how far a signed timestamp (Stripe,
// Standard Webhooks) may be from the clock: 5 minutes, as both
// providers' libraries default to.
const DefaultTolerance = 5 * time.Minute

// ErrSignature is wrapped by the errors Verify returns: the delivery is
// not signed, or not by a known secret, or its timestamp is outside the
// tolerance. An HTTP layer answers 401 (idemhttp: TypeSignatureInvalid).
var ErrSignature = errors.New("webhook: invalid signature")

// keySources are the specs of the providers' key sources.
var keySources = map[string]string{
	GitHub:           "header:X-GitHub-Delivery",
	Stripe:           "json:/id",
	Shopify:          "header:X-Shopify-Webhook-Id",
	StandardWebhooks: "header:webhook-id",
}

// KeySource returns where provider puts a delivery's id, which stays the
// same when it redelivers: X-GitHub-Delivery, the Stripe event's id,
// X-Shopify-Webhook-Id, webhook-id.
func KeySource(provider string) (keysource.Source, error) {
	spec, ok := keySources[provider]
	if !ok {
		return keysource.Source{}, unknown(provider)
	}
	return keysource.Parse(spec)
}

func unknown(provider string) error {
	return fmt.Errorf("webhook: unknown provider %q: want %s", provider, strings.Join(Providers, ", "))
}

// Verifier checks the signatures of one provider's deliveries. Create it
// with New. It is safe for concurrent use.
type Verifier struct {
	provider  string
	secrets   [][]byte    // the HMAC keys
	macs      []sync.Pool // per secret, its keyed HMACs (hmac's Reset reuses the keyed state)
	tolerance time.Duration
	now       func() time.Time
}

// Option configures a Verifier.
type Option func(*Verifier)

// WithTolerance sets how far a signed timestamp may be from the clock
// (Stripe, Standard Webhooks). The default is DefaultTolerance.
func WithTolerance(d time.Duration) Option { return func(v *Verifier) { v.tolerance = d } }

// WithClock sets the clock that timestamps are compared with. The
// default is time.Now.
func WithClock(now func() time.Time) Option { return func(v *Verifier) { v.now = now } }

// New returns the Verifier of provider's deliveries signed with any of
// secrets: GitHub's, Shopify's and Stripe's secrets as they are (Stripe's
// whsec_... whole), Standard Webhooks' as whsec_ followed by the base64
// key. It returns an error for an unknown provider, no secret, an empty
// secret, a Standard Webhooks secret that does not decode, or a
// tolerance that is not positive; the error never holds a secret.
func New(provider string, secrets [][]byte, opts ...Option) (*Verifier, error) {
	if _, ok := keySources[provider]; !ok {
		return nil, unknown(provider)
	}
	v := &Verifier{provider: provider, tolerance: DefaultTolerance, now: time.Now}
	for _, o := range opts {
		o(v)
	}
	switch {
	case len(secrets) == 0:
		return nil, fmt.Errorf("webhook: %s: no secret", provider)
	case v.tolerance <= 0:
		return nil, fmt.Errorf("webhook: %s: tolerance %v is not positive", provider, v.tolerance)
	case v.now == nil:
		return nil, fmt.Errorf("webhook: %s: nil clock", provider)
	}
	for i, s := range secrets {
		k, err := hmacKey(provider, s)
		if err != nil {
			return nil, fmt.Errorf("webhook: %s: secret %d: %w", provider, i+1, err)
		}
		v.secrets = append(v.secrets, k)
	}
	v.macs = make([]sync.Pool, len(v.secrets))
	for i, k := range v.secrets {
		v.macs[i].New = func() any { return hmac.New(sha256.New, k) }
	}
	return v, nil
}

// hmacKey returns the HMAC key of a secret.
func hmacKey(provider string, secret []byte) ([]byte, error) {
	if len(secret) == 0 {
		return nil, errors.New("empty")
	}
	if provider != StandardWebhooks {
		return append([]byte(nil), secret...), nil
	}
	b64, ok := strings.CutPrefix(string(secret), "whsec_")
	if !ok {
		return nil, errors.New("a Standard Webhooks secret starts with whsec_")
	}
	k, err := base64.StdEncoding.DecodeString(b64)
	if err != nil || len(k) == 0 {
		return nil, errors.New("a Standard Webhooks secret is whsec_ followed by base64")
	}
	return k, nil
}

// Provider returns the provider whose deliveries v checks.
func (v *Verifier) Provider() string { return v.provider }

// Verify reports whether a delivery whose header fields header returns
// by name (http.Header.Values for an HTTP request) and whose body is
// body carries a valid signature: nil if it does, an error wrapping
// ErrSignature that says why not otherwise.
func (v *Verifier) Verify(header func(name string) []string, body []byte) error {
	get := func(name string) string {
		if vs := header(name); len(vs) == 1 {
			return vs[0]
		}
		return ""
	}
	switch v.provider {
	case GitHub:
		sig, ok := strings.CutPrefix(get("X-Hub-Signature-256"), "sha256=")
		if !ok {
			return fmt.Errorf("%w: no X-Hub-Signature-256: sha256=... field", ErrSignature)
		}
		return v.match(hexDecode(sig), nil, body)
	case Shopify:
		sig, err := base64.StdEncoding.DecodeString(get("X-Shopify-Hmac-Sha256"))
		if err != nil || len(sig) == 0 {
			return fmt.Errorf("%w: no X-Shopify-Hmac-Sha256 field", ErrSignature)
		}
		return v.match(sig, nil, body)
	case Stripe:
		return v.verifyStripe(get("Stripe-Signature"), body)
	}
	return v.verifyStandard(get("webhook-id"), get("webhook-timestamp"), get("webhook-signature"), body)
}

func (v *Verifier) verifyStripe(field string, body []byte) error {
	var ts string
	var sigs [][]byte
	for part := range strings.SplitSeq(field, ",") {
		k, val, _ := strings.Cut(strings.TrimSpace(part), "=")
		switch k {
		case "t":
			ts = val
		case "v1":
			if s := hexDecode(val); s != nil {
				sigs = append(sigs, s)
			}
		}
	}
	if ts == "" || len(sigs) == 0 {
		return fmt.Errorf("%w: no Stripe-Signature: t=...,v1=... field", ErrSignature)
	}
	if err := v.fresh(ts); err != nil {
		return err
	}
	prefix := append([]byte(ts), '.')
	for _, s := range sigs {
		if v.match(s, prefix, body) == nil {
			return nil
		}
	}
	return fmt.Errorf("%w: no v1 signature matches a secret", ErrSignature)
}

func (v *Verifier) verifyStandard(id, ts, field string, body []byte) error {
	if id == "" || ts == "" || field == "" {
		return fmt.Errorf("%w: want the webhook-id, webhook-timestamp and webhook-signature fields", ErrSignature)
	}
	if err := v.fresh(ts); err != nil {
		return err
	}
	prefix := []byte(id + "." + ts + ".")
	for part := range strings.SplitSeq(field, " ") {
		b64, ok := strings.CutPrefix(part, "v1,")
		if !ok {
			continue
		}
		if s, err := base64.StdEncoding.DecodeString(b64); err == nil && v.match(s, prefix, body) == nil {
			return nil
		}
	}
	return fmt.Errorf("%w: no v1 signature matches a secret", ErrSignature)
}

// fresh checks a signed Unix timestamp against the clock.
func (v *Verifier) fresh(ts string) error {
	sec, err := strconv.ParseInt(ts, 10, 64)
	if err != nil {
		return fmt.Errorf("%w: timestamp %q is not a Unix time", ErrSignature, ts)
	}
	if d := v.now().Sub(time.Unix(sec, 0)); d > v.tolerance || d < -v.tolerance {
		return fmt.Errorf("%w: timestamp %s is %v away from the clock, over the tolerance of %v", ErrSignature, ts, d.Round(time.Second), v.tolerance)
	}
	return nil
}

// match reports whether sig is the HMAC-SHA256 of prefix and body under
// one of the secrets.
func (v *Verifier) match(sig, prefix, body []byte) error {
	if len(sig) == sha256.Size {
		var sum [sha256.Size]byte
		for i := range v.macs {
			m := v.macs[i].Get().(hash.Hash)
			m.Reset()
			m.Write(prefix)
			m.Write(body)
			ok := hmac.Equal(m.Sum(sum[:0]), sig)
			v.macs[i].Put(m)
			if ok {
				return nil
			}
		}
	}
	return fmt.Errorf("%w: the signature matches no secret", ErrSignature)
}

func hexDecode(s string) []byte {
	b, err := hex.DecodeString(s)
	if err != nil {
		return nil
	}
	return b
}

// Sign returns the header fields with which provider would send body,
// signed with secret (in the form New takes) at time t, with id as the
// delivery's id where the provider sends it in a field (GitHub, Shopify,
// Standard Webhooks; a Stripe event's id is in its body). It is for
// tests, and for a sender of Standard Webhooks.
func Sign(provider string, secret []byte, id string, t time.Time, body []byte) (http.Header, error) {
	k, err := hmacKey(provider, secret)
	if err != nil {
		return nil, fmt.Errorf("webhook: %s: %w", provider, err)
	}
	mac := func(prefix string) []byte {
		m := hmac.New(sha256.New, k)
		m.Write([]byte(prefix))
		m.Write(body)
		return m.Sum(nil)
	}
	h := http.Header{}
	ts := strconv.FormatInt(t.Unix(), 10)
	switch provider {
	case GitHub:
		h.Set("X-GitHub-Delivery", id)
		h.Set("X-Hub-Signature-256", "sha256="+hex.EncodeToString(mac("")))
	case Shopify:
		h.Set("X-Shopify-Webhook-Id", id)
		h.Set("X-Shopify-Hmac-Sha256", base64.StdEncoding.EncodeToString(mac("")))
	case Stripe:
		h.Set("Stripe-Signature", "t="+ts+",v1="+hex.EncodeToString(mac(ts+".")))
	case StandardWebhooks:
		h.Set("webhook-id", id)
		h.Set("webhook-timestamp", ts)
		h.Set("webhook-signature", "v1,"+base64.StdEncoding.EncodeToString(mac(id+"."+ts+".")))
	default:
		return nil, unknown(provider)
	}
	h.Set("Content-Type", "application/json")
	return h, nil
}
