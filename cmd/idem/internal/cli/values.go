package cli

import (
	"errors"
	"flag"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/idemgo/idem/cmd/idem/internal/size"
	"github.com/idemgo/idem/keysource"
)

// The flag.Values of the flag tables. Each points at the variable it
// sets: a field of idemproxy.Proxy, of the store's options, or of a
// command's configuration. The value the variable holds when the flag is
// defined is the flag's default.

// String returns the value of a flag that sets *p.
func String(p *string) flag.Value { return stringValue{p} }

// Bool returns the value of a boolean flag that sets *p.
func Bool(p *bool) flag.Value { return boolValue{p} }

// Not returns the value of a boolean flag that sets *p to its negation
// (--require-key=false sets idemproxy.Proxy.KeyOptional).
func Not(p *bool) flag.Value { return notValue{p} }

// Int returns the value of a flag that sets *p, not negative.
func Int(p *int) flag.Value { return intValue{p} }

// Duration returns the value of a flag that sets *p, not negative.
func Duration(p *time.Duration) flag.Value { return durationValue{p} }

// Bound and BoundInt return the value of a flag that sets a bound of
// idemproxy.Proxy, whose zero is the default and a negative value no
// bound: the flag's 0 means no bound.
func Bound(p *time.Duration) flag.Value { return boundDuration{p} }

// BoundInt is Bound for an int.
func BoundInt(p *int) flag.Value { return boundInt{p} }

// OrOff returns the value of a flag that sets *name, or *off for "".
func OrOff(name *string, off *bool) flag.Value { return offValue{name, off} }

// Size returns the value of a flag that sets a size in bytes (see
// size.Parse).
func Size[T int | int64](p *T) flag.Value { return sizeValue[T]{p} }

// List returns the value of a flag that sets a comma-separated list,
// upper-cased if upper.
func List(p *[]string, upper bool) flag.Value { return listValue{p, upper} }

// stringValue sets a string.
type stringValue struct{ p *string }

func (v stringValue) String() string {
	if v.p == nil {
		return ""
	}
	return *v.p
}

func (v stringValue) Set(s string) error { *v.p = s; return nil }

// boolValue sets a bool (a flag given without a value sets true).
type boolValue struct{ p *bool }

func (v boolValue) String() string     { return strconv.FormatBool(v.p != nil && *v.p) }
func (v boolValue) IsBoolFlag() bool   { return true }
func (v boolValue) Set(s string) error { return setBool(v.p, s, false) }

// notValue sets the negation of a bool: --require-key=false sets
// idemproxy.Proxy.KeyOptional.
type notValue struct{ p *bool }

func (v notValue) String() string     { return strconv.FormatBool(v.p == nil || !*v.p) }
func (v notValue) IsBoolFlag() bool   { return true }
func (v notValue) Set(s string) error { return setBool(v.p, s, true) }

func setBool(p *bool, s string, negate bool) error {
	b, err := strconv.ParseBool(s)
	if err != nil {
		return fmt.Errorf("not a boolean (true or false): %q", s)
	}
	*p = b != negate
	return nil
}

// intValue sets an int that must not be negative.
type intValue struct{ p *int }

func (v intValue) String() string {
	if v.p == nil {
		return ""
	}
	return strconv.Itoa(*v.p)
}

func (v intValue) Set(s string) error {
	n, err := strconv.Atoi(s)
	if err != nil {
		return fmt.Errorf("not an integer: %q", s)
	}
	if n < 0 {
		return fmt.Errorf("%d is negative", n)
	}
	*v.p = n
	return nil
}

// durationValue is a flag.Value for a time.Duration that reports why a
// value is invalid (the flag package says only "parse error").
type durationValue struct{ p *time.Duration }

func (v durationValue) String() string {
	if v.p == nil {
		return ""
	}
	return FormatDuration(*v.p)
}

// FormatDuration renders d as time.Duration does, without zero minutes and
// seconds: 24h, 30m, 1h30m, 2.5s.
func FormatDuration(d time.Duration) string {
	s := d.String()
	if d != 0 && d%time.Minute == 0 {
		s = strings.TrimSuffix(s, "0s")
		if d%time.Hour == 0 {
			s = strings.TrimSuffix(s, "0m")
		}
	}
	return s
}

func (v durationValue) Set(s string) error {
	d, err := time.ParseDuration(s)
	if err != nil {
		return fmt.Errorf("not a duration (examples: 500ms, 30s, 24h): %q", s)
	}
	if d < 0 {
		return fmt.Errorf("negative duration %v", d)
	}
	*v.p = d
	return nil
}

// boundDuration and boundInt set a bound of idemproxy.Proxy, whose zero
// is the default and a negative value no bound: the flag's 0 means no
// bound.
type (
	boundDuration struct{ p *time.Duration }
	boundInt      struct{ p *int }
)

func (v boundDuration) String() string { return durationValue{v.p}.String() }
func (v boundInt) String() string      { return intValue{v.p}.String() }

func (v boundDuration) Set(s string) error { return setBound(v.p, durationValue{v.p}.Set(s)) }
func (v boundInt) Set(s string) error      { return setBound(v.p, intValue{v.p}.Set(s)) }

func setBound[T time.Duration | int](p *T, err error) error {
	if err == nil && *p == 0 {
		*p = -1
	}
	return err
}

type offValue struct {
	name *string
	off  *bool
}

func (v offValue) String() string {
	if v.name == nil || *v.off {
		return ""
	}
	return *v.name
}

func (v offValue) Set(s string) error {
	*v.name, *v.off = s, s == ""
	return nil
}

// sizeValue is a flag.Value for a size in bytes: 1048576, 512KiB, 1MiB,
// 2GiB, or with decimal units 1KB, 1MB, 1GB.
type sizeValue[T int | int64] struct{ p *T }

func (v sizeValue[T]) String() string {
	if v.p == nil {
		return ""
	}
	return size.Format(int64(*v.p))
}

func (v sizeValue[T]) Set(s string) error {
	n, err := size.Parse(s)
	if err != nil {
		return err
	}
	if int64(T(n)) != n {
		return fmt.Errorf("size %q is too large", s)
	}
	*v.p = T(n)
	return nil
}

// listValue is a flag.Value for a comma-separated list.
type listValue struct {
	p     *[]string
	upper bool
}

func (v listValue) String() string {
	if v.p == nil {
		return ""
	}
	return strings.Join(*v.p, ",")
}

func (v listValue) Set(s string) error {
	var out []string
	for item := range strings.SplitSeq(s, ",") {
		item = strings.TrimSpace(item)
		if item == "" {
			continue
		}
		if v.upper {
			item = strings.ToUpper(item)
		}
		out = append(out, item)
	}
	if len(out) == 0 {
		return fmt.Errorf("empty list: %q", s)
	}
	*v.p = out
	return nil
}

// KeySource returns the value of a flag that sets where the key is (see
// keysource.Parse).
func KeySource(p *keysource.Source) flag.Value { return keySourceValue{p} }

// Fingerprint returns the value of a flag that sets what of the body the
// fingerprint covers (see keysource.ParseFingerprint).
func Fingerprint(p *keysource.Fingerprint) flag.Value { return fingerprintValue{p} }

type keySourceValue struct{ p *keysource.Source }

func (v keySourceValue) String() string {
	if v.p == nil || v.p.IsZero() {
		return "header:" + keysource.DefaultHeader
	}
	return v.p.String()
}

func (v keySourceValue) Set(s string) error {
	src, err := keysource.Parse(strings.TrimSpace(s))
	if err != nil {
		return errors.New(strings.TrimPrefix(err.Error(), "keysource: "))
	}
	*v.p = src
	return nil
}

type fingerprintValue struct{ p *keysource.Fingerprint }

func (v fingerprintValue) String() string {
	if v.p == nil {
		return "body"
	}
	return v.p.String()
}

func (v fingerprintValue) Set(s string) error {
	f, err := keysource.ParseFingerprint(strings.TrimSpace(s))
	if err != nil {
		return errors.New(strings.TrimPrefix(err.Error(), "keysource: "))
	}
	*v.p = f
	return nil
}
