package main

import (
	"context"
	"fmt"
	"runtime"
	"runtime/debug"
	"strings"

	"github.com/idemgo/idem/cmd/idem/internal/cli"
)

// Set at link time by make release:
//
//	go build -ldflags "-X main.buildVersion=v1.2.3 -X main.buildCommit=<sha> -X main.buildDate=<RFC 3339>"
//
// Without them (go install, go build) the version is the module's and the
// commit the VCS revision the toolchain recorded, if any.
var (
	buildVersion = ""
	buildCommit  = ""
	buildDate    = ""
)

// commit returns the commit the binary was built from: buildCommit, or the
// VCS revision recorded by the toolchain; "" if unknown.
func commit() string {
	if buildCommit != "" {
		return buildCommit
	}
	if bi, ok := debug.ReadBuildInfo(); ok {
		for _, s := range bi.Settings {
			if s.Key == "vcs.revision" {
				return s.Value
			}
		}
	}
	return ""
}

// version returns the binary's version: buildVersion, or the module version
// and VCS revision recorded by the Go toolchain.
func version() string {
	if buildVersion != "" {
		return buildVersion
	}
	bi, ok := debug.ReadBuildInfo()
	if !ok {
		return "unknown"
	}
	v := bi.Main.Version
	var rev, modified string
	for _, s := range bi.Settings {
		switch s.Key {
		case "vcs.revision":
			rev = s.Value
		case "vcs.modified":
			if s.Value == "true" {
				modified = "+dirty"
			}
		}
	}
	if (v == "" || v == "(devel)") && rev != "" {
		if len(rev) > 12 {
			rev = rev[:12]
		}
		return "devel-" + rev + modified
	}
	if v == "" || v == "(devel)" {
		return "devel"
	}
	return v
}

func versionCommand() *command {
	return &command{
		name:    "version",
		summary: "print the version",
		flags: func(fs *cli.Set) func(context.Context, *env, []string) error {
			return func(_ context.Context, e *env, args []string) error {
				if len(args) > 0 {
					return cli.Usagef("version: unexpected argument %q", args[0])
				}
				fmt.Fprintln(e.stdout, versionLine())
				return nil
			}
		},
	}
}

// versionLine is what `idem version` prints:
//
//	idem v0.1.0 (commit 0123456789ab, built 2026-01-02T03:04:05Z, go1.26.0, linux/amd64)
func versionLine() string {
	var b strings.Builder
	fmt.Fprintf(&b, "idem %s (", version())
	if c := commit(); c != "" {
		fmt.Fprintf(&b, "commit %.12s, ", c)
	}
	if buildDate != "" {
		fmt.Fprintf(&b, "built %s, ", buildDate)
	}
	fmt.Fprintf(&b, "%s, %s/%s)", runtime.Version(), runtime.GOOS, runtime.GOARCH)
	return b.String()
}
