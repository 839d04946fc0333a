package goredis

import (
	"context"
	"fmt"
	"testing"

	"github.com/idemgo/idem/redisstore/internal/backend"
	"github.com/redis/go-redis/v9"
)

// TestScriptCmd: the command scriptCmd builds writes the same arguments as
// go-redis's own script calls, in each of its forms, and allocates only
// its argument slice and the command: the strings are not boxed one by one
// (22 allocations per go-redis lifecycle did that before).
func TestScriptCmd(t *testing.T) {
	ctx := context.Background()
	s := &backend.Script{Name: "test", Src: "return 1", SHA: "e0e1f9fabfc9d4800c877a703b823ac0578ff8db", Fn: "idem_test"}
	ro := &backend.Script{Name: "test_ro", Src: "return 2", SHA: "7f923f79fe76194c868d7e1d0820de36700eb649", Fn: "idem_test_ro", RO: true}
	keys := []string{"{idem}:k"}
	args := []string{"owner", "30000", "fp", "86400000", ""}
	anyArgs := make([]any, len(args))
	for i, a := range args {
		anyArgs[i] = a
	}
	// A pipeline that is never run: go-redis's typed calls only queue
	// their commands in it.
	c := redis.NewClient(&redis.Options{Addr: "127.0.0.1:1"})
	defer c.Close()
	p := c.Pipeline()
	for _, c := range []struct {
		name string
		got  *redis.Cmd
		want *redis.Cmd
	}{
		{"evalsha", scriptCmd(ctx, s, keys, args, backend.BySHA), p.EvalSha(ctx, s.SHA, keys, anyArgs...)},
		{"eval", scriptCmd(ctx, s, keys, args, backend.BySource), p.Eval(ctx, s.Src, keys, anyArgs...)},
		{"fcall", scriptCmd(ctx, s, keys, args, backend.ByFunction), p.FCall(ctx, s.Fn, keys, anyArgs...)},
		{"fcall_ro", scriptCmd(ctx, ro, keys, args, backend.ByFunction), p.FCallRO(ctx, ro.Fn, keys, anyArgs...)},
	} {
		if got, want := words(c.got.Args()), words(c.want.Args()); got != want {
			t.Errorf("%s: scriptCmd's arguments are %s, go-redis's %s", c.name, got, want)
		}
		if got, want := c.got.String(), c.want.String(); got != want {
			t.Errorf("%s: scriptCmd prints %q, go-redis %q", c.name, got, want)
		}
	}
	allocs := testing.AllocsPerRun(100, func() { scriptCmd(ctx, s, keys, args, backend.BySHA) })
	if allocs > 2 {
		t.Errorf("scriptCmd: %v allocations, want at most 2 (its arguments and the command)", allocs)
	}
}

// words renders a command's arguments with their types, as hooks see them.
func words(args []any) string {
	out := ""
	for _, a := range args {
		out += fmt.Sprintf("%T(%q) ", a, fmt.Sprint(a))
	}
	return out
}
