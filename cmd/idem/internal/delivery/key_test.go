package delivery

import (
	"testing"

	"github.com/idemgo/idem/consumer"
)

// TestKeySpec: every --key form finds the key where it says, and a
// message without it has none.
func TestKeySpec(t *testing.T) {
	header := func(name string) []string {
		if name == "X-Key" {
			return []string{"from-header"}
		}
		return nil
	}
	body := []byte(`{"id":"from-json","order":{"n":7},"amount":100}`)
	for _, tc := range []struct {
		spec, want string
		body       []byte
	}{
		{"id", "msg-1", body},
		{"header:X-Key", "from-header", body},
		{"header:Other", "", body},
		{"json:/id", "from-json", body},
		{"json:/order/n", "7", body},
		{"json:/missing", "", body},
		{"hash:/order,/amount", consumer.HashKey(string(mustSpec(t, "hash:/order,/amount").hashed.AppendBody(nil, body))), body},
		{"hash:/missing", "", body},
		{"hash:/id", "", []byte("not json")},
	} {
		k := mustSpec(t, tc.spec)
		if got := k.Key(header, tc.body, "msg-1"); got != tc.want {
			t.Errorf("--key %s: got %q, want %q", tc.spec, got, tc.want)
		}
	}
	// The hash ignores the members not listed.
	k := mustSpec(t, "hash:/order,/amount")
	if a, b := k.Key(nil, body, ""), k.Key(nil, []byte(`{"amount":100,"order":{"n":7},"id":"other"}`), ""); a != b || a == "" {
		t.Errorf("hash of the same members: %q and %q, want one key", a, b)
	}
	for _, bad := range []string{"nope", "json:id", "hash:", "header:"} {
		if _, err := ParseKeySpec(bad); err == nil {
			t.Errorf("--key %q: got no error", bad)
		}
	}
}

func mustSpec(t *testing.T, spec string) KeySpec {
	t.Helper()
	k, err := ParseKeySpec(spec)
	if err != nil {
		t.Fatal(err)
	}
	return k
}
