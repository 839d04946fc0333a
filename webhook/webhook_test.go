package webhook_test

import (
	"errors"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/idemgo/idem/webhook"
)

// TestProviderVectors checks the signatures against the examples the
// providers publish.
func TestProviderVectors(t *testing.T) {
	// GitHub's documentation: secret "It's a Secret to Everybody", body
	// "Hello, World!".
	gh, err := webhook.New(webhook.GitHub, [][]byte{[]byte("It's a Secret to Everybody")})
	if err != nil {
		t.Fatal(err)
	}
	h := http.Header{"X-Hub-Signature-256": {"sha256=757107ea0eb2509fc211221cce984b8a37570b6d7586c22c46f4379c8b043e17"}}
	if err := gh.Verify(h.Values, []byte("Hello, World!")); err != nil {
		t.Errorf("GitHub's example: %v", err)
	}
	// The Standard Webhooks libraries' test message.
	at := time.Unix(1614265330, 0)
	sw, err := webhook.New(webhook.StandardWebhooks, [][]byte{[]byte("whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw")}, webhook.WithClock(func() time.Time { return at }))
	if err != nil {
		t.Fatal(err)
	}
	h = http.Header{}
	h.Set("webhook-id", "msg_p5jXN8AQM9LWM0D4loKWxJek")
	h.Set("webhook-timestamp", "1614265330")
	h.Set("webhook-signature", "v1,g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OE=")
	if err := sw.Verify(h.Values, []byte(`{"test": 2432232314}`)); err != nil {
		t.Errorf("Standard Webhooks' example: %v", err)
	}
}

// TestVerify checks every provider with Sign: a good signature passes; a
// changed body, another secret, a missing field or a stale timestamp fail
// with ErrSignature; a rotated secret passes.
func TestVerify(t *testing.T) {
	now := time.Unix(1_800_000_000, 0)
	clock := webhook.WithClock(func() time.Time { return now })
	secrets := map[string][2]string{
		webhook.GitHub:           {"gh-secret", "gh-old"},
		webhook.Stripe:           {"whsec_stripe", "whsec_old"},
		webhook.Shopify:          {"shop-secret", "shop-old"},
		webhook.StandardWebhooks: {"whsec_c2VjcmV0LWtleS0x", "whsec_b2xkLWtleQ=="},
	}
	body := []byte(`{"id":"evt_1","type":"x"}`)
	for _, p := range webhook.Providers {
		t.Run(p, func(t *testing.T) {
			cur, old := []byte(secrets[p][0]), []byte(secrets[p][1])
			v, err := webhook.New(p, [][]byte{cur, old}, clock)
			if err != nil {
				t.Fatal(err)
			}
			only, _ := webhook.New(p, [][]byte{cur}, clock)
			sign := func(secret []byte, at time.Time) http.Header {
				h, err := webhook.Sign(p, secret, "d-1", at, body)
				if err != nil {
					t.Fatal(err)
				}
				return h
			}
			good := sign(cur, now)
			if err := v.Verify(good.Values, body); err != nil {
				t.Errorf("good: %v", err)
			}
			if err := v.Verify(sign(old, now).Values, body); err != nil {
				t.Errorf("the old secret during a rotation: %v", err)
			}
			fail := func(name string, h http.Header, b []byte, v *webhook.Verifier) {
				t.Helper()
				if err := v.Verify(h.Values, b); !errors.Is(err, webhook.ErrSignature) {
					t.Errorf("%s: got %v, want ErrSignature", name, err)
				}
			}
			fail("old secret after the rotation", sign(old, now), body, only)
			fail("another body", good, []byte(`{"id":"evt_1","type":"y"}`), v)
			other := []byte("other")
			if p == webhook.StandardWebhooks {
				other = []byte("whsec_YW5vdGhlcg==")
			}
			fail("another secret", sign(other, now), body, v)
			fail("no fields", http.Header{}, body, v)
			if p == webhook.Stripe || p == webhook.StandardWebhooks {
				fail("stale", sign(cur, now.Add(-6*time.Minute)), body, v)
				fail("future", sign(cur, now.Add(6*time.Minute)), body, v)
				if err := v.Verify(sign(cur, now.Add(-4*time.Minute)).Values, body); err != nil {
					t.Errorf("within the tolerance: %v", err)
				}
			}
			src, err := webhook.KeySource(p)
			if err != nil {
				t.Fatal(err)
			}
			if key, err := src.Key(good.Values, body); err != nil || key != map[bool]string{true: "evt_1", false: "d-1"}[p == webhook.Stripe] {
				t.Errorf("key: got %q, %v", key, err)
			}
		})
	}
	for _, tt := range []struct {
		provider string
		secrets  [][]byte
		want     string
	}{
		{"gitlab", [][]byte{[]byte("s")}, "unknown provider"},
		{webhook.GitHub, nil, "no secret"},
		{webhook.GitHub, [][]byte{{}}, "empty"},
		{webhook.StandardWebhooks, [][]byte{[]byte("plain")}, "starts with whsec_"},
		{webhook.StandardWebhooks, [][]byte{[]byte("whsec_!!")}, "base64"},
	} {
		if _, err := webhook.New(tt.provider, tt.secrets); err == nil || !strings.Contains(err.Error(), tt.want) {
			t.Errorf("New(%s): got %v, want an error containing %q", tt.provider, err, tt.want)
		}
	}
}
