// Package cli is the command line of the idem binary: flags defined by
// tables that point at the variables they set, each also read from an
// IDEM_* environment variable, help that shows both, and the usage errors
// that end a command with exit code 2.
package cli

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"strings"
	"time"

	"github.com/idemgo/idem/cmd/idem/internal/redact"
)

// UsageError is an error in the command line or the environment: the
// command ends with exit code 2.
type UsageError struct{ msg string }

func (e *UsageError) Error() string { return e.msg }

// Usagef returns a UsageError with the message format and args make.
func Usagef(format string, args ...any) error {
	return &UsageError{msg: fmt.Sprintf(format, args...)}
}

// Check returns the usage error of format and args when bad holds, nil
// otherwise: one row of a command's table of checks.
func Check(bad bool, format string, args ...any) error {
	if bad {
		return Usagef(format, args...)
	}
	return nil
}

// FirstError returns the first of errs that is not nil.
func FirstError(errs ...error) error {
	for _, err := range errs {
		if err != nil {
			return err
		}
	}
	return nil
}

// Cause returns the error that err wraps, or err: the error a flag.Value
// returned without the flag package's wording around it, the system error
// of a *fs.PathError without the path said already.
func Cause(err error) error {
	if u := errors.Unwrap(err); u != nil {
		return u
	}
	return err
}

// URLError is the usage error of a URL flag whose value err rejects: the
// value and the error without its secrets, and a hint when the value lacks
// a scheme (a bare host:port), which the URL parsers read oddly; a
// Postgres keyword/value string needs none.
func URLError(flag, raw string, err error, scheme string) error {
	hint := ""
	if !strings.Contains(raw, "://") && !(scheme == "postgres" && redact.IsKeywordValue(raw)) {
		hint = "; add the scheme: " + flag + " " + scheme + "://" + redact.URL(raw)
	}
	return Usagef("invalid %s URL %q: %s%s", flag, redact.URL(raw), redact.Scrub(err.Error(), raw), hint)
}

// Set is a flag.FlagSet that knows each flag's value placeholder, reads
// IDEM_* environment variables and prints help that reads well.
type Set struct {
	fs              *flag.FlagSet
	name, args, doc string // the command's name, usage line and help
	metas           []meta
	set             map[string]bool // set on the command line or by the environment
}

type meta struct {
	name        string
	placeholder string // "" for booleans
	secret      Secret
}

// Secret says whether a flag's value holds a secret to hide in what the
// command prints.
type Secret uint8

// The kinds of secrets.
const (
	NoSecret   Secret = iota
	URLSecret         // a URL, whose password and secret parameters are hidden (redact.URL)
	FullSecret        // a password, hidden wherever it appears
)

// NewSet returns the flags of the command name, whose usage line shows
// args after the name and whose help shows doc.
func NewSet(name, args, doc string) *Set {
	fs := flag.NewFlagSet("idem "+name, flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	fs.Usage = func() {}
	return &Set{fs: fs, name: name, args: args, doc: doc, set: make(map[string]bool)}
}

// EnvName returns the environment variable of a flag: IDEM_ and its name
// in upper case with - as _.
func EnvName(flagName string) string {
	return "IDEM_" + strings.ToUpper(strings.ReplaceAll(flagName, "-", "_"))
}

// Def is one row of a flag table: the flag's name, the placeholder of its
// value in the help ("" for a boolean), the value it sets (holding the
// default), its help, whether it holds a secret, and the name of the
// field it sets (idemproxy.Proxy's), if any, to name the flag in the
// field's errors.
type Def struct {
	Name, Placeholder string
	Value             flag.Value
	Usage             string
	Secret            Secret
	Field             string
}

// Define defines the flags of a table.
func (f *Set) Define(defs ...Def) {
	for _, d := range defs {
		f.fs.Var(d.Value, d.Name, d.Usage)
		f.metas = append(f.metas, meta{name: d.Name, placeholder: d.Placeholder, secret: d.Secret})
	}
}

// String defines a flag that sets *p, def by default.
func (f *Set) String(p *string, name, placeholder, def, usage string) {
	*p = def
	f.Define(Def{Name: name, Placeholder: placeholder, Value: String(p), Usage: usage})
}

// Bool defines a flag that sets *p, def by default.
func (f *Set) Bool(p *bool, name string, def bool, usage string) {
	*p = def
	f.Define(Def{Name: name, Value: Bool(p), Usage: usage})
}

// Duration defines a flag that sets *p, def by default.
func (f *Set) Duration(p *time.Duration, name string, def time.Duration, usage string) {
	*p = def
	f.Define(Def{Name: name, Placeholder: "DURATION", Value: Duration(p), Usage: usage})
}

// Int defines a flag that sets *p, def by default.
func (f *Set) Int(p *int, name, placeholder string, def int, usage string) {
	*p = def
	f.Define(Def{Name: name, Placeholder: placeholder, Value: Int(p), Usage: usage})
}

// Hider returns the hider of the values of the flags that hold secrets,
// once parsed; nil if none holds one.
func (f *Set) Hider() *redact.Hider {
	var urls, passwords []string
	for _, m := range f.metas {
		value := f.fs.Lookup(m.name).Value
		v := value.String()
		switch m.secret {
		case URLSecret:
			if l, ok := value.(interface{ Values() []string }); ok { // a flag of several URLs
				urls = append(urls, l.Values()...)
				continue
			}
			urls = append(urls, v)
		case FullSecret:
			passwords = append(passwords, v)
		}
	}
	return redact.NewHider(urls, passwords)
}

// IsSet reports whether the flag was given on the command line or in the
// environment.
func (f *Set) IsSet(name string) bool { return f.set[name] }

// Names returns the names of the flags, in the order they were defined.
func (f *Set) Names() []string {
	names := make([]string, len(f.metas))
	for i, m := range f.metas {
		names[i] = m.name
	}
	return names
}

// Parse parses args, flags and positional arguments in any order ("--"
// ends the flags), then fills the flags not given from the environment
// that getenv reads. It returns the positional arguments, flag.ErrHelp
// for -h or --help, or a UsageError.
func (f *Set) Parse(args []string, getenv func(string) string) ([]string, error) {
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
		name := EnvName(m.name)
		v := getenv(name)
		if v == "" {
			continue
		}
		if err := f.fs.Set(m.name, v); err != nil {
			return nil, Usagef("invalid value %q in %s: %v", v, name, Cause(err))
		}
		f.set[m.name] = true
	}
	return pos, nil
}

// flagError rewrites the flag package's errors into one line that says
// what to do.
func (f *Set) flagError(err error) error {
	msg := err.Error()
	hint := "; run 'idem " + f.name + " --help'"
	if name, ok := strings.CutPrefix(msg, "flag provided but not defined: "); ok {
		return Usagef("%s: unknown flag -%s%s", f.name, strings.TrimLeft(name, "-"), hint)
	}
	if name, ok := strings.CutPrefix(msg, "flag needs an argument: "); ok {
		return Usagef("%s: flag -%s needs a value%s", f.name, strings.TrimLeft(name, "-"), hint)
	}
	if rest, ok := strings.CutPrefix(msg, "invalid value "); ok {
		if value, flagReason, ok := strings.Cut(rest, " for flag -"); ok {
			name, reason, _ := strings.Cut(flagReason, ": ")
			return Usagef("%s: invalid --%s %s: %s%s", f.name, name, value, reason, hint)
		}
	}
	return Usagef("%s: %s%s", f.name, msg, hint)
}

// PrintHelp prints the command's usage line, its documentation and one
// line per flag with its default and its environment variable.
func (f *Set) PrintHelp(w io.Writer) {
	var b strings.Builder
	fmt.Fprintf(&b, "Usage: idem %s", f.name)
	if f.args != "" {
		b.WriteString(" " + f.args)
	}
	b.WriteString("\n\n")
	if f.doc != "" {
		b.WriteString(strings.TrimSpace(f.doc))
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
		fmt.Fprintf(&b, "%s)\n", EnvName(m.name))
	}
	io.WriteString(w, b.String())
}
