package httpsyntax

import "testing"

func TestIsToken(t *testing.T) {
	for s, want := range map[string]bool{"POST": true, "Idempotency-Key": true, "x!#$%&'*+-.^_`|~9": true, "": false, "a b": false, "a:b": false, "é": false, "a\x00": false} {
		if got := IsToken(s); got != want {
			t.Errorf("IsToken(%q): got %v, want %v", s, got, want)
		}
	}
}
