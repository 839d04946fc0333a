package idemhttp

import (
	"fmt"
	"testing"
	"time"
)

func TestDurationsRetryAfter(t *testing.T) {
	t.Parallel()
	var d durations
	// Nothing observed: a second, not the lease left (which the openai
	// client waited for, 30 s for operations of 2).
	if got := d.retryAfter("POST u:/a", 30*time.Second); got != initialRetryAfter {
		t.Errorf("nothing observed: got %v, want %v", got, initialRetryAfter)
	}
	d.observe("POST u:/a", 2500*time.Millisecond)
	for _, tc := range []struct {
		route     string
		leaseLeft time.Duration
		want      time.Duration
	}{
		{"POST u:/a", 30 * time.Second, 2500 * time.Millisecond},
		{"POST u:/other", 30 * time.Second, 2500 * time.Millisecond}, // the overall average
		{"POST u:/a", 1500 * time.Millisecond, 1500 * time.Millisecond},
		{"POST u:/a", 200 * time.Millisecond, time.Second},
	} {
		if got := d.retryAfter(tc.route, tc.leaseLeft); got != tc.want {
			t.Errorf("retryAfter(%q, %v): got %v, want %v", tc.route, tc.leaseLeft, got, tc.want)
		}
	}
	d.observe("POST u:/fast", 10*time.Millisecond)
	if got := d.retryAfter("POST u:/fast", 30*time.Second); got != time.Second {
		t.Errorf("fast route: got %v, want at least 1s", got)
	}
	// The average follows recent executions.
	for range 30 {
		d.observe("POST u:/a", 5*time.Second)
	}
	if got := d.retryAfter("POST u:/a", time.Minute); got < 4900*time.Millisecond || got > 5*time.Second {
		t.Errorf("after 30 executions of 5s: got %v, want about 5s", got)
	}
	// The routes kept are bounded.
	for i := range 2 * maxEstimatedRoutes {
		d.observe(fmt.Sprintf("POST u:/%d", i), time.Second)
	}
	if n := len(d.routes); n > maxEstimatedRoutes {
		t.Errorf("routes kept: got %d, want at most %d", n, maxEstimatedRoutes)
	}
}
