package main

import (
	"os"
	"strings"
	"testing"
)

// TestCeilingArgsMatchScripts checks that the redis-benchmark commands pass
// as many arguments as the scripts' headers declare, so that the ceiling
// runs the scripts the store runs.
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
		want := strings.Count(string(src), "\n-- ARGV[")
		if got := len(tc.args) - 4; got != want { // EVALSHA sha numkeys key
			t.Errorf("%s: the ceiling passes %d arguments, the script declares %d", tc.script, got, want)
		}
	}
}
