package sidecar

import (
	"bytes"
	"encoding/json"
	"reflect"
	"testing"
)

// checkParseOutcomes: parseOutcomes leaves blob as it was and, when it
// takes an answer, decodes what encoding/json.Unmarshal decodes.
func checkParseOutcomes(t *testing.T, blob []byte) (ok bool) {
	t.Helper()
	orig := bytes.Clone(blob)
	got, ok := parseOutcomes(blob, 4)
	if !bytes.Equal(blob, orig) {
		t.Fatalf("%q: parseOutcomes wrote its input: %q", orig, blob)
	}
	if !ok {
		return false
	}
	var want []BatchOutcome
	if err := json.Unmarshal(orig, &want); err != nil {
		t.Fatalf("%q: parseOutcomes took it, encoding/json: %v", orig, err)
	}
	if len(got) != len(want) || len(got) > 0 && !reflect.DeepEqual(got, want) {
		t.Fatalf("%q: got %+v, want %+v", orig, got, want)
	}
	return true
}

// TestParseOutcomes: the answers of the repository's batch handlers take
// the fast path; what it does not take falls back to encoding/json.
func TestParseOutcomes(t *testing.T) {
	for _, tc := range []struct {
		blob string
		fast bool
	}{
		{`[]`, true},
		{` [ ] `, true},
		{`[{"status":200,"body":"{\"ok\":true}"},{"status":400,"body":"{\"error\": \"no amount\"}"}]`, true},
		{"[{\"status\": 200, \"body\": \"a\\\\b\\/c\\n\\t\\r\\b\\f\", \"encoding\": \"text\"}]\n", true},
		{`[{"status":200,"body":"/w==","encoding":"base64"},{}]`, true},
		{`[{"status":200,"body":"é€😀"}]`, true},
		{`[{"status":200,"body":"x","status":201}]`, true},
		{`[{"status":200,"headers":{"Content-Type":"application/json"},"body":"{}"}]`, false},
		{`[{"Status":200}]`, false},
		{`[{"status":200,"body":"\u00e9"}]`, false},
		{`[{"status":200.0}]`, false},
		{`[{"status":2e2}]`, false},
		{`[{"status":0200}]`, false},
		{`[{"status":-1}]`, false},
		{`[{"status":200,"extra":1}]`, false},
		{`[null]`, false},
		{`[{"status":200}] x`, false},
		{`[{"status":200},]`, false},
		{"[{\"body\":\"\xff\"}]", false},
		{"[{\"body\":\"a\nb\"}]", false},
		{`[{"status":200,"body":"a\`, false},
		{`{"status":200}`, false},
	} {
		if got := checkParseOutcomes(t, []byte(tc.blob)); got != tc.fast {
			t.Errorf("%q: fast path %v, want %v", tc.blob, got, tc.fast)
		}
	}
}

// FuzzParseOutcomes: for any answer, parseOutcomes either declines it or
// decodes what encoding/json decodes, and never writes its input.
func FuzzParseOutcomes(f *testing.F) {
	f.Add([]byte(`[{"status":200,"body":"{\"ok\":true}"},{"status":503,"encoding":"base64","body":"/w=="}]`))
	f.Add([]byte(`[{"status": 200, "body": "a\\\"b\/\n"}]`))
	f.Add([]byte(`[{"status":200,"headers":{"A":"b"}}]`))
	f.Fuzz(func(t *testing.T, blob []byte) { checkParseOutcomes(t, blob) })
}
