package main

import (
	"context"
	"encoding/json"
	"fmt"

	"github.com/idemgo/idem/cmd/idem/internal/buildinfo"
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

// version returns the binary's version (see buildVersion).
func version() string { return currentBuild().Version }

// currentBuild returns the binary's build information.
func currentBuild() buildinfo.Info {
	return buildinfo.Current(buildinfo.Stamp{Version: buildVersion, Commit: buildCommit, Date: buildDate, Dirty: buildDirty})
}

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
				fmt.Fprintln(e.stdout, b.Line())
				return nil
			}
		},
	}
}
