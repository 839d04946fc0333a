package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"strconv"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"
)

// Exit codes.
const (
	exitOK      = 0
	exitRuntime = 1 // the command could not do its job (or doctor found a FAIL)
	exitUsage   = 2 // bad command line or environment
)

// usageError is an error in the command line or the environment: exit code 2.
type usageError struct{ msg string }

func (e *usageError) Error() string { return e.msg }

func usagef(format string, args ...any) error {
	return &usageError{msg: fmt.Sprintf(format, args...)}
}

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
	// (redact.go); nil until the flags are parsed.
	hider *hider
}

// command is one subcommand.
type command struct {
	name    string
	args    string // what follows the name in the usage line
	summary string // one line, for `idem help`
	doc     string // paragraphs, for `idem help <name>`
	flags   func(fs *flagSet) func(ctx context.Context, e *env, args []string) error
}

func commands() []*command {
	return []*command{proxyCommand(), getCommand(), lsCommand(), rmCommand(), doctorCommand(), recoverCommand(), relayCommand(), upstreamDemoCommand(), versionCommand()}
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
	fmt.Fprintln(stderr, "idem: "+oneLine(e.hider.hide(err.Error())))
	var ue *usageError
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
				return usagef("unknown command %q; run 'idem help' for the list", args[1])
			}
			fs := newFlagSet(c)
			c.flags(fs)
			fs.printHelp(e.stdout)
			return errHelp
		}
		printUsage(e.stdout)
		return errHelp
	case "-version", "--version":
		name = "version"
	}
	c := lookup(name)
	if c == nil {
		return usagef("unknown command %q; run 'idem help' for the list", name)
	}
	fs := newFlagSet(c)
	runFn := c.flags(fs)
	pos, err := fs.parse(args[1:], e)
	if errors.Is(err, flag.ErrHelp) {
		fs.printHelp(e.stdout)
		return errHelp
	}
	if err != nil {
		return err
	}
	e.hider = fs.hider()
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

// flagSet is a flag.FlagSet that knows each flag's value placeholder, reads
// IDEM_* environment variables and prints help that reads well.
type flagSet struct {
	fs    *flag.FlagSet
	cmd   *command
	metas []flagMeta
	set   map[string]bool // set on the command line or by the environment
}

type flagMeta struct {
	name        string
	placeholder string // "" for booleans
	secret      flagSecret
}

// flagSecret says whether a flag's value holds a secret to hide in what
// the command prints.
type flagSecret uint8

const (
	noSecret   flagSecret = iota
	urlSecret             // a URL, whose password and secret parameters are hidden (redactURL)
	fullSecret            // a password, hidden wherever it appears
)

func newFlagSet(c *command) *flagSet {
	fs := flag.NewFlagSet("idem "+c.name, flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	fs.Usage = func() {}
	return &flagSet{fs: fs, cmd: c, set: make(map[string]bool)}
}

func envName(flagName string) string {
	return "IDEM_" + strings.ToUpper(strings.ReplaceAll(flagName, "-", "_"))
}

// flagDef is one row of a flag table: the flag's name, the placeholder of
// its value in the help ("" for a boolean), the value it sets (holding the
// default), its help, whether it holds a secret, and the idemproxy.Proxy
// field it sets, if any (to name the flag in the field's errors).
type flagDef struct {
	name, placeholder string
	value             flag.Value
	usage             string
	secret            flagSecret
	field             string
}

// define defines the flags of a table.
func (f *flagSet) define(defs ...flagDef) {
	for _, d := range defs {
		f.fs.Var(d.value, d.name, d.usage)
		f.metas = append(f.metas, flagMeta{name: d.name, placeholder: d.placeholder, secret: d.secret})
	}
}

func (f *flagSet) String(p *string, name, placeholder, def, usage string) {
	*p = def
	f.define(flagDef{name: name, placeholder: placeholder, value: stringValue{p}, usage: usage})
}

func (f *flagSet) Bool(p *bool, name string, def bool, usage string) {
	*p = def
	f.define(flagDef{name: name, value: boolValue{p}, usage: usage})
}

func (f *flagSet) Duration(p *time.Duration, name string, def time.Duration, usage string) {
	*p = def
	f.define(flagDef{name: name, placeholder: "DURATION", value: durationValue{p}, usage: usage})
}

func (f *flagSet) Int(p *int, name, placeholder string, def int, usage string) {
	*p = def
	f.define(flagDef{name: name, placeholder: placeholder, value: intValue{p}, usage: usage})
}

// hider returns the hider of the values of the flags that hold secrets,
// once parsed; nil if none holds one.
func (f *flagSet) hider() *hider {
	var urls, passwords []string
	for _, m := range f.metas {
		v := f.fs.Lookup(m.name).Value.String()
		switch m.secret {
		case urlSecret:
			urls = append(urls, v)
		case fullSecret:
			passwords = append(passwords, v)
		}
	}
	return newHider(urls, passwords)
}

// isSet reports whether the flag was given on the command line or in the
// environment.
func (f *flagSet) isSet(name string) bool { return f.set[name] }

// parse parses args, flags and positional arguments in any order ("--"
// ends the flags), then fills the flags not given from the environment. It
// returns the positional arguments.
func (f *flagSet) parse(args []string, e *env) ([]string, error) {
	var pos []string
	for {
		if err := f.fs.Parse(args); err != nil {
			if errors.Is(err, flag.ErrHelp) {
				return nil, err
			}
			return nil, f.flagError(err)
		}
		rest := f.fs.Args()
		if len(rest) == 0 {
			break
		}
		if consumed := len(args) - len(rest); consumed > 0 && args[consumed-1] == "--" {
			pos = append(pos, rest...)
			break
		}
		pos = append(pos, rest[0])
		args = rest[1:]
	}
	f.fs.Visit(func(fl *flag.Flag) { f.set[fl.Name] = true })
	for _, m := range f.metas {
		if f.set[m.name] {
			continue
		}
		name := envName(m.name)
		v := e.getenv(name)
		if v == "" {
			continue
		}
		if err := f.fs.Set(m.name, v); err != nil {
			return nil, usagef("invalid value %q in %s: %v", v, name, cause(err))
		}
		f.set[m.name] = true
	}
	return pos, nil
}

// flagError rewrites the flag package's errors into one line that says
// what to do.
func (f *flagSet) flagError(err error) error {
	msg := err.Error()
	hint := "; run 'idem " + f.cmd.name + " --help'"
	if name, ok := strings.CutPrefix(msg, "flag provided but not defined: "); ok {
		return usagef("%s: unknown flag -%s%s", f.cmd.name, strings.TrimLeft(name, "-"), hint)
	}
	if name, ok := strings.CutPrefix(msg, "flag needs an argument: "); ok {
		return usagef("%s: flag -%s needs a value%s", f.cmd.name, strings.TrimLeft(name, "-"), hint)
	}
	if rest, ok := strings.CutPrefix(msg, "invalid value "); ok {
		if value, flagReason, ok := strings.Cut(rest, " for flag -"); ok {
			name, reason, _ := strings.Cut(flagReason, ": ")
			return usagef("%s: invalid --%s %s: %s%s", f.cmd.name, name, value, reason, hint)
		}
	}
	return usagef("%s: %s%s", f.cmd.name, msg, hint)
}

// check returns the usage error of format and args when bad holds, nil
// otherwise: one row of a command's table of checks.
func check(bad bool, format string, args ...any) error {
	if bad {
		return usagef(format, args...)
	}
	return nil
}

// firstError returns the first of errs that is not nil.
func firstError(errs ...error) error {
	for _, err := range errs {
		if err != nil {
			return err
		}
	}
	return nil
}

// cause returns the error that err wraps, or err: the error a flag.Value
// returned without the flag package's wording around it, the system error
// of a *fs.PathError without the path said already.
func cause(err error) error {
	if u := errors.Unwrap(err); u != nil {
		return u
	}
	return err
}

// printHelp prints the command's usage line, its documentation and one
// line per flag with its default and its environment variable.
func (f *flagSet) printHelp(w io.Writer) {
	var b strings.Builder
	fmt.Fprintf(&b, "Usage: idem %s", f.cmd.name)
	if f.cmd.args != "" {
		b.WriteString(" " + f.cmd.args)
	}
	b.WriteString("\n\n")
	if f.cmd.doc != "" {
		b.WriteString(strings.TrimSpace(f.cmd.doc))
		b.WriteString("\n\n")
	}
	if len(f.metas) == 0 {
		io.WriteString(w, b.String())
		return
	}
	b.WriteString("Flags (each also read from the environment variable shown; the flag wins):\n")
	width := 0
	heads := make([]string, len(f.metas))
	for i, m := range f.metas {
		heads[i] = "--" + m.name
		if m.placeholder != "" {
			heads[i] += " " + m.placeholder
		}
		width = max(width, len(heads[i]))
	}
	for i, m := range f.metas {
		fl := f.fs.Lookup(m.name)
		fmt.Fprintf(&b, "  %-*s  %s (", width, heads[i], fl.Usage)
		if fl.DefValue != "" && !(m.placeholder == "" && fl.DefValue == "false") {
			fmt.Fprintf(&b, "default %s, ", fl.DefValue)
		}
		fmt.Fprintf(&b, "%s)\n", envName(m.name))
	}
	io.WriteString(w, b.String())
}
