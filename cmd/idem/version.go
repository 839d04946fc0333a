package main

import (
	"context"
	"fmt"
	"runtime"
	"runtime/debug"
)

// buildVersion is set at link time: go build -ldflags "-X main.buildVersion=v1.2.3".
var buildVersion = ""

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
		flags: func(fs *flagSet) func(context.Context, *env, []string) error {
			return func(_ context.Context, e *env, args []string) error {
				if len(args) > 0 {
					return usagef("version: unexpected argument %q", args[0])
				}
				fmt.Fprintf(e.stdout, "idem %s (%s, %s/%s)\n", version(), runtime.Version(), runtime.GOOS, runtime.GOARCH)
				return nil
			}
		},
	}
}
