package main

import (
	"context"
	"fmt"
	"strings"
	"testing"

	"github.com/idemgo/idem/postgres/pgtest"
	"github.com/idemgo/idem/testkit/redistest"
)

// TestRun runs the example in both modes against a schema of its own: as
// many payment rows as payment ids, whatever the redeliveries.
func TestRun(t *testing.T) {
	for _, mode := range []string{"pgstore", "hybrid"} {
		t.Run(mode, func(t *testing.T) {
			url := pgtest.Schema(t)
			redisAddr := ""
			if mode == "hybrid" {
				redisAddr = redistest.Start(t).Addr()
			}
			var out strings.Builder
			if err := run(context.Background(), &out, url, redisAddr, 120); err != nil {
				t.Fatalf("run: %v", err)
			}
			t.Log(out.String())
			var rows, ids int
			for line := range strings.Lines(out.String()) {
				fmt.Sscanf(line, "payments in the database: %d rows for %d payment ids", &rows, &ids)
			}
			if rows != 80 || ids != 80 {
				t.Fatalf("got %d payment rows for %d ids, want 80 and 80 (120 messages, every third a redelivery)", rows, ids)
			}
		})
	}
}
