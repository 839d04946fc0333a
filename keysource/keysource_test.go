package keysource_test

import (
	"bytes"
	"errors"
	"net/http"
	"strings"
	"testing"

	"github.com/idemgo/idem/keysource"
)

func TestParse(t *testing.T) {
	for _, tt := range []struct {
		spec, header string
		inBody       bool
		err          string
	}{
		{spec: "header:Idempotency-Key", header: "Idempotency-Key"},
		{spec: "header:webhook-id", header: "webhook-id"},
		{spec: "json:/id", inBody: true},
		{spec: "json:/data/object/id", inBody: true},
		{spec: "json:/items/0/id", inBody: true},
		{spec: "json:/a~1b/c~0d", inBody: true},
		{spec: "", err: "want header:NAME"},
		{spec: "Idempotency-Key", err: "want header:NAME"},
		{spec: "query:id", err: "want header:NAME"},
		{spec: "header:", err: "is not a header field name"},
		{spec: "header:a b", err: "is not a header field name"},
		{spec: "json:", err: "empty JSON Pointer"},
		{spec: "json:id", err: "does not start with /: want one such as /id"},
		{spec: "json:data.id", err: "does not start with /"},
		{spec: "json:/a//b", err: "empty segment"},
		{spec: "json:/a~2", err: "~ must be followed by 0"},
		{spec: "json:/a~", err: "~ must be followed by 0"},
	} {
		t.Run(tt.spec, func(t *testing.T) {
			s, err := keysource.Parse(tt.spec)
			if tt.err != "" {
				if err == nil || !strings.Contains(err.Error(), tt.err) {
					t.Fatalf("Parse(%q): got error %v, want one containing %q", tt.spec, err, tt.err)
				}
				return
			}
			if err != nil {
				t.Fatalf("Parse(%q): %v", tt.spec, err)
			}
			if s.String() != tt.spec || s.Header() != tt.header || s.InBody() != tt.inBody || s.IsZero() {
				t.Errorf("Parse(%q): got String %q Header %q InBody %v IsZero %v", tt.spec, s, s.Header(), s.InBody(), s.IsZero())
			}
		})
	}
	if _, err := keysource.FromHeader("X-GitHub-Delivery"); err != nil {
		t.Errorf("FromHeader: %v", err)
	}
	var zero keysource.Source
	if !zero.IsZero() || zero.InBody() {
		t.Errorf("zero Source: IsZero %v InBody %v", zero.IsZero(), zero.InBody())
	}
	if _, err := zero.Key(nil, nil); !errors.Is(err, keysource.ErrNoKey) {
		t.Errorf("zero Source's Key: got %v, want ErrNoKey", err)
	}
}

func TestKey(t *testing.T) {
	h := http.Header{}
	h.Set("Idempotency-Key", "k1")
	h.Add("Twice", "a")
	h.Add("Twice", "b")
	long := strings.Repeat("k", 256)
	for _, tt := range []struct {
		spec, body, want string
		err              error
	}{
		{spec: "header:Idempotency-Key", want: "k1"},
		{spec: "header:idempotency-key", want: "k1"},
		{spec: "header:X-GitHub-Delivery", err: keysource.ErrNoKey},
		{spec: "header:Twice", err: keysource.ErrInvalidKey},
		{spec: "json:/id", body: `{"id":"evt_1","object":"event"}`, want: "evt_1"},
		{spec: "json:/id", body: ` { "object" : "event" , "id" : "evt_2" } `, want: "evt_2"},
		{spec: "json:/id", body: `{"id":"a\u00e9\"b"}`, want: "a\u00e9\"b"},
		{spec: "json:/id", body: `{"id":12.50}`, want: "12.50"},
		{spec: "json:/id", body: `{"id":-3}`, want: "-3"},
		{spec: "json:/id", body: `{"id":"first","id":"last"}`, want: "last"},
		{spec: "json:/d\u00e9j\u00e0", body: `{"d\u00e9j\u00e0":"x"}`, want: "x"},
		{spec: "json:/esc", body: `{"\u0065sc":"x"}`, want: "x"},
		{spec: "json:/data/object/id", body: `{"data":{"skip":[1,{"id":"no"},"]}"],"object":{"id":"pi_1"}}}`, want: "pi_1"},
		{spec: "json:/items/1/id", body: `{"items":[{"id":"a"},{"id":"b"}]}`, want: "b"},
		{spec: "json:/a~1b/c~0d", body: `{"a/b":{"c~d":"k"}}`, want: "k"},
		{spec: "json:/items/2", body: `{"items":[1,2]}`, err: keysource.ErrNoKey},
		{spec: "json:/items/01", body: `{"items":[1,2]}`, err: keysource.ErrNoKey},
		{spec: "json:/items/-", body: `{"items":[1,2]}`, err: keysource.ErrNoKey},
		{spec: "json:/id/x", body: `{"id":"s"}`, err: keysource.ErrNoKey},
		{spec: "json:/id", body: `{"other":"x"}`, err: keysource.ErrNoKey},
		{spec: "json:/id", body: `{"id":null}`, err: keysource.ErrNoKey},
		{spec: "json:/id", body: `id=1`, err: keysource.ErrNoKey},
		{spec: "json:/id", body: ``, err: keysource.ErrNoKey},
		{spec: "json:/id", body: `{"id":"x"} {}`, err: keysource.ErrNoKey},
		{spec: "json:/id", body: `["id"]`, err: keysource.ErrNoKey},
		{spec: "json:/id", body: `{"id":""}`, err: keysource.ErrInvalidKey},
		{spec: "json:/id", body: `{"id":"` + long + `"}`, err: keysource.ErrInvalidKey},
		{spec: "json:/id", body: `{"id":{"a":1}}`, err: keysource.ErrInvalidKey},
		{spec: "json:/id", body: `{"id":[1]}`, err: keysource.ErrInvalidKey},
		{spec: "json:/id", body: `{"id":true}`, err: keysource.ErrInvalidKey},
		{spec: "json:/id", body: `{"id":"\ud800"}`, want: "\ufffd"}, // a lone surrogate is replaced, as encoding/json does
	} {
		t.Run(tt.spec+" "+tt.body, func(t *testing.T) {
			s, err := keysource.Parse(tt.spec)
			if err != nil {
				t.Fatal(err)
			}
			got, err := s.Key(h.Values, []byte(tt.body))
			if tt.err != nil {
				if !errors.Is(err, tt.err) {
					t.Fatalf("Key: got %q, %v, want %v", got, err, tt.err)
				}
				return
			}
			if err != nil || got != tt.want {
				t.Errorf("Key: got %q, %v, want %q", got, err, tt.want)
			}
		})
	}
}

func TestParseFingerprint(t *testing.T) {
	for _, tt := range []struct{ spec, err string }{
		{spec: "body"}, {spec: "none"}, {spec: "json:/amount"}, {spec: "json:/amount,/currency,/items/0"},
		{spec: "", err: "want body, none or json:"},
		{spec: "headers", err: "want body, none or json:"},
		{spec: "json:", err: "empty JSON Pointer"},
		{spec: "json:/a,", err: "empty JSON Pointer"},
		{spec: "json:/a,b", err: "does not start with /"},
		{spec: "json:/a,/a", err: "/a is listed twice"},
	} {
		f, err := keysource.ParseFingerprint(tt.spec)
		if tt.err != "" {
			if err == nil || !strings.Contains(err.Error(), tt.err) {
				t.Errorf("ParseFingerprint(%q): got error %v, want one containing %q", tt.spec, err, tt.err)
			}
			continue
		}
		if err != nil || f.String() != tt.spec || f.IsBody() != (tt.spec == "body") {
			t.Errorf("ParseFingerprint(%q): got %q (IsBody %v), %v", tt.spec, f, f.IsBody(), err)
		}
	}
	var zero keysource.Fingerprint
	if !zero.IsBody() || zero.String() != "body" {
		t.Errorf("zero Fingerprint: IsBody %v String %q", zero.IsBody(), zero)
	}
}

func TestAppendBody(t *testing.T) {
	sub, err := keysource.ParseFingerprint("json:/amount,/currency")
	if err != nil {
		t.Fatal(err)
	}
	none, _ := keysource.ParseFingerprint("none")
	var body keysource.Fingerprint
	base := `{"amount":100,"currency":"eur","meta":{"b":1,"a":2}}`
	for _, tt := range []struct {
		name, other string
		f           keysource.Fingerprint
		same        bool
	}{
		{"a field outside the subset", `{"amount":100,"currency":"eur","meta":{"b":9}}`, sub, true},
		{"member order and spaces", `{ "currency" : "eur", "amount" : 100 }`, sub, true},
		{"escapes", `{"amount":100,"currency":"\u0065ur"}`, sub, true},
		{"nested order", `{"amount":{"b":1,"a":2},"currency":"eur"}`, sub, false},
		{"a field inside the subset", `{"amount":101,"currency":"eur","meta":{"b":1,"a":2}}`, sub, false},
		{"a number spelt otherwise", `{"amount":100.0,"currency":"eur"}`, sub, false},
		{"a field absent", `{"amount":100,"meta":{}}`, sub, false},
		{"null is not absent", `{"amount":100,"currency":null}`, sub, false},
		{"not JSON", `amount=100&currency=eur`, sub, false},
		{"none ignores the body", `anything`, none, true},
		{"body counts bytes", `{"currency":"eur","amount":100,"meta":{"b":1,"a":2}}`, body, false},
		{"body, the same bytes", base, body, true},
	} {
		t.Run(tt.name, func(t *testing.T) {
			a, b := tt.f.AppendBody(nil, []byte(base)), tt.f.AppendBody(nil, []byte(tt.other))
			if bytes.Equal(a, b) != tt.same {
				t.Errorf("AppendBody(%s) vs (%s): equal %v, want %v", base, tt.other, !tt.same, tt.same)
			}
		})
	}
	// Absent then present must not equal present then absent.
	two, _ := keysource.ParseFingerprint("json:/a,/b")
	if bytes.Equal(two.AppendBody(nil, []byte(`{"a":1}`)), two.AppendBody(nil, []byte(`{"b":1}`))) {
		t.Error(`json:/a,/b: {"a":1} and {"b":1} fingerprint alike`)
	}
	// Not JSON never equals a JSON selection.
	if bytes.Equal(two.AppendBody(nil, []byte("\x00\x00")), two.AppendBody(nil, []byte(`{}`))) {
		t.Error("a body that is not JSON fingerprints as an empty selection")
	}
}
