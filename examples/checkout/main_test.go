package main

import (
	"context"
	"fmt"
	"strings"
	"testing"

	"github.com/idemgo/idem/postgres/pgtest"
	"github.com/idemgo/idem/testkit/redistest"
)

// TestRun checks out 30 orders in both modes, a third of them with the
// processor's reply to the charge lost, each retried after it was paid:
// every order charged once at the processor, one order row, one charge and
// one "order paid" message per order.
func TestRun(t *testing.T) {
	for _, mode := range []string{"pgstore", "hybrid"} {
		t.Run(mode, func(t *testing.T) {
			url := pgtest.Schema(t)
			redisAddr := ""
			if mode == "hybrid" {
				redisAddr = redistest.Start(t).Addr()
			}
			var out strings.Builder
			if err := run(context.Background(), &out, url, redisAddr, 30); err != nil {
				t.Fatalf("run: %v", err)
			}
			t.Log(out.String())
			var once, more, lost, paid, ids, charges, msgs int
			for line := range strings.Lines(out.String()) {
				fmt.Sscanf(line, "processor: %d orders charged once, %d more than once, %d replies lost", &once, &more, &lost)
				fmt.Sscanf(line, "database: %d orders paid (%d ids), %d charges, %d", &paid, &ids, &charges, &msgs)
			}
			if once != 30 || more != 0 || lost != 10 {
				t.Errorf("processor: %d charged once, %d more than once, %d replies lost; want 30, 0, 10", once, more, lost)
			}
			if paid != 30 || ids != 30 || charges != 30 || msgs != 30 {
				t.Errorf("database: %d paid, %d ids, %d charges, %d messages; want 30 each", paid, ids, charges, msgs)
			}
		})
	}
}
