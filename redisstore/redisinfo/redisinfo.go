// Package redisinfo reads the replies of INFO and CLUSTER INFO and the
// server version they report, for redisstore's start check and idem
// doctor, and the server's CPU time, for the benchmarks.
//
// It is public so that every module of the repository can use it (idem
// doctor in cmd/idem, the benchmarks); its API is not covered by the
// modules' compatibility promise and may change in any release.
package redisinfo

import (
	"errors"
	"strconv"
	"strings"
)

// CPU returns the CPU time, user and system, in seconds, of the server's
// main thread, the one that runs commands and scripts, from an INFO cpu
// reply (the whole process's where the server does not report its main
// thread, before Redis 7).
func CPU(info string) (float64, error) {
	f := Parse(info)
	num := func(k string) (float64, bool) {
		n, err := strconv.ParseFloat(f[k], 64)
		return n, err == nil
	}
	if u, ok := num("used_cpu_user_main_thread"); ok {
		s, _ := num("used_cpu_sys_main_thread")
		return u + s, nil
	}
	u, ok := num("used_cpu_user")
	if !ok {
		return 0, errors.New("no used_cpu_user in INFO cpu")
	}
	s, _ := num("used_cpu_sys")
	return u + s, nil
}

// Parse returns the fields of an INFO or CLUSTER INFO reply ("key:value"
// lines; section headers and blank lines are skipped).
func Parse(s string) map[string]string {
	out := make(map[string]string)
	for line := range strings.Lines(s) {
		line = strings.TrimSpace(line)
		if line == "" || line[0] == '#' {
			continue
		}
		if k, v, ok := strings.Cut(line, ":"); ok {
			out[k] = v
		}
	}
	return out
}

// Version is a server version: major, minor and patch numbers.
type Version struct{ Major, Minor, Patch int }

// ParseVersion parses a version such as "7.0.15" (a missing patch reads as
// 0). ok is false if v is not of that form.
func ParseVersion(v string) (ver Version, ok bool) {
	parts := strings.Split(strings.TrimSpace(v), ".")
	if len(parts) < 2 || len(parts) > 3 {
		return Version{}, false
	}
	var n [3]int
	for i, p := range parts {
		x, err := strconv.Atoi(p)
		if err != nil || x < 0 {
			return Version{}, false
		}
		n[i] = x
	}
	return Version{n[0], n[1], n[2]}, true
}

// AtLeast reports whether v is major.minor or later.
func (v Version) AtLeast(major, minor int) bool {
	return v.Major > major || v.Major == major && v.Minor >= minor
}

// String returns "major.minor.patch".
func (v Version) String() string {
	return strconv.Itoa(v.Major) + "." + strconv.Itoa(v.Minor) + "." + strconv.Itoa(v.Patch)
}

// Server returns the server's name and version as INFO server reports
// them: "valkey" and valkey_version on Valkey, else "redis" and
// redis_version. (Valkey reports a redis_version too, the Redis version it
// is compatible with: 7.2.4 on Valkey 7.2 and 8.)
func Server(fields map[string]string) (name, version string) {
	if v := fields["valkey_version"]; v != "" {
		return "valkey", v
	}
	return "redis", fields["redis_version"]
}

// Compatible returns the Redis version whose commands the server has:
// redis_version, which Valkey sets to the Redis release it is compatible
// with. ok is false if INFO did not report it.
func Compatible(fields map[string]string) (Version, bool) {
	return ParseVersion(fields["redis_version"])
}

// EarlyWAITAOF reports whether a server of this name and version (as
// Server returns them) is a release whose WAITAOF counts writes as fsynced
// before they are, under appendfsync everysec: an event loop iteration
// with nothing left to write marks everything written as fsynced
// (flushAppendOnlyFile). The code came with Redis 7.4.0 and Valkey 8.0.0,
// no 7.2 release has it, and redis/redis#13793 fixed it upstream; these
// are the releases whose source was read and whose WAITAOF was traced
// (Redis 7.4.1, Valkey 8.0.1: replies of 1 local fsync between two
// fdatasync calls a second apart).
func EarlyWAITAOF(name, version string) bool {
	switch name + " " + version {
	case "redis 7.4.0", "redis 7.4.1", "valkey 8.0.0", "valkey 8.0.1":
		return true
	}
	return false
}
