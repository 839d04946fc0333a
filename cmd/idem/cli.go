package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"strconv"
	"strings"

	"github.com/idemgo/idem/cmd/idem/internal/cli"
	"github.com/idemgo/idem/cmd/idem/internal/redact"
	"github.com/redis/go-redis/v9"
)

// Exit codes.
const (
	exitOK      = 0
	exitRuntime = 1 // the command could not do its job (or doctor found a FAIL)
	exitUsage   = 2 // bad command line or environment
)

// errHelp reports that help was printed: exit code 0.
var errHelp = errors.New("help printed")

// exitError ends a command with a code and no message of its own (the
// command printed its findings already).
type exitError struct{ code int }

func (e *exitError) Error() string { return "exit " + strconv.Itoa(e.code) }

// env is what a command gets from the process.
type env struct {
	stdout io.Writer
	stderr io.Writer
	getenv func(string) string
	// hider hides the secrets of the command's URL and password flags
	// (package redact); nil until the flags are parsed.
	hider *redact.Hider
}

// command is one subcommand.
type command struct {
	name    string
	args    string // what follows the name in the usage line
	summary string // one line, for `idem help`
	doc     string // paragraphs, for `idem help <name>`
	flags   func(fs *cli.Set) func(ctx context.Context, e *env, args []string) error
}

func commands() []*command {
	return []*command{proxyCommand(), getCommand(), lsCommand(), rmCommand(), doctorCommand(), recoverCommand(), relayCommand(), consumeCommand(), upstreamDemoCommand(), versionCommand()}
}

// run runs the idem command line args (without the program name) and
// returns the exit code. Errors are reported as one line on stderr, prefixed
// "idem: ".
func run(ctx context.Context, args []string, stdout, stderr io.Writer, getenv func(string) string) int {
	e := &env{stdout: stdout, stderr: stderr, getenv: getenv}
	redisLogOnce.Do(func() { redis.SetLogger(redisLog) })
	err := dispatch(ctx, e, args)
	var ee *exitError
	switch {
	case err == nil, errors.Is(err, errHelp):
		return exitOK
	case errors.As(err, &ee):
		return ee.code
	}
	fmt.Fprintln(stderr, "idem: "+oneLine(e.hider.Hide(err.Error())))
	var ue *cli.UsageError
	if errors.As(err, &ue) {
		return exitUsage
	}
	return exitRuntime
}

// oneLine keeps an error message on one line.
func oneLine(s string) string {
	s = strings.TrimSpace(s)
	return strings.Join(strings.Fields(strings.ReplaceAll(s, "\n", " ")), " ")
}

func dispatch(ctx context.Context, e *env, args []string) error {
	if len(args) == 0 {
		printUsage(e.stderr)
		return &exitError{code: exitUsage}
	}
	name := args[0]
	switch name {
	case "help", "-h", "-help", "--help":
		if len(args) > 1 && name == "help" {
			c := lookup(args[1])
			if c == nil {
				return cli.Usagef("unknown command %q; run 'idem help' for the list", args[1])
			}
			fs := newFlagSet(c)
			c.flags(fs)
			fs.PrintHelp(e.stdout)
			return errHelp
		}
		printUsage(e.stdout)
		return errHelp
	case "-version", "--version":
		name = "version"
	}
	c := lookup(name)
	if c == nil {
		return cli.Usagef("unknown command %q; run 'idem help' for the list", name)
	}
	fs := newFlagSet(c)
	runFn := c.flags(fs)
	pos, err := fs.Parse(args[1:], e.getenv)
	if errors.Is(err, flag.ErrHelp) {
		fs.PrintHelp(e.stdout)
		return errHelp
	}
	if err != nil {
		return err
	}
	e.hider = fs.Hider()
	return runFn(ctx, e, pos)
}

func lookup(name string) *command {
	for _, c := range commands() {
		if c.name == name {
			return c
		}
	}
	return nil
}

func printUsage(w io.Writer) {
	var b strings.Builder
	b.WriteString("idem makes POST and PATCH requests to an HTTP API safe to retry: a request\n")
	b.WriteString("with an Idempotency-Key runs once, and retries get the first response again.\n\n")
	b.WriteString("Usage: idem <command> [flags] [args]\n\nCommands:\n")
	for _, c := range commands() {
		fmt.Fprintf(&b, "  %-14s %s\n", c.name, c.summary)
	}
	fmt.Fprintf(&b, "  %-14s %s\n", "help", "show help for a command: idem help proxy")
	b.WriteString("\nEvery flag can also be set with an environment variable: IDEM_ and the flag's\n")
	b.WriteString("name in upper case with - as _ (--max-body is IDEM_MAX_BODY). A flag on the\n")
	b.WriteString("command line wins over the environment.\n")
	io.WriteString(w, b.String())
}

func newFlagSet(c *command) *cli.Set { return cli.NewSet(c.name, c.args, c.doc) }
