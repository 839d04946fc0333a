package main

import (
	"fmt"
	"strconv"
	"strings"
	"time"
)

// durationValue is a flag.Value for a time.Duration that reports why a
// value is invalid (the flag package says only "parse error").
type durationValue struct{ p *time.Duration }

func (v durationValue) String() string {
	if v.p == nil {
		return ""
	}
	return formatDuration(*v.p)
}

// formatDuration renders d as time.Duration does, without zero minutes and
// seconds: 24h, 30m, 1h30m, 2.5s.
func formatDuration(d time.Duration) string {
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

// sizeValue is a flag.Value for a size in bytes: 1048576, 512KiB, 1MiB,
// 2GiB, or with decimal units 1KB, 1MB, 1GB.
type sizeValue struct{ p *int64 }

var sizeUnits = []struct {
	suffix string
	mult   int64
}{
	{"kib", 1 << 10}, {"mib", 1 << 20}, {"gib", 1 << 30},
	{"kb", 1000}, {"mb", 1000 * 1000}, {"gb", 1000 * 1000 * 1000},
	{"k", 1 << 10}, {"m", 1 << 20}, {"g", 1 << 30},
	{"b", 1},
}

func (v sizeValue) String() string {
	if v.p == nil {
		return ""
	}
	return formatSize(*v.p)
}

func (v sizeValue) Set(s string) error {
	n, err := parseSize(s)
	if err != nil {
		return err
	}
	*v.p = n
	return nil
}

func parseSize(s string) (int64, error) {
	t := strings.ToLower(strings.TrimSpace(s))
	mult := int64(1)
	for _, u := range sizeUnits {
		if num, ok := strings.CutSuffix(t, u.suffix); ok {
			t, mult = strings.TrimSpace(num), u.mult
			break
		}
	}
	n, err := strconv.ParseInt(t, 10, 64)
	if err != nil || n <= 0 {
		return 0, fmt.Errorf("not a positive size (examples: 1048576, 512KiB, 1MiB): %q", s)
	}
	if n > (1<<62)/mult {
		return 0, fmt.Errorf("size %q is too large", s)
	}
	return n * mult, nil
}

// formatSize renders n in the largest binary unit that divides it.
func formatSize(n int64) string {
	switch {
	case n > 0 && n%(1<<30) == 0:
		return strconv.FormatInt(n>>30, 10) + "GiB"
	case n > 0 && n%(1<<20) == 0:
		return strconv.FormatInt(n>>20, 10) + "MiB"
	case n > 0 && n%(1<<10) == 0:
		return strconv.FormatInt(n>>10, 10) + "KiB"
	}
	return strconv.FormatInt(n, 10)
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
