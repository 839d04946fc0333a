package main

import "testing"

func TestCPURatio(t *testing.T) {
	// 10,000 requests at 50 µs each against 5,000 at 100 µs each: the
	// first row is twice as cheap per request.
	cheap := result{requests: 10000, cpu: cpuUse{wrk: 0.1, server: 0.3, redis: 0.1}}
	dear := result{requests: 5000, cpu: cpuUse{wrk: 0.05, server: 0.35, bench: 0.01, redis: 0.09}}
	for _, tc := range []struct {
		name     string
		num, den result
		want     float64
		ok       bool
	}{
		{"cheaper numerator", cheap, dear, 2, true},
		{"dearer numerator", dear, cheap, 0.5, true},
		{"no requests", result{}, dear, 0, false},
		{"no CPU read", result{requests: 10}, dear, 0, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, ok := cpuRatio(tc.num, tc.den)
			if ok != tc.ok || (ok && (got < tc.want*0.999 || got > tc.want*1.001)) {
				t.Errorf("got %v, %v, want %v, %v", got, ok, tc.want, tc.ok)
			}
		})
	}
}
