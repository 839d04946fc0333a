package main

import (
	"context"
	"os"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/idemgo/idem"
	"github.com/idemgo/idem/memstore"
	"github.com/idemgo/idem/storekit"
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
// records complete.lua accepts from the complete ceiling's owner and fence.
func TestPreloadedRecordCompletes(t *testing.T) {
	srv := redistest.Start(t)
	src, err := os.ReadFile("../../redisstore/lua/complete.lua")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := srv.Command("SET", "idem:{k}", inProgressRecord); err != nil {
		t.Fatal(err)
	}
	args := (&bench{}).completeArgs()[4:] // owner, fence, result, retention, PUBLISH, channel
	got, err := srv.Command("EVAL", string(src), "1", "idem:{k}", args[0], args[1], "result", "60000", "", "")
	if err != nil || got != "1" {
		t.Fatalf("complete.lua on a preloaded record: got %q, %v, want 1", got, err)
	}
}

// TestCeilingArgsAsLongAsStores checks that the ceiling's key, owner and
// fence are as long as those the store sends for Executor.Do, whose cost
// in the scripts grows with them: a digest in braces, an owner of the
// Executor's form with a 4-digit sequence number, a fence of the server's
// clock in µs.
func TestCeilingArgsAsLongAsStores(t *testing.T) {
	s, err := memstore.New()
	if err != nil {
		t.Fatal(err)
	}
	e, err := newExecutor(s)
	if err != nil {
		t.Fatal(err)
	}
	_, a, err := e.Begin(context.Background(), idem.Key{Scope: "s", ID: "k"}, "fp")
	if err != nil {
		t.Fatal(err)
	}
	owner := a.Lease().Owner // the first attempt's: sequence number 1
	prefix, seq, ok := strings.Cut(owner, ".")
	if !ok || seq != "1" {
		t.Fatalf("owner %q: want a prefix, a dot and sequence number 1", owner)
	}
	b := &bench{acquireSHA: "sha", completeSHA: "sha"}
	key := strings.ReplaceAll(ceilingKey, "__rand_int__", "000000000000") // as redis-benchmark fills it in
	wantOwner := len(prefix) + len(".") + len(strconv.FormatInt(100_000, 36))
	fence := strconv.FormatInt(time.Now().UnixMicro(), 10)
	for _, c := range []struct {
		name      string
		got, want int
	}{
		{"key", len(key), len("idem:{}") + storekit.DigestLen},
		{"acquire's owner", len(b.acquireArgs(key)[5]), wantOwner},
		{"complete's owner", len(b.completeArgs()[4]), wantOwner},
		{"complete's fence", len(b.completeArgs()[5]), len(fence)},
	} {
		if c.got != c.want {
			t.Errorf("the ceiling's %s has %d characters, the store's %d", c.name, c.got, c.want)
		}
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
