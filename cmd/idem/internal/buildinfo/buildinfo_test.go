package buildinfo

import "testing"

// TestVersionUnstamped: a binary built without the link-time values takes
// its version from what the toolchain recorded.
func TestVersionUnstamped(t *testing.T) {
	for _, tc := range []struct {
		main, rev string
		modified  bool
		want      string
	}{
		{"v0.3.0", "0123456789abcdef", false, "v0.3.0"},
		{"(devel)", "0123456789abcdef", false, "devel-0123456789ab"},
		{"(devel)", "0123456789abcdef", true, "devel-0123456789ab+dirty"},
		{"(devel)", "", false, "devel"},
		{"", "", false, "devel"},
	} {
		if got := toolchainVersion(tc.main, tc.rev, tc.modified); got != tc.want {
			t.Errorf("toolchainVersion(%q, %q, %v): got %q, want %q", tc.main, tc.rev, tc.modified, got, tc.want)
		}
	}
}

func TestLine(t *testing.T) {
	for _, tt := range []struct {
		b    Info
		want string
	}{
		{Info{Version: "v0.1.0", Commit: "0123456789abcdef", Date: "2026-01-02T03:04:05Z", Go: "go1.26.0", Platform: "linux/amd64"},
			"idem v0.1.0 (commit 0123456789ab, built 2026-01-02T03:04:05Z, go1.26.0, linux/amd64)"},
		{Info{Version: "v0.1.0", Commit: "0123", Dirty: true, Go: "go1.26.0", Platform: "linux/amd64"},
			"idem v0.1.0 (commit 0123, dirty, go1.26.0, linux/amd64)"},
		{Info{Version: "v0.1.0-dirty", Dirty: true, Go: "go1.26.0", Platform: "linux/amd64"},
			"idem v0.1.0-dirty (go1.26.0, linux/amd64)"},
	} {
		if got := tt.b.Line(); got != tt.want {
			t.Errorf("Line: got %q, want %q", got, tt.want)
		}
	}
}

func TestCurrentStamped(t *testing.T) {
	b := Current(Stamp{Version: "v1.2.3", Commit: "abc", Date: "2026-01-02T03:04:05Z", Dirty: "false"})
	if b.Version != "v1.2.3" || b.Commit != "abc" || b.Dirty || b.Date != "2026-01-02T03:04:05Z" {
		t.Errorf("Current: got %+v, want the stamped values", b)
	}
}
