package main

import (
	"os"
	"slices"
	"strings"
	"testing"

	"github.com/idemgo/idem/testkit/redistest"
)

// TestCeilingArgsMatchScripts checks that the redis-benchmark commands pass
// as many arguments as the scripts' headers declare (less the optional
// ones, as the store sends them by default), so that the ceiling runs the
// scripts the store runs.
func TestCeilingArgsMatchScripts(t *testing.T) {
	b := &bench{acquireSHA: "sha", completeSHA: "sha"}
	for _, tc := range []struct {
		script string
		args   []string
	}{
		{"acquire.lua", b.acquireArgs("k")},
		{"complete.lua", b.completeArgs()},
	} {
		src, err := os.ReadFile("../../redisstore/lua/" + tc.script)
		if err != nil {
			t.Fatal(err)
		}
		// The arguments a call without an attempt limit passes: every
		// ARGV line of the header but the optional ones.
		want := strings.Count(string(src), "\n-- ARGV[") - strings.Count(string(src), "(optional")
		if got := len(tc.args) - 4; got != want { // EVALSHA sha numkeys key
			t.Errorf("%s: the ceiling passes %d arguments, the script declares %d", tc.script, got, want)
		}
	}
}

// TestPreloadedRecordCompletes checks that the records preload writes are
// records complete.lua accepts from owner "owner" with fence 1.
func TestPreloadedRecordCompletes(t *testing.T) {
	srv := redistest.Start(t)
	src, err := os.ReadFile("../../redisstore/lua/complete.lua")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := srv.Command("SET", "idem:{k}", inProgressRecord); err != nil {
		t.Fatal(err)
	}
	got, err := srv.Command("EVAL", string(src), "1", "idem:{k}", "owner", "1", "result", "60000", "", "")
	if err != nil || got != "1" {
		t.Fatalf("complete.lua on a preloaded record: got %q, %v, want 1", got, err)
	}
}

// TestParseCallers checks -callers: a list holding the targets'
// concurrency is taken in its order, and a bad list is refused.
func TestParseCallers(t *testing.T) {
	got, err := parseCallers("64, 256,1")
	if err != nil || !slices.Equal(got, []int{64, 256, 1}) {
		t.Fatalf("parseCallers(\"64, 256,1\") = %v, %v", got, err)
	}
	for _, bad := range []string{"", "1", "1,256", "0,64", "-1,64", "64,x", "64,64", "1,,64"} {
		if got, err := parseCallers(bad); err == nil {
			t.Errorf("parseCallers(%q) = %v, want an error", bad, got)
		}
	}
}
