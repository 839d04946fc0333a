package idemhttp_test

import (
	"errors"
	"strings"
	"testing"

	"github.com/idemgo/idem/idemhttp"
)

func TestParseKey(t *testing.T) {
	max := strings.Repeat("a", 255)
	tests := []struct {
		in      string
		want    string
		wantErr string // substring of the error; "" for success
	}{
		{in: "abc", want: "abc"},
		{in: "8e03978e-40d5-43e8-bc93-6894a57f9324", want: "8e03978e-40d5-43e8-bc93-6894a57f9324"},
		{in: `"8e03978e-40d5-43e8-bc93-6894a57f9324"`, want: "8e03978e-40d5-43e8-bc93-6894a57f9324"},
		{in: "  abc\t", want: "abc"},
		{in: "a b", want: "a b"},
		{in: `abc"`, want: `abc"`},
		{in: `a\b`, want: `a\b`},
		{in: `"a\"b"`, want: `a"b`},
		{in: `"a\\b"`, want: `a\b`},
		{in: `"\\\""`, want: `\"`},
		{in: `"a b"`, want: "a b"},
		{in: max, want: max},
		{in: `"` + max + `"`, want: max},
		{in: `"` + strings.Repeat(`\"`, 255) + `"`, want: strings.Repeat(`"`, 255)},
		{in: "", wantErr: "empty"},
		{in: " \t ", wantErr: "empty"},
		{in: `""`, wantErr: "empty"},
		{in: max + "a", wantErr: "256 characters long, over the limit of 255"},
		{in: `"` + max + `a"`, wantErr: "over the limit of 255"},
		{in: strings.Repeat("a", 10000), wantErr: "over the limit of 255"},
		{in: "a\x00b", wantErr: "control character 0x00 at position 1"},
		{in: "a\nb", wantErr: "control character"},
		{in: "a\x7fb", wantErr: "control character 0x7f"},
		{in: "caf\xc3\xa9", wantErr: "non-ASCII"},
		{in: `"`, wantErr: "no closing quote"},
		{in: `"abc`, wantErr: "no closing quote"},
		{in: `"abc\`, wantErr: "ends inside an escape"},
		{in: `"a\nb"`, wantErr: `invalid escape \n`},
		{in: `"abc"def`, wantErr: "after the closing quote"},
		{in: `"abc";p=1`, wantErr: "after the closing quote"},
		{in: "\"a\tb\"", wantErr: "control character 0x09"},
		{in: "\"caf\xc3\xa9\"", wantErr: "non-ASCII"},
	}
	for _, tt := range tests {
		name := tt.in
		if len(name) > 40 {
			name = name[:40] + "..."
		}
		t.Run(name, func(t *testing.T) {
			got, err := idemhttp.ParseKey(tt.in)
			if tt.wantErr == "" {
				if err != nil || got != tt.want {
					t.Errorf("got %q, %v, want %q, nil", got, err, tt.want)
				}
				return
			}
			if err == nil || !errors.Is(err, idemhttp.ErrInvalidKey) || !strings.Contains(err.Error(), tt.wantErr) {
				t.Errorf("got %q, %v, want an ErrInvalidKey containing %q", got, err, tt.wantErr)
			}
		})
	}
}
