package consumer_test

import (
	"testing"

	"github.com/idemgo/idem/consumer"
)

func TestKeyHelpers(t *testing.T) {
	payload := []byte(`{"id":"ord-1","amount":100,"paid":true,"meta":{"x":1},"none":null,"sent_at":"12:00"}`)
	for _, tc := range []struct{ field, want string }{
		{"id", "ord-1"}, {"amount", "100"}, {"paid", "true"}, {"meta", ""}, {"none", ""}, {"missing", ""},
	} {
		if got := consumer.JSONField(payload, tc.field); got != tc.want {
			t.Errorf("JSONField %q: got %q, want %q", tc.field, got, tc.want)
		}
	}
	if got := consumer.JSONField([]byte("not json"), "id"); got != "" {
		t.Errorf("JSONField of a non-JSON payload: got %q, want empty", got)
	}
	h := consumer.JSONHash(payload, "id", "amount")
	if h == "" || len(h) != 43 || h != consumer.HashKey("ord-1", "100") {
		t.Errorf("JSONHash: got %q, want HashKey(ord-1, 100)", h)
	}
	other := []byte(`{"id":"ord-1","amount":100,"sent_at":"12:01"}`)
	if consumer.JSONHash(other, "id", "amount") != h {
		t.Error("JSONHash depends on a field that is not listed")
	}
	if consumer.JSONHash(payload, "missing") != "" {
		t.Error("JSONHash of absent fields: want no key")
	}
	if consumer.HashKey("ab", "c") == consumer.HashKey("a", "bc") {
		t.Error("HashKey does not separate its parts")
	}
}
