package webhook_test

import (
	"testing"
	"time"

	"github.com/idemgo/idem/webhook"
)

func BenchmarkVerify(b *testing.B) {
	body := []byte(`{"id":"evt_1","object":"event","type":"payment_intent.succeeded","data":{"object":{"amount":4200,"currency":"eur"}}}`)
	for _, p := range webhook.Providers {
		b.Run(p, func(b *testing.B) {
			secret := []byte("whsec_c2VjcmV0LWtleS0x")
			v, err := webhook.New(p, [][]byte{secret})
			if err != nil {
				b.Fatal(err)
			}
			h, _ := webhook.Sign(p, secret, "d-1", time.Now(), body)
			b.ReportAllocs()
			for b.Loop() {
				if err := v.Verify(h.Values, body); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
