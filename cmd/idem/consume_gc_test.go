package main

import (
	"runtime/debug"
	"testing"
)

// TestConsumeGC: idem consume sets the collector's target to consumeGOGC
// when the environment has no GOGC, and leaves the runtime's (the
// environment's) otherwise.
func TestConsumeGC(t *testing.T) {
	old := debug.SetGCPercent(100)
	t.Cleanup(func() { debug.SetGCPercent(old) })
	for _, tc := range []struct {
		env  string
		want int
	}{{"", consumeGOGC}, {"50", 100}, {"off", 100}} {
		debug.SetGCPercent(100)
		consumeGC(func(name string) string {
			if name == "GOGC" {
				return tc.env
			}
			return ""
		})
		if got := debug.SetGCPercent(100); got != tc.want {
			t.Errorf("GOGC=%q: got %d, want %d", tc.env, got, tc.want)
		}
	}
}
