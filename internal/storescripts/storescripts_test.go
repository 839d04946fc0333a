package storescripts_test

import (
	"testing"

	"github.com/idemgo/idem/internal/storescripts"
	"github.com/idemgo/idem/testkit/redistest"
)

// TestCapture: the digests are of scripts loaded on the server, they are
// the acquire and the complete (an acquire of a new key answers its
// fence alone; a complete with another owner answers 0), and the probe's
// record is gone.
func TestCapture(t *testing.T) {
	srv := redistest.Start(t)
	c := srv.GoRedis(t)
	ctx := t.Context()
	acq, cpl, err := storescripts.Capture(ctx, srv.Addr())
	if err != nil {
		t.Fatal(err)
	}
	if acq == cpl {
		t.Fatalf("one digest for both scripts: %s", acq)
	}
	exists, err := c.ScriptExists(ctx, acq, cpl).Result()
	if err != nil || !exists[0] || !exists[1] {
		t.Fatalf("SCRIPT EXISTS: %v, %v; want both loaded", exists, err)
	}
	if n, err := c.DBSize(ctx).Result(); err != nil || n != 0 {
		t.Fatalf("DBSIZE after Capture: %d, %v; want 0", n, err)
	}
	fence, err := c.EvalSha(ctx, acq, []string{"k"}, "fp", "owner", 30000, 60000, 0, 62000).Int64()
	if err != nil || fence <= 0 {
		t.Fatalf("acquire of a new key: %v, %v; want its fence", fence, err)
	}
	if n, err := c.EvalSha(ctx, cpl, []string{"k"}, "other", fence, "r", 60000, "", "").Int(); err != nil || n != 0 {
		t.Fatalf("complete by another owner: %d, %v; want 0", n, err)
	}
	if n, err := c.EvalSha(ctx, cpl, []string{"k"}, "owner", fence, "r", 60000, "", "").Int(); err != nil || n != 1 {
		t.Fatalf("complete by the owner: %d, %v; want 1", n, err)
	}
}
