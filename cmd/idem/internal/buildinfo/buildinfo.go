// Package buildinfo is what the idem binary says of its build (idem
// version, the idem_build_info metric, the traces' service.version): the
// values make stamps at link time into package main, or else what the Go
// toolchain recorded from version control.
package buildinfo

import (
	"fmt"
	"runtime"
	"runtime/debug"
	"strings"
)

// Stamp holds the values set at link time (see main's buildVersion); ""
// where unset.
type Stamp struct{ Version, Commit, Date, Dirty string }

// Info is what `idem version --json` prints.
type Info struct {
	Version string `json:"version"`
	Commit  string `json:"commit"`
	// Dirty reports that the working tree had uncommitted changes when
	// the binary was built; false when unknown.
	Dirty    bool   `json:"dirty"`
	Date     string `json:"date,omitempty"` // the commit's date (RFC 3339), when stamped
	Go       string `json:"go"`
	Platform string `json:"platform"` // GOOS/GOARCH
}

// Current returns the binary's build information: the stamped values, or
// what the Go toolchain recorded.
func Current(st Stamp) Info {
	b := Info{
		Version:  st.Version,
		Commit:   st.Commit,
		Dirty:    st.Dirty == "true",
		Date:     st.Date,
		Go:       runtime.Version(),
		Platform: runtime.GOOS + "/" + runtime.GOARCH,
	}
	var rev string
	var modified bool
	mainVersion := ""
	if bi, ok := debug.ReadBuildInfo(); ok {
		mainVersion = bi.Main.Version
		for _, s := range bi.Settings {
			switch s.Key {
			case "vcs.revision":
				rev = s.Value
			case "vcs.modified":
				modified = s.Value == "true"
			}
		}
	}
	if b.Commit == "" {
		b.Commit = rev
	}
	if st.Dirty == "" {
		b.Dirty = modified
	}
	if b.Version == "" {
		b.Version = toolchainVersion(mainVersion, rev, modified)
	}
	return b
}

// toolchainVersion is the version of a binary that was not stamped: the
// module version the toolchain recorded, else devel-<commit>[+dirty], else
// devel.
func toolchainVersion(mainVersion, rev string, modified bool) string {
	if mainVersion != "" && mainVersion != "(devel)" {
		return mainVersion
	}
	if rev == "" {
		return "devel"
	}
	if len(rev) > 12 {
		rev = rev[:12]
	}
	if modified {
		return "devel-" + rev + "+dirty"
	}
	return "devel-" + rev
}

// Line is what `idem version` prints:
//
//	idem v0.1.0 (commit 0123456789ab, built 2026-01-02T03:04:05Z, go1.26.0, linux/amd64)
//
// with "dirty, " after the commit when the tree had changes and the
// version does not say so already.
func (b Info) Line() string {
	var s strings.Builder
	fmt.Fprintf(&s, "idem %s (", b.Version)
	if b.Commit != "" {
		fmt.Fprintf(&s, "commit %.12s, ", b.Commit)
	}
	if b.Dirty && !strings.HasSuffix(b.Version, "-dirty") && !strings.HasSuffix(b.Version, "+dirty") {
		s.WriteString("dirty, ")
	}
	if b.Date != "" {
		fmt.Fprintf(&s, "built %s, ", b.Date)
	}
	fmt.Fprintf(&s, "%s, %s)", b.Go, b.Platform)
	return s.String()
}
