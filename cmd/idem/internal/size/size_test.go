package size

import "testing"

func TestParseSize(t *testing.T) {
	t.Parallel()
	for in, want := range map[string]int64{
		"1048576": 1 << 20, "1MiB": 1 << 20, "512KiB": 512 << 10, "512kib": 512 << 10, "2GiB": 2 << 30,
		"1MB": 1000000, "1KB": 1000, "100B": 100, "1m": 1 << 20, " 4 KiB ": 4 << 10,
	} {
		if got, err := Parse(in); err != nil || got != want {
			t.Errorf("Parse(%q): got %d, %v, want %d", in, got, err, want)
		}
	}
	for _, in := range []string{"", "0", "-1", "1XB", "MiB", "1.5MiB", "99999999999GiB"} {
		if _, err := Parse(in); err == nil {
			t.Errorf("Parse(%q): got no error", in)
		}
	}
	for n, want := range map[int64]string{1 << 20: "1MiB", 512 << 10: "512KiB", 1000: "1000", 3 << 30: "3GiB"} {
		if got := Format(n); got != want {
			t.Errorf("Format(%d): got %q, want %q", n, got, want)
		}
	}
}
