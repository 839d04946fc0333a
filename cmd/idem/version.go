package main

import (
	"context"
	"encoding/json"
	"fmt"
	"runtime"
	"runtime/debug"
	"strings"

	"github.com/idemgo/idem/cmd/idem/internal/cli"
)

// Set at link time by make build, make image and make release, from the
// git checkout (see the Makefile's STAMP):
//
//	go build -ldflags "-X main.buildVersion=v1.2.3 -X main.buildCommit=<sha> -X main.buildDate=<RFC 3339> -X main.buildDirty=false"
//
// buildVersion is the nearest tag (git describe: v1.2.3, or
// v1.2.3-4-g0123abc past it) or the abbreviated commit when no tag is
// reachable, with -dirty when the working tree had changes. Without them
// (go install, go build) the version is the module's and the commit and
// dirty flag those the Go toolchain recorded from version control, if any.
var (
	buildVersion = ""
	buildCommit  = ""
	buildDate    = ""
	buildDirty   = ""
)

// buildInfo is what `idem version --json` prints.
type buildInfo struct {
	Version string `json:"version"`
	Commit  string `json:"commit"`
	// Dirty reports that the working tree had uncommitted changes when
	// the binary was built; false when unknown.
	Dirty    bool   `json:"dirty"`
	Date     string `json:"date,omitempty"` // the commit's date (RFC 3339), when stamped
	Go       string `json:"go"`
	Platform string `json:"platform"` // GOOS/GOARCH
}

// currentBuild returns the binary's build information: the stamped values,
// or what the Go toolchain recorded.
func currentBuild() buildInfo {
	b := buildInfo{
		Version:  buildVersion,
		Commit:   buildCommit,
		Dirty:    buildDirty == "true",
		Date:     buildDate,
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
	if buildDirty == "" {
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

// version returns the binary's version (see buildVersion).
func version() string { return currentBuild().Version }

func versionCommand() *command {
	return &command{
		name:    "version",
		args:    "[--json]",
		summary: "print the version",
		doc: `
Prints the version, the commit, whether the working tree had uncommitted
changes (dirty), the commit's date, the Go version and the platform. Builds
from a git checkout by make are stamped: the version is the nearest tag
(git describe), or the commit when no tag is reachable, with -dirty for a
tree with changes. With --json, one JSON object:
{"version":...,"commit":...,"dirty":...,"date":...,"go":...,"platform":...}.`,
		flags: func(fs *cli.Set) func(context.Context, *env, []string) error {
			var asJSON bool
			fs.Bool(&asJSON, "json", false, "print one JSON object")
			return func(_ context.Context, e *env, args []string) error {
				if len(args) > 0 {
					return cli.Usagef("version: unexpected argument %q", args[0])
				}
				b := currentBuild()
				if asJSON {
					enc := json.NewEncoder(e.stdout)
					return enc.Encode(b)
				}
				fmt.Fprintln(e.stdout, b.line())
				return nil
			}
		},
	}
}

// line is what `idem version` prints:
//
//	idem v0.1.0 (commit 0123456789ab, built 2026-01-02T03:04:05Z, go1.26.0, linux/amd64)
//
// with "dirty, " after the commit when the tree had changes and the
// version does not say so already.
func (b buildInfo) line() string {
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
